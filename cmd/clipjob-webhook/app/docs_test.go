package app

import (
	"io"
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestFlagsAreDocumented: the manual's flag reference is what -h prints.
func TestFlagsAreDocumented(t *testing.T) {
	o, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	golden.CompareFlagsDoc(t, "clipjob-webhook", NewFlags(o))
}
