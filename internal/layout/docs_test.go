package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsNameRealTests: every test, fuzz target or golden case that the
// README, the manual (docs/) or the adapter's README names as the proof of
// a promise exists, so a renamed or deleted test cannot leave a promise
// unbacked.
func TestDocsNameRealTests(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range decl.FindAllSubmatch(b, -1) {
				tests[string(m[1])] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)`")
	golden := regexp.MustCompile("the `([a-z0-9_-]+)` golden")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	design, err := filepath.Glob(filepath.Join(root, "docs", "design", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(append(docs, design...), filepath.Join(root, "README.md"), filepath.Join(root, "adapters", "paperclip", "README.md"))
	if len(docs) < 10 {
		t.Fatalf("found only %d documents to check: %v", len(docs), docs)
	}
	for _, path := range docs {
		doc, err := filepath.Rel(root, path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if !tests[m[1]] {
				t.Errorf("%s names %s, which no test file defines", doc, m[1])
			}
		}
		for _, m := range golden.FindAllStringSubmatch(string(b), -1) {
			if _, err := os.Stat(filepath.Join(root, "templates", "testdata", "cases", m[1]+".golden")); err != nil {
				t.Errorf("%s names the %s golden, which does not exist", doc, m[1])
			}
		}
	}
}
