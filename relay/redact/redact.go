// Package redact removes secrets from log lines before they are stored:
// known token shapes, patterns the operator adds, and literal values,
// which a ValuesFile keeps those of a mounted Secret.
package redact

import (
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
)

// Redacted replaces every secret found in a line.
const Redacted = "[REDACTED]"

// defaultPatterns are token shapes of the providers agents talk to. Their
// character classes exclude '"' and '\', so a match never spans a JSON
// string boundary or escape, and replacing it leaves a JSON line valid.
//
// Each names a guard: a literal every match contains (ASCII case folded
// when fold). A line without it skips the regexp, which for patterns
// without a literal prefix would try every offset of the line.
var defaultPatterns = []struct {
	expr  string
	guard string
	fold  bool
}{
	{`sk-ant-[A-Za-z0-9_-]{16,}`, "sk-ant-", false},                                 // Anthropic
	{`sk-(proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}`, "sk-", false},                 // OpenAI
	{`gh[pousr]_[A-Za-z0-9]{30,}`, "gh", false},                                     // GitHub tokens
	{`github_pat_[A-Za-z0-9_]{40,}`, "github_pat_", false},                          // GitHub fine-grained
	{`(AKIA|ASIA)[A-Z0-9]{16}`, "A", false},                                         // AWS access key ids
	{`AIza[A-Za-z0-9_-]{35}`, "AIza", false},                                        // Google API keys
	{`xox[abpr]-[A-Za-z0-9-]{10,}`, "xox", false},                                   // Slack
	{`(?i)bearer [A-Za-z0-9._~+/-]{16,}=*`, "bearer ", true},                        // bearer tokens
	{`eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}`, "eyJ", false}, // JWTs
	{`glpat-[A-Za-z0-9_-]{20,}`, "glpat-", false},                                   // GitLab
	{`(sk|rk)_(live|test)_[A-Za-z0-9]{16,}`, "k_", false},                           // Stripe
	{`npm_[A-Za-z0-9]{36}`, "npm_", false},                                          // npm
	{`[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@"\\]+:[^\s/@"\\]+@`, "://", false},           // user:password@ in URLs (postgres://…)
}

// pattern is a compiled redaction pattern and its guard ("" for none).
type pattern struct {
	re    *regexp.Regexp
	guard string
	fold  bool
}

// mayMatch reports whether line holds the pattern's guard.
func (p pattern) mayMatch(line string) bool {
	switch {
	case p.guard == "":
		return true
	case p.fold:
		return containsFold(line, p.guard)
	}
	return strings.Contains(line, p.guard)
}

// containsFold is strings.Contains ignoring case, without the
// allocation of lowering the line; guard is lower case, and starts with
// an ASCII letter, whose two cases it looks for first (IndexByte: lines
// are long).
func containsFold(line, guard string) bool {
	for len(line) >= len(guard) {
		i := strings.IndexByte(line, guard[0])
		if j := strings.IndexByte(line, guard[0]-'a'+'A'); i < 0 || 0 <= j && j < i {
			i = j
		}
		if i < 0 || len(line)-i < len(guard) {
			return false
		}
		if strings.EqualFold(line[i:i+len(guard)], guard) {
			return true
		}
		line = line[i+1:]
	}
	return false
}

// Redactor removes secrets from log lines before they are stored. Its
// literal values can be replaced while it is in use (SetValues).
type Redactor struct {
	patterns []pattern
	// literals holds each secret value in raw and JSON-escaped form,
	// longest first, so a value containing another is replaced whole.
	literals atomic.Pointer[[]string]
}

// New compiles the default patterns, extra patterns and literal
// secret values (values shorter than 6 bytes are ignored: redacting "true"
// or "1" would shred every line).
func New(extraPatterns, literals []string) (*Redactor, error) {
	r := &Redactor{}
	for _, p := range defaultPatterns {
		r.patterns = append(r.patterns, pattern{re: regexp.MustCompile(p.expr), guard: p.guard, fold: p.fold})
	}
	for _, p := range extraPatterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, err
		}
		r.patterns = append(r.patterns, pattern{re: re})
	}
	r.SetValues(literals)
	return r, nil
}

// SetValues replaces the literal secret values; lines redacted from then
// on use them.
func (r *Redactor) SetValues(values []string) {
	var forms []string
	seen := map[string]bool{}
	for _, l := range values {
		if len(l) < 6 {
			continue
		}
		esc, _ := json.Marshal(l)
		for _, form := range []string{l, string(esc[1 : len(esc)-1])} {
			if !seen[form] {
				seen[form] = true
				forms = append(forms, form)
			}
		}
	}
	sort.Slice(forms, func(i, j int) bool { return len(forms[i]) > len(forms[j]) })
	r.literals.Store(&forms)
}

// Redact returns line with every secret replaced. A line that is JSON stays
// JSON: literal values are matched in their escaped form inside strings.
func (r *Redactor) Redact(line string) string {
	if r == nil {
		return line
	}
	out := line
	for _, l := range *r.literals.Load() {
		if strings.Contains(out, l) {
			out = strings.ReplaceAll(out, l, Redacted)
		}
	}
	for _, p := range r.patterns {
		// Most lines hold no secret: MatchString does not allocate,
		// ReplaceAllString always copies.
		if p.mayMatch(out) && p.re.MatchString(out) {
			out = p.re.ReplaceAllString(out, Redacted)
		}
	}
	return out
}
