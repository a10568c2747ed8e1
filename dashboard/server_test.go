package dashboard

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
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
