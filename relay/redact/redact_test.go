package redact

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	r, err := New([]string{`internal-[0-9]{6}`}, []string{`p@ss"word\with-quote`, "short", "hunter2-secret"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ in, want string }{
		{`key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv here`, `key [REDACTED] here`},
		{`{"type":"tool_result","content":"OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012345"}`,
			`{"type":"tool_result","content":"OPENAI_API_KEY=[REDACTED]"}`},
		{`{"m":"token ghp_abcdefghijklmnopqrstuvwxyz0123456789"}`, `{"m":"token [REDACTED]"}`},
		{`Authorization: Bearer abcdefghijklmnop.qrstuv`, `Authorization: [REDACTED]`},
		{`{"aws":"AKIAABCDEFGHIJKLMNOP"}`, `{"aws":"[REDACTED]"}`},
		{`id internal-123456`, `id [REDACTED]`},
		{`the password is hunter2-secret.`, `the password is [REDACTED].`},
		{`{"v":"p@ss\"word\\with-quote"}`, `{"v":"[REDACTED]"}`}, // literal in JSON-escaped form
		{`{"url":"postgres://paperclip:s3cr3t@db:5432/paperclip"}`, `{"url":"[REDACTED]db:5432/paperclip"}`},
		{`DATABASE_URL=postgresql://u:p%40ss@10.0.0.5/db`, `DATABASE_URL=[REDACTED]10.0.0.5/db`},
		{`git clone https://oauth2:glpat-abcdefghij0123456789@gitlab.com/x`, `git clone [REDACTED]gitlab.com/x`},
		{`token glpat-abcdefghij0123456789xy`, `token [REDACTED]`},
		{`{"stripe":"sk_live_abcdefghijklmnop1234"}`, `{"stripe":"[REDACTED]"}`},
		{`NPM_TOKEN=npm_abcdefghijklmnopqrstuvwxyz0123456789`, `NPM_TOKEN=[REDACTED]`},
		{`see https://example.com/a@b and mailto:x@y`, `see https://example.com/a@b and mailto:x@y`},
		{`short words stay short`, `short words stay short`},
		{`{"usage":{"input_tokens":12}}`, `{"usage":{"input_tokens":12}}`},
	}
	for _, tt := range tests {
		got := r.Redact(tt.in)
		if got != tt.want {
			t.Errorf("Redact(%s)\n got %s\nwant %s", tt.in, got, tt.want)
		}
		if strings.HasPrefix(tt.in, "{") && !json.Valid([]byte(got)) {
			t.Errorf("redacting %s broke the JSON: %s", tt.in, got)
		}
	}
	if _, err := New([]string{"("}, nil); err == nil {
		t.Error("a bad pattern was accepted")
	}
}

func FuzzRedactKeepsJSONValid(f *testing.F) {
	r, _ := New(nil, []string{`se"cr\et-value`, "another-secret"})
	f.Add(`{"a":"sk-ant-AAAAAAAAAAAAAAAAAAAAAA","b":"se\"cr\\et-value"}`)
	f.Add(`{"x":["another-secret",1,{"y":"Bearer aaaaaaaaaaaaaaaaaaaaa"}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) {
			return
		}
		if out := r.Redact(s); !json.Valid([]byte(out)) {
			t.Fatalf("%s became invalid: %s", s, out)
		}
	})
}

// The guards only skip work: with and without them, every line is
// redacted the same. Seeds hold a token of every default pattern, in
// upper and mixed case where the pattern folds case.
func FuzzRedactGuardsMissNothing(f *testing.F) {
	r, _ := New(nil, nil)
	unguarded := func(line []byte) []byte {
		for _, p := range r.patterns {
			if p.re.Match(line) {
				line = p.re.ReplaceAll(line, []byte(Redacted))
			}
		}
		return line
	}
	for _, s := range []string{
		"key sk-ant-api03-AAAAAAAAAAAAAAAAAAAA", "sk-proj-AAAAAAAAAAAAAAAAAAAAAAAA", "ghp_" + strings.Repeat("a", 36),
		"github_pat_" + strings.Repeat("A", 40), "AKIAABCDEFGHIJKLMNOP", "AIza" + strings.Repeat("b", 35),
		"xoxb-1234567890-abc", "Authorization: BEARER abcdefghijklmnopqrstu", "bEaReR abcdefghijklmnopqrstu==",
		"eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4", "glpat-" + strings.Repeat("x", 20),
		"rk_live_" + strings.Repeat("9", 16), "npm_" + strings.Repeat("Z", 36), "postgres://user:pass@db:5432/x",
		strings.Repeat("a1B2c3D4e5", 30),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := r.Redact(s), unguarded([]byte(s)); got != string(want) {
			t.Fatalf("%q: guarded %q, unguarded %q", s, got, want)
		}
	})
}
