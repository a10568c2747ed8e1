package charts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The chart's README.md is generated from the comments in its values.yaml,
// in the helm-docs convention:
//
//	# -- The description, continued on the
//	# comment lines that follow.
//	# @default -- text shown instead of the value (a computed default)
//	key: value
//
// Comment lines above the last "# --" line are ordinary comments and stay
// out of the README. A map with a "# --" description is documented whole,
// as one row; a map without one stands for its keys, each documented on
// its own row. A list, an empty map and a scalar are always one row.

// ValueDoc is one row of the values table: a value a user sets.
type ValueDoc struct {
	// Key is the value's dotted path, e.g. "webhook.replicas".
	Key string
	// Type is helm-docs' name of its YAML type: string, int, float, bool,
	// list or object.
	Type string
	// Default is the value as JSON, or the text of "# @default --".
	Default string
	// DefaultText is whether Default is that text rather than JSON.
	DefaultText bool
	// Described is whether the value has a "# --" comment; Description is
	// its text, its lines joined by spaces.
	Described   bool
	Description string
	// Line is the key's line in values.yaml.
	Line int
}

// ValueDocs returns the rows of a values.yaml, in file order.
func ValueDocs(values []byte) ([]ValueDoc, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("values: not a YAML map")
	}
	var rows []ValueDoc
	if err := valueDocs("", doc.Content[0], &rows); err != nil {
		return nil, err
	}
	return rows, nil
}

func valueDocs(prefix string, m *yaml.Node, rows *[]ValueDoc) error {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := prefix + k.Value
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		described, desc, def, err := parseComment(k.HeadComment)
		if err != nil {
			return fmt.Errorf("values line %d, %s: %w", k.Line, key, err)
		}
		if v.Kind == yaml.MappingNode && len(v.Content) > 0 && !described {
			if err := valueDocs(key+".", v, rows); err != nil {
				return err
			}
			continue
		}
		row := ValueDoc{Key: key, Type: typeName(v), Described: described, Description: desc, Line: k.Line}
		if def != "" {
			row.Default, row.DefaultText = def, true
		} else if row.Default, err = nodeJSON(v); err != nil {
			return fmt.Errorf("values line %d, %s: %w", k.Line, key, err)
		}
		*rows = append(*rows, row)
	}
	return nil
}

// parseComment reads a key's head comment: whether it has a "# --"
// description, the description, and the "# @default --" text.
func parseComment(comment string) (described bool, desc, def string, err error) {
	lines := strings.Split(comment, "\n")
	start := -1
	for i, l := range lines {
		if l == "# --" || strings.HasPrefix(l, "# -- ") {
			start = i
		}
	}
	before := lines // ordinary comments
	if start >= 0 {
		before = lines[:start]
	}
	for _, l := range before {
		if strings.HasPrefix(l, "# @default --") {
			return false, "", "", fmt.Errorf("@default without a \"# --\" description above it")
		}
	}
	if start < 0 {
		return false, "", "", nil
	}
	var words []string
	if first := strings.TrimSpace(strings.TrimPrefix(lines[start], "# --")); first != "" {
		words = append(words, first)
	}
	for _, l := range lines[start+1:] {
		text := strings.TrimSpace(strings.TrimPrefix(l, "#"))
		switch {
		case strings.HasPrefix(text, "@default --"):
			def = strings.TrimSpace(strings.TrimPrefix(text, "@default --"))
			if def == "" {
				return false, "", "", fmt.Errorf("empty @default")
			}
		case strings.HasPrefix(text, "@"):
			// helm-docs' other annotations (@raw, @section, @ignored, …)
			// would be printed as text here: refuse them.
			return false, "", "", fmt.Errorf("unsupported annotation %q (only \"# @default -- text\")", l)
		case text != "":
			words = append(words, text)
		}
	}
	desc = strings.Join(words, " ")
	return desc != "", desc, def, nil
}

func typeName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "list"
	}
	switch tag := n.ShortTag(); tag {
	case "!!str", "!!null":
		return "string"
	case "!!int":
		return "int"
	case "!!float":
		return "float"
	case "!!bool":
		return "bool"
	default:
		return strings.TrimPrefix(tag, "!!")
	}
}

