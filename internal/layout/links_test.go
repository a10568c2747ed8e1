package layout

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#+ (.+)$`)
	// slugDrop is what GitHub drops from a heading to make its anchor.
	slugDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// anchor is GitHub's anchor of a heading.
func anchor(h string) string {
	return strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

// TestDocsLinksResolve: every relative link of the README, the manual and
// the chart's and adapter's READMEs reaches a file of the repository, and
// a link to a heading of a Markdown file reaches a heading there: moving a
// section must not leave a reader at a dead link.
func TestDocsLinksResolve(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	design, _ := filepath.Glob(filepath.Join(root, "docs", "design", "*.md"))
	docs = append(append(docs, design...), filepath.Join(root, "README.md"),
		filepath.Join(root, "charts", "clipjob", "README.md"),
		filepath.Join(root, "adapters", "paperclip", "README.md"),
		filepath.Join(root, "internal", "layout", "rooms.md"))
	links := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			file, frag, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, target)
				continue
			}
			if frag == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, h := range heading.FindAllStringSubmatch(string(body), -1) {
				found = found || anchor(h[1]) == frag
			}
			if !found {
				t.Errorf("%s links to %s, which has no heading #%s", rel, target, frag)
			}
		}
	}
	if links < 30 {
		t.Fatalf("found only %d relative links in %d documents: the link pattern is broken", links, len(docs))
	}
}

func TestAnchor(t *testing.T) {
	for h, want := range map[string]string{
		"Tenant namespaces": "tenant-namespaces",
		"Admission: where the time goes, what changed, what is left": "admission-where-the-time-goes-what-changed-what-is-left",
		"render and check, offline":                                  "render-and-check-offline",
		"The `paperclip.io/x` label":                                 "the-paperclipiox-label",
	} {
		if got := anchor(h); got != want {
			t.Errorf("anchor(%q) = %q, want %q", h, got, want)
		}
	}
}
