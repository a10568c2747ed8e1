package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestThePageAnswersOnlyItsOwnHost: a page that rebinds its DNS name to
// the loopback address reaches the server with its own Host, and is
// refused; the page's own host gets the page under a policy that loads
// nothing from elsewhere.
func TestThePageAnswersOnlyItsOwnHost(t *testing.T) {
	job := agentJob("ns", "a", "a1", 0, started(1))
	s := &Server{Kube: fake.NewClientset(&job), Hosts: HostsFor("127.0.0.1:8095")}
	h := s.Handler()
	for _, c := range []struct {
		host, path string
		code       int
	}{
		{"127.0.0.1:8095", "/", http.StatusOK},
		{"localhost:8095", "/api/runs", http.StatusOK},
		{"evil.example.com:8095", "/api/runs", http.StatusMisdirectedRequest},
		{"evil.example.com:8095", "/", http.StatusMisdirectedRequest},
	} {
		req := httptest.NewRequest(http.MethodGet, c.path, nil)
		req.Host = c.host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.code {
			t.Errorf("%s%s: %d, want %d", c.host, c.path, rec.Code, c.code)
			continue
		}
		if c.code == http.StatusOK && !strings.Contains(rec.Header().Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("%s%s: Content-Security-Policy %q", c.host, c.path, rec.Header().Get("Content-Security-Policy"))
		}
		if c.path == "/api/runs" && c.code == http.StatusOK && !strings.Contains(rec.Body.String(), `"key":"ns/run-a"`) {
			t.Errorf("/api/runs: %s", rec.Body)
		}
	}
}

// TestTheCostsPeriodNamesItsFormat: a malformed bound is refused naming
// the parameter and the format.
func TestTheCostsPeriodNamesItsFormat(t *testing.T) {
	s := &Server{Kube: fake.NewClientset(&batchv1.Job{})}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/costs?from=yesterday", nil))
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "from") || !strings.Contains(rec.Body.String(), "RFC 3339") {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

// TestEventsSendAChangeWithoutBeingAsked: the live stream sends the runs
// at once, then a new snapshot when a run appears.
func TestEventsSendAChangeWithoutBeingAsked(t *testing.T) {
	first := agentJob("ns", "first", "a1", 0, started(1))
	kube := fake.NewClientset(&first)
	s := &Server{Kube: kube, Refresh: 50 * time.Millisecond}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	events.Buffer(nil, 1<<20)
	next := func() Snapshot {
		t.Helper()
		for events.Scan() {
			if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
				var snap Snapshot
				if err := json.Unmarshal([]byte(data), &snap); err != nil {
					t.Fatal(err)
				}
				return snap
			}
		}
		t.Fatalf("the stream ended: %v", events.Err())
		return Snapshot{}
	}
	if snap := next(); len(snap.Runs) != 1 || snap.Runs[0].Key != "ns/run-first" {
		t.Fatalf("first snapshot: %+v", snap.Runs)
	}
	second := agentJob("ns", "second", "a1", 1, queued("1", "ns/first"))
	if _, err := kube.BatchV1().Jobs("ns").Create(context.Background(), &second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	snap := next()
	if len(snap.Runs) != 2 || snap.Runs[0].Key != "ns/run-second" || snap.Runs[0].State != StateQueued || snap.Runs[0].WaitsFor.Key != "ns/run-first" {
		t.Errorf("after a run was queued: %+v", snap.Runs)
	}
}
