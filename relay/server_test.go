package relay

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// TestServeRefusesToStart: options it cannot serve with stop Serve before
// it opens the store or reaches the API server, naming every one.
func TestServeRefusesToStart(t *testing.T) {
	err := Serve(context.Background(), Options{})
	for _, want := range []string{"RestConfig is required", "--data-dir (DataDir) is required", "--max-streams (MaxStreams) must be positive, not 0"} {
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

// The relay is ready only once its API accepts connections: a restarted
// relay said ready (its pod cache synced) before the service had opened
// the API's listener, and refused its first clients.
func TestAPIReadyOnlyWhenListening(t *testing.T) {
	s := &service{opts: Options{APIAddr: "127.0.0.1:0"}, log: logr.Discard()}
	if s.apiReady(nil) == nil {
		t.Fatal("ready before the API listens")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api, _, err := s.serveAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.apiReady(nil); err != nil {
		t.Fatalf("not ready while listening: %v", err)
	}
	api.stop(time.Second)

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	taken := &service{opts: Options{APIAddr: busy.Addr().String()}, log: logr.Discard()}
	if _, _, err := taken.serveAPI(ctx); err == nil || taken.apiReady(nil) == nil {
		t.Fatalf("an API that could not listen (%v) reads as ready", err)
	}
}
