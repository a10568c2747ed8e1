package golden

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Doc is the path of a document of the manual (docs/NAME), wherever the
// calling test runs from.
func Doc(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "docs", name)
}

// CompareDocBlock checks that the fenced block following the line
// `<!-- name -->` in the document at path holds got, or rewrites that
// block when REFRESH_GOLDEN=true: reference sections of the manual (every
// config field, every flag) are generated from what the code has, so they
// cannot drift from it.
func CompareDocBlock(t testing.TB, path, name, got string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end, err := docBlock(doc, name)
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(path), err)
	}
	if !strings.HasSuffix(got, "\n") {
		got += "\n"
	}
	if refresh() {
		if err := os.WriteFile(path, []byte(doc[:start]+got+doc[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(doc[start:end], got); diff != "" {
		t.Errorf("%s: the block %q differs from what the code has (-doc +code); REFRESH_GOLDEN=true rewrites it (make golden):\n%s", filepath.Base(path), name, diff)
	}
}

// docBlock finds the content of the fenced block after the marker line.
func docBlock(doc, name string) (start, end int, err error) {
	marker := "<!-- " + name + " -->\n"
	i := strings.Index(doc, marker)
	if i < 0 {
		return 0, 0, fmt.Errorf("no line %q", strings.TrimSpace(marker))
	}
	rest := doc[i+len(marker):]
	open := strings.Index(rest, "```")
	if open < 0 || strings.TrimSpace(rest[:open]) != "" {
		return 0, 0, fmt.Errorf("no fenced block right after %q", strings.TrimSpace(marker))
	}
	nl := strings.Index(rest[open:], "\n")
	if nl < 0 {
		return 0, 0, fmt.Errorf("an unterminated block after %q", strings.TrimSpace(marker))
	}
	start = i + len(marker) + open + nl + 1
	if strings.HasPrefix(doc[start:], "```") {
		return start, start, nil
	}
	closing := strings.Index(doc[start:], "\n```")
	if closing < 0 {
		return 0, 0, fmt.Errorf("an unterminated block after %q", strings.TrimSpace(marker))
	}
	return start, start + closing + 1, nil
}

// CompareFlagsDoc checks that docs/configuration.md's block "<name> -h"
// holds the usage fs prints, as the manual's reference of a command's
// flags.
func CompareFlagsDoc(t testing.TB, name string, fs *flag.FlagSet) {
	t.Helper()
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	CompareDocBlock(t, Doc("configuration.md"), name+" -h", usage.String())
}