// nodeJSON is n as compact JSON, a map's keys in file order.
func nodeJSON(n *yaml.Node) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, n); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, n *yaml.Node) error {
	switch n.Kind {
	case yaml.AliasNode:
		return writeJSON(b, n.Alias)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonString(n.Content[i].Value))
			b.WriteByte(':')
			if err := writeJSON(b, n.Content[i+1]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, c); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return err
		}
		if s, ok := v.(string); ok {
			b.WriteString(jsonString(s))
			break
		}
		out, err := json.Marshal(v)
		if err != nil {
			// e.g. .inf, which JSON cannot write: show it as written.
			out = []byte(n.Value)
		}
		b.Write(out)
	default:
		return fmt.Errorf("unexpected YAML node kind %v", n.Kind)
	}
	return nil
}

// jsonString quotes s as JSON does, leaving <, > and & as they are.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return strconv.Quote(s)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// ValuesTable is rows as a markdown table.
func ValuesTable(rows []ValueDoc) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n")
	b.WriteString("|-----|------|---------|-------------|\n")
	for _, r := range rows {
		def := r.Default
		if !r.DefaultText {
			def = codeSpan(def)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(r.Key), r.Type, cell(def), cell(r.Description))
	}
	return b.String()
}

// codeSpan is s in backticks, enough of them that none inside ends it.
func codeSpan(s string) string {
	if !strings.Contains(s, "`") {
		return "`" + s + "`"
	}
	return "`` " + s + " ``"
}

// cell escapes the pipes that would end a table cell (inside code spans
// too, as GitHub's tables require).
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// ChartREADMECommand regenerates the chart's README.md.
const ChartREADMECommand = "make chart-docs"

// ChartREADME is the chart's README.md for the content of its values.yaml.
func ChartREADME(values []byte) ([]byte, error) {
	rows, err := ValueDocs(values)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(readmeIntro)
	b.WriteString(ValuesTable(rows))
	return b.Bytes(), nil
}

const readmeIntro = `<!-- Generated from values.yaml (its "# --" comments) by charts/valuesdoc.go: do not edit.
Regenerate with ` + "`" + ChartREADMECommand + "`" + ` (go test ./charts -run TestChartREADME -update). -->

# clipjob

The Helm chart of [clipjob](../../README.md): admission webhooks, a claim
controller and a log relay that turn a bare Job labeled
` + "`paperclip.io/agent-id`" + ` into a contained Paperclip agent run.

## What it installs

- The webhook: two replicas with a PodDisruptionBudget, spread across nodes
  and zones, a restricted security context; the elected replica runs the
  claim controller.
- Its webhook configurations: only objects with ` + "`paperclip.io/`" + ` labels reach
  it (matchConditions), ` + "`failurePolicy: Fail`" + `, the release namespace and
  ` + "`kube-system`" + ` excluded.
- The config ConfigMap the webhook re-reads when it changes.
- The log relay, with its store on a PersistentVolumeClaim.
- Serving certificates: issued and renewed by the webhook itself, by
  cert-manager, or provided by you (` + "`certificates.mode`" + `).
- Least-privilege RBAC for each, and a ValidatingAdmissionPolicy that lets
  only clipjob write claim Leases.

Optional: egress policies for agent pods (` + "`networkPolicy.mode`" + `), the agent
namespace with Pod Security ` + "`restricted`" + ` (` + "`agentNamespace.create`" + `),
ServiceMonitors (` + "`serviceMonitor.enabled`" + `), and the relay's NDJSON mirror
on Paperclip's volume (` + "`relay.mirror.enabled`" + `).

## Install

From a checkout, with the image ` + "`ghcr.io/paperclipai/clipjob:<appVersion>`" + ` in a
registry your cluster pulls from (` + "`make image`" + ` builds it), in a namespace of
its own (the webhooks never see the release namespace, so agents may not
run there):

` + "```sh" + `
helm install clipjob ./charts/clipjob -n clipjob-system --create-namespace \
  --set config.source.namespace=paperclip --set config.source.deployment=paperclip
` + "```" + `

The installation guide is [docs/install.md](../../docs/install.md); the
[project README](../../README.md) introduces clipjob and its documentation.

## Values

` + "`values.schema.json`" + ` refuses a key that is not listed here, so a typo is an
error rather than a silent default.

`
