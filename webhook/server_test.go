package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// TestRunRefusesToStart: options it cannot serve with, and a config file
// that is missing or invalid, stop Run before it reaches the API server,
// with an error that names what to fix.
func TestRunRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	invalid := filepath.Join(dir, "invalid.yaml")
	if err := os.WriteFile(invalid, []byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\nbogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreachable := &rest.Config{Host: "https://127.0.0.1:1"}
	withDefaults := func(f func(*Options)) Options {
		o := DefaultOptions()
		o.RestConfig = unreachable
		f(&o)
		return o
	}
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		{name: "zero options", opts: Options{}, want: []string{"RestConfig is required", "--config (ConfigFile) is required", "--port (Port) must be 1-65535, not 0"}},
		{name: "bad port", opts: withDefaults(func(o *Options) { o.Port = 70000 }), want: []string{"--port (Port) must be 1-65535, not 70000"}},
		{name: "no poll interval", opts: withDefaults(func(o *Options) { o.ConfigPollInterval = 0 }), want: []string{"--config-poll-interval (ConfigPollInterval) must be positive, not 0s"}},
		{name: "missing config", opts: withDefaults(func(o *Options) { o.ConfigFile = filepath.Join(dir, "none.yaml") }), want: []string{"reading config"}},
		{name: "invalid config", opts: withDefaults(func(o *Options) { o.ConfigFile = invalid }), want: []string{"config " + invalid, `unknown field "bogus"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), tc.opts)
			if err == nil {
				t.Fatal("Run started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// A stopping replica closes each connection after its answer, so the API
// server's next admission opens a new one to a replica still serving.
func TestCloseWhileStopping(t *testing.T) {
	var stopping atomic.Bool
	h := closeWhileStopping(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }), &stopping)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MutatePath, nil))
	if rec.Header().Get("Connection") != "" {
		t.Error("a serving replica closes connections")
	}
	stopping.Store(true)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MutatePath, nil))
	if rec.Header().Get("Connection") != "close" || rec.Code != http.StatusOK {
		t.Errorf("a stopping replica: Connection %q, code %d", rec.Header().Get("Connection"), rec.Code)
	}
}
