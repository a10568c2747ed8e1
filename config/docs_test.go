package config_test

import (
	"os"
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestReferenceShowsEveryField: the manual's configuration reference
// holds config/testdata/full.yaml as it is (TestFullExample holds that
// file to the types).
func TestReferenceShowsEveryField(t *testing.T) {
	full, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	golden.CompareDocBlock(t, golden.Doc("configuration.md"), "config/testdata/full.yaml", string(full))
}
