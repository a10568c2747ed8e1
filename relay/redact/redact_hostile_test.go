package redact

import (
	"bytes"
	"math/rand/v2"
	"regexp"
	"testing"
)

// oldPatterns are the default patterns as 592107c applied them: every
// pattern on every line, no guard.
var oldPatterns = []string{
	`sk-ant-[A-Za-z0-9_-]{16,}`,
	`sk-(proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}`,
	`gh[pousr]_[A-Za-z0-9]{30,}`,
	`github_pat_[A-Za-z0-9_]{40,}`,
	`(AKIA|ASIA)[A-Z0-9]{16}`,
	`AIza[A-Za-z0-9_-]{35}`,
	`xox[abpr]-[A-Za-z0-9-]{10,}`,
	`(?i)bearer [A-Za-z0-9._~+/-]{16,}=*`,
	`eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}`,
	`glpat-[A-Za-z0-9_-]{20,}`,
	`(sk|rk)_(live|test)_[A-Za-z0-9]{16,}`,
	`npm_[A-Za-z0-9]{36}`,
	`[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@"\\]+:[^\s/@"\\]+@`,
}

var oldCompiled = func() (out []*regexp.Regexp) {
	for _, p := range oldPatterns {
		out = append(out, regexp.MustCompile(p))
	}
	return out
}()

func oldRedact(lits [][]byte, line []byte) []byte {
	out := line
	for _, l := range lits {
		if bytes.Contains(out, l) {
			out = bytes.ReplaceAll(out, l, []byte(Redacted))
		}
	}
	for _, re := range oldCompiled {
		if re.Match(out) {
			out = re.ReplaceAll(out, []byte(Redacted))
		}
	}
	return out
}

// A hostile agent builds lines from token prefixes, case variants, the
// Unicode letters Go's (?i) folds onto ASCII (K U+212A, ſ U+017F, Å U+212B),
// JSON escapes and the [REDACTED] marker itself, so that one pattern's
// replacement creates or destroys another's guard. The guarded redactor
// must redact exactly what the unguarded one did.
func TestHostileGuardedRedactionEqualsUnguarded(t *testing.T) {
	frags := []string{
		"sk-", "sk-ant-", "sk_live_", "rk_test_", "k_", "gh", "ghp_", "github_pat_", "AKIA", "ASIA", "A", "AIza",
		"xox", "xoxb-", "bearer ", "Bearer ", "BEARER ", "BeArEr ", "bearer", " ", "\u212a", "\u017f", "\u212b",
		"eyJ", ".", "glpat-", "npm_", "://", "postgres://", "u:p@", ":", "@", "/", "\\", "\"", "\\u0041", "\\/",
		"[REDACTED]", "REDACTED", "aaaaaaaaaaaaaaaa", "ABCDEFGHIJKLMNOP0123", "0123456789", "-_", "=", "=\"",
		"\t", "é", "\u00a0", "s3cr3t-value", "\"s3cr3t-value\"",
	}
	lits := []string{"s3cr3t-value", "A\"quoted\\val"}
	r, err := New(nil, lits)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		var b []byte
		for n := rng.IntN(12) + 1; n > 0; n-- {
			f := frags[rng.IntN(len(frags))]
			if rng.IntN(4) == 0 { // repeat to reach the length quantifiers
				for k := rng.IntN(40); k > 0; k-- {
					b = append(b, f...)
				}
			}
			b = append(b, f...)
		}
		got := []byte(r.Redact(string(b)))
		var lits [][]byte
		for _, l := range *r.literals.Load() {
			lits = append(lits, []byte(l))
		}
		want := oldRedact(lits, append([]byte{}, b...))
		if !bytes.Equal(got, want) {
			t.Fatalf("line %q: guarded %q, unguarded (592107c) %q", b, got, want)
		}
	}
}
