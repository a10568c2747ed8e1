package config

import (
	"path"
	"testing"
)

// matchGlob answers like path.Match for every glob and name, its fast
// paths included (a malformed glob matches nothing, as path.Match's error
// is ignored by MatchAny).
func FuzzMatchGlob(f *testing.F) {
	for _, s := range [][2]string{
		{"DATABASE_URL", "DATABASE_URL"}, {"DATABASE_*", "DATABASE_URL"}, {"*_SECRET", "AUTH_SECRET"},
		{"*", ""}, {"a*", "a/b"}, {"*b", "a/b"}, {"paperclip-*", "paperclip-acme"}, {"[", "["}, {"a\\*", "a*"},
		{"*_KEY", "_KEY"}, {"A*", "A"}, {"?", "x"}, {"*x*", "axb"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, g, name string) {
		want, _ := path.Match(g, name)
		if got := matchGlob(g, name); got != want {
			t.Fatalf("matchGlob(%q, %q) = %v, path.Match says %v", g, name, got, want)
		}
	})
}
