package app

import (
	"bytes"
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestFlagsAreDocumented: the manual's flag reference is what -h prints.
func TestFlagsAreDocumented(t *testing.T) {
	var usage bytes.Buffer
	o, err := Parse(nil, &usage)
	if err != nil {
		t.Fatal(err)
	}
	fs := NewFlags(o)
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	golden.CompareDocBlock(t, golden.Doc("configuration.md"), "clipjob-relay -h", usage.String())
}
