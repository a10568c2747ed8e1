package relay

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/relay/collect"
)

// A log stream the relay does not read holds at most the HTTP/2 window
// logClient asks for: the API server cannot push more. With client-go's
// transport (Go's defaults) this stream took 4 MiB, and the relay follows
// hundreds at once. The stream still goes over HTTP/2 with the config's
// credentials.
func TestLogStreamsHoldAtMostTheirWindow(t *testing.T) {
	var written atomic.Int64
	var proto, auth atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Proto)
		auth.Store(r.Header.Get("Authorization"))
		line := []byte(time.Now().UTC().Format(time.RFC3339Nano) + " " + strings.Repeat("x", 1000) + "\n")
		for r.Context().Err() == nil {
			if _, err := w.Write(line); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			written.Add(int64(len(line)))
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cs, err := logClient(&rest.Config{Host: srv.URL, BearerToken: "relay-token", TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc, err := collect.APILogSource{Client: cs}.Stream(ctx, "ns", "pod", "agent", time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	// Not read: the server writes until flow control stops it.
	var last int64 = -1
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		n := written.Load()
		if n == last && n > 0 {
			break
		}
		last = n
	}
	if got := written.Load(); got == 0 || got > 2*logStreamWindow {
		t.Errorf("the server wrote %d bytes to a stream nobody read; want at most about the window, %d", got, logStreamWindow)
	}
	if p, _ := proto.Load().(string); p != "HTTP/2.0" {
		t.Errorf("log stream over %q, want HTTP/2.0", p)
	}
	if a, _ := auth.Load().(string); a != "Bearer relay-token" {
		t.Errorf("Authorization %q, want the config's bearer token", a)
	}
}
