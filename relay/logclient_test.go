package relay

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/relay/collect"
)

// A log stream the relay does not read holds at most the HTTP/2 window
// logClient asks for: the API server cannot push more. With client-go's
// transport (Go's defaults) this stream took 4 MiB, and the relay follows
// hundreds at once. The stream still goes over HTTP/2 with the config's
// credentials.
func TestLogStreamsHoldAtMostTheirWindow(t *testing.T) {
	srv := newFloodingServer(t)
	rc, err := collect.APILogSource{Client: srv.client(t)}.Stream(t.Context(), "ns", "pod", "agent", time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	// Not read: the server writes until flow control stops it.
	if got := srv.writtenWhenStopped(); got == 0 || got > 2*logStreamWindow {
		t.Errorf("the server wrote %d bytes to a stream nobody read; want at most about the window, %d", got, logStreamWindow)
	}
	if p, _ := srv.proto.Load().(string); p != "HTTP/2.0" {
		t.Errorf("log stream over %q, want HTTP/2.0", p)
	}
	if a, _ := srv.auth.Load().(string); a != "Bearer relay-token" {
		t.Errorf("Authorization %q, want the config's bearer token", a)
	}
}

// The streams of one connection the relay does not read hold at most the
// connection's window together, not a stream's window each: 64 streams
// took 2 MiB with Go's 1 GiB a connection, and the relay follows
// hundreds, on few connections.
func TestLogStreamsHoldAtMostTheirConnectionsWindow(t *testing.T) {
	const streams = 64
	srv := newFloodingServer(t)
	cs := srv.client(t)
	for i := range streams {
		rc, err := collect.APILogSource{Client: cs}.Stream(t.Context(), "ns", fmt.Sprintf("pod-%d", i), "agent", time.Time{}, false)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
	}
	for deadline := time.Now().Add(time.Minute); srv.streams.Load() < streams; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d streams started", srv.streams.Load(), streams)
		}
	}
	// The server counts a line written once its stream's buffer took it:
	// a line a stream more.
	if got := srv.writtenWhenStopped(); got == 0 || got > logConnWindow+streams*2<<10 {
		t.Errorf("the server wrote %d bytes to %d streams nobody read; want at most about the connection's window, %d", got, streams, logConnWindow)
	}
}

// floodingServer is an API server whose every log stream writes as fast
// as flow control lets it.
type floodingServer struct {
	*httptest.Server
	written, streams atomic.Int64
	proto, auth      atomic.Value
}

func newFloodingServer(t *testing.T) *floodingServer {
	f := &floodingServer{}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.proto.Store(r.Proto)
		f.auth.Store(r.Header.Get("Authorization"))
		f.streams.Add(1)
		line := []byte(time.Now().UTC().Format(time.RFC3339Nano) + " " + strings.Repeat("x", 1000) + "\n")
		for r.Context().Err() == nil {
			if _, err := w.Write(line); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			f.written.Add(int64(len(line)))
		}
	}))
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(f.Close)
	return f
}

// client is the relay's log client for the server.
func (f *floodingServer) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
	cs, err := logClient(&rest.Config{Host: f.URL, BearerToken: "relay-token", TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: 1000, Burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// writtenWhenStopped waits until the server stops writing (flow control)
// and returns what it wrote.
func (f *floodingServer) writtenWhenStopped() int64 {
	var last int64 = -1
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		n := f.written.Load()
		if n == last && n > 0 {
			break
		}
		last = n
	}
	return f.written.Load()
}
