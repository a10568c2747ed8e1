package relay

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// TestServeRefusesToStart: options it cannot serve with stop Serve before
// it opens the store or reaches the API server, naming every one.
func TestServeRefusesToStart(t *testing.T) {
	err := Serve(context.Background(), Options{})
	for _, want := range []string{"RestConfig is required", "DataDir is required", "MaxStreams must be positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero options: %v does not say %q", err, want)
		}
	}
	o := DefaultOptions()
	o.RestConfig, o.DataDir = &rest.Config{Host: "https://127.0.0.1:1"}, t.TempDir()
	o.RedactPatterns = []string{"("}
	if err := Serve(context.Background(), o); err == nil || !strings.Contains(err.Error(), "redaction patterns") {
		t.Errorf("invalid redaction pattern: %v", err)
	}
	// Running without the values it was told to redact would store them.
	o.RedactPatterns, o.RedactValuesFile = nil, filepath.Join(t.TempDir(), "missing")
	if err := Serve(context.Background(), o); err == nil || !strings.Contains(err.Error(), "redaction values") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("unreadable redaction values file: %v", err)
	}
}
