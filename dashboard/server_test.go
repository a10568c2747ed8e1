package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/paperclipai/clipjob/relay/store"
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

// TestThePageAsksForTheSessionToken: other users and processes of the
// machine reach loopback too; without the token the command prints (in
// the URL, then as a cookie) nothing is served, the page nor its API.
func TestThePageAsksForTheSessionToken(t *testing.T) {
	job := agentJob("ns", "a", "a1", 0, started(1))
	s := &Server{Kube: fake.NewClientset(&job), Token: "s3cret"}
	h := s.Handler()
	get := func(path string, cookie *http.Cookie) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if cookie != nil {
			req.AddCookie(cookie)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, path := range []string{"/", "/api/runs", "/api/runs?token=guess"} {
		if rec := get(path, nil); rec.Code != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, rec.Code)
		}
	}
	if rec := get("/api/runs", &http.Cookie{Name: tokenCookie, Value: "guess"}); rec.Code != http.StatusUnauthorized {
		t.Errorf("a wrong cookie: %d, want 401", rec.Code)
	}
	first := get("/?token=s3cret", nil)
	cookies := first.Result().Cookies()
	if first.Code != http.StatusOK || len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("the printed URL: %d, cookies %+v", first.Code, cookies)
	}
	if rec := get("/api/runs", cookies[0]); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "a1") {
		t.Errorf("the page's API with the cookie: %d %.200s", rec.Code, rec.Body.String())
	}
}

// TestRunsOfAnUnlistedNamespaceAreNotShownAsGone: a viewer who may read
// logs in a namespace but not list its Jobs (or whose list failed) sees
// none of its runs, rather than every one of them as a run whose Job is
// gone.
func TestRunsOfAnUnlistedNamespaceAreNotShownAsGone(t *testing.T) {
	kube := fake.NewClientset()
	kube.PrependReactor("list", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "hidden" {
			return true, nil, apierrors.NewForbidden(batchv1.Resource("jobs"), "", errors.New("no"))
		}
		return false, nil, nil
	})
	relay := fakeRelay(t, false,
		store.Run{ID: "run-h", Namespace: "hidden", Job: "h", JobUID: "uid-h", Agent: "a1", Phase: "Running"},
		store.Run{ID: "run-v", Namespace: "seen", Job: "v", JobUID: "uid-v", Agent: "a2", Phase: "Succeeded"})
	s := &Server{Kube: kube, Namespaces: []string{"hidden", "seen"}, Relay: relay}
	s.mayLogs = map[string]cachedBool{"hidden": {ok: true, exp: time.Now().Add(time.Hour)}, "seen": {ok: true, exp: time.Now().Add(time.Hour)}}
	snap := s.Snapshot(context.Background())
	if len(snap.Runs) != 1 || snap.Runs[0].Namespace != "seen" {
		t.Errorf("runs %+v; want only the listed namespace's run whose Job is gone", snap.Runs)
	}
	if len(snap.Notices) != 1 || !strings.Contains(snap.Notices[0], "hidden") {
		t.Errorf("notices %q", snap.Notices)
	}
}

// TestRelayErrorsHideTheURLsPassword: the relay's URL in a notice the
// page shows carries no password.
func TestRelayErrorsHideTheURLsPassword(t *testing.T) {
	r := &Relay{URL: "http://admin:hunter2@127.0.0.1:1", TokenFile: relayTokenFile(t), HTTP: http.DefaultClient}
	_, err := r.Runs(context.Background())
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the relay's error: %v", err)
	}
}

// TestRequestsFromOtherSitesAreRefused: a web page elsewhere can make the
// viewer's browser send requests it cannot read, each a read of the
// cluster as the viewer; the browser says where they come from.
func TestRequestsFromOtherSitesAreRefused(t *testing.T) {
	job := agentJob("ns", "a", "a1", 0, started(1))
	h := (&Server{Kube: fake.NewClientset(&job)}).Handler()
	for site, code := range map[string]int{"cross-site": http.StatusForbidden, "same-site": http.StatusForbidden, "same-origin": http.StatusOK, "none": http.StatusOK, "": http.StatusOK} {
		req := httptest.NewRequest(http.MethodGet, "/api/costs", nil)
		if site != "" {
			req.Header.Set("Sec-Fetch-Site", site)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != code {
			t.Errorf("Sec-Fetch-Site %q: %d, want %d", site, rec.Code, code)
		}
	}
}

// TestARelayListCutAtItsLimitIsSaid: the relay lists its newest runs up to
// the limit asked for; the runs it left out, and their costs, are missing
// from the page, which says so and shows those it has.
func TestARelayListCutAtItsLimitIsSaid(t *testing.T) {
	relay := fakeRelay(t, true, store.Run{ID: "run-v", Namespace: "ns", Job: "v", JobUID: "uid-v", Agent: "a2", Phase: "Succeeded"})
	relay.Limit = 1
	s := &Server{Kube: fake.NewClientset(), Namespaces: []string{"ns"}, Relay: relay}
	s.mayLogs = map[string]cachedBool{"ns": {ok: true, exp: time.Now().Add(time.Hour)}}
	snap := s.Snapshot(context.Background())
	if len(snap.Runs) != 1 || len(snap.Notices) != 1 || !strings.Contains(snap.Notices[0], "--relay-limit") {
		t.Errorf("runs %d, notices %q; want the run and a notice naming --relay-limit", len(snap.Runs), snap.Notices)
	}
}

// TestAFailedRightsCheckIsSaidOnce: when the API server cannot answer
// whether the viewer may read logs in a namespace, the page says so once
// and asks once per refresh, not once per run of the namespace.
func TestAFailedRightsCheckIsSaidOnce(t *testing.T) {
	kube := fake.NewClientset()
	reviews := 0
	kube.PrependReactor("create", "selfsubjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		reviews++
		return true, nil, apierrors.NewTooManyRequests("slow down", 1)
	})
	var runs []store.Run
	for i := range 20 {
		runs = append(runs, store.Run{ID: fmt.Sprintf("run-%d", i), Namespace: "ns", JobUID: fmt.Sprintf("uid-%d", i), Agent: "a", Phase: "Succeeded"})
	}
	s := &Server{Kube: kube, Namespaces: []string{"ns"}, Relay: fakeRelay(t, false, runs...)}
	snap := s.Snapshot(context.Background())
	if reviews != 1 || len(snap.Runs) != 0 || len(snap.Notices) != 1 || !strings.Contains(snap.Notices[0], "namespace ns") {
		t.Errorf("%d reviews, %d runs, notices %q; want one review and one notice naming the namespace", reviews, len(snap.Runs), snap.Notices)
	}
}

// fakeRelay is a relay whose run list is runs (cut at its limit when
// truncated), stopped with t.
func fakeRelay(t *testing.T, truncated bool, runs ...store.Run) *Relay {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runs": runs, "truncated": truncated})
	}))
	t.Cleanup(srv.Close)
	return &Relay{URL: srv.URL, TokenFile: relayTokenFile(t), HTTP: srv.Client()}
}

// relayTokenFile is a file holding a relay token.
func relayTokenFile(t *testing.T) string {
	t.Helper()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	return token
}
