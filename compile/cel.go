package compile

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// celString is s as a CEL string literal. Go's quoting is a subset of
// CEL's escapes (\a \b \f \n \r \t \v \\ \" \xHH \uHHHH \UHHHHHHHH).
func celString(s string) string { return strconv.Quote(s) }

// celList joins CEL list expressions with +, or [] for none.
func celList(parts []string) string {
	if len(parts) == 0 {
		return "[]"
	}
	return strings.Join(parts, " + ")
}

// literal is the decoded JSON value v as a CEL expression: objects as maps
// and lists with every value wrapped in dyn() (Kubernetes' CEL wants map
// and list literals of one type), strings that are a sentinel replaced by
// the expression of the request's value.
func literal(v any, subst map[string]string) (string, error) {
	var b strings.Builder
	if err := writeLiteral(&b, v, subst); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeLiteral(b *strings.Builder, v any, subst map[string]string) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return fmt.Errorf("number %s: only integers occur in a Job", v)
		}
		b.WriteString(strconv.FormatInt(n, 10))
	case string:
		if e, ok := subst[v]; ok {
			b.WriteString(e)
			return nil
		}
		b.WriteString(spliced(v, subst))
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("dyn(")
			if err := writeLiteral(b, e, subst); err != nil {
				return err
			}
			b.WriteByte(')')
		}
		b.WriteByte(']')
	case map[string]any:
		b.WriteByte('{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(celString(k))
			b.WriteString(": dyn(")
			if err := writeLiteral(b, v[k], subst); err != nil {
				return err
			}
			b.WriteByte(')')
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

// spliced is s as CEL: a literal, or, where sentinels occur inside it (a
// directory named by the run's agent and company), the concatenation of
// the literal parts and the request's values. Only the "clipjob-sentinel-"
// values are looked for inside strings: a short one (the turn limit's
// number) could occur in any string by chance.
func spliced(s string, subst map[string]string) string {
	var parts []string
	lit := 0
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], sentinelPrefix)
		if j < 0 {
			break
		}
		at := i + j
		// The longest sentinel that starts here (one may prefix another).
		var key string
		for k := range subst {
			if strings.HasPrefix(k, sentinelPrefix) && strings.HasPrefix(s[at:], k) && len(k) > len(key) {
				key = k
			}
		}
		if key == "" {
			i = at + len(sentinelPrefix)
			continue
		}
		if at > lit {
			parts = append(parts, celString(s[lit:at]))
		}
		parts = append(parts, subst[key])
		i = at + len(key)
		lit = i
	}
	if parts == nil {
		return celString(s)
	}
	if lit < len(s) {
		parts = append(parts, celString(s[lit:]))
	}
	return "(" + strings.Join(parts, " + ") + ")"
}

// pointer is a JSON pointer (RFC 6901) to the object's field path.
func pointer(path ...string) string {
	var b strings.Builder
	for _, p := range path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// op is one JSONPatch operation as CEL.
func op(kind, path, value string) string {
	if value == "" {
		return fmt.Sprintf("JSONPatch{op: %q, path: %s}", kind, celString(path))
	}
	return fmt.Sprintf("JSONPatch{op: %q, path: %s, value: %s}", kind, celString(path), value)
}

// when guards a list of operations with a condition.
func when(cond string, ops ...string) string {
	return fmt.Sprintf("(%s ? [%s] : [])", cond, strings.Join(ops, ", "))
}
