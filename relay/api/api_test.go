package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// tokenAuth: token "reader" may read namespace "paperclip" only.
type tokenAuth struct{}

func (tokenAuth) Authenticate(r *http.Request) (*authnv1.UserInfo, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer reader":
		return &authnv1.UserInfo{Username: "reader"}, nil
	case "Bearer nobody":
		return &authnv1.UserInfo{Username: "nobody"}, nil
	}
	return nil, errUnauthenticated
}

func (tokenAuth) Allowed(_ context.Context, u *authnv1.UserInfo, ns string) (bool, error) {
	return u.Username == "reader" && ns == "paperclip", nil
}

func apiFixture(t *testing.T) (*bolt.Store, *httptest.Server) {
	s, _ := storetest.Open(t)
	for _, run := range []struct{ id, ns, agent string }{{"run-1", "paperclip", "agent-a"}, {"run-2", "paperclip", "agent-b"}, {"run-x", "other", "agent-a"}} {
		_, _ = s.UpdateRun(run.id, func(r *store.Run) { r.Namespace, r.Agent, r.Phase = run.ns, run.agent, "Running" })
	}
	_, _ = storetest.Append(s, "run-1", "st", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one", "two", "three"), time.Now())
	api := &API{Store: s, Auth: tokenAuth{}, Keepalive: 50 * time.Millisecond}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

func get(t *testing.T, url, token, accept string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestAPIAccess(t *testing.T) {
	_, srv := apiFixture(t)
	tests := []struct {
		path, token string
		want        int
	}{
		{"/v1/runs/run-1", "", http.StatusUnauthorized},
		{"/v1/runs/run-1", "bogus", http.StatusUnauthorized},
		// Not readable looks like not there: a 403 would confirm the id.
		{"/v1/runs/run-1", "nobody", http.StatusNotFound},
		{"/v1/runs/run-x", "reader", http.StatusNotFound},
		{"/v1/runs/never", "reader", http.StatusNotFound},
		{"/v1/runs/run-1", "reader", http.StatusOK},
		{"/v1/runs/run-1/log?after=x", "reader", http.StatusBadRequest},
	}
	for _, tt := range tests {
		if got := get(t, srv.URL+tt.path, tt.token, "").StatusCode; got != tt.want {
			t.Errorf("%s as %q: %d, want %d", tt.path, tt.token, got, tt.want)
		}
	}
}

func TestAPIListFiltersAndAuthorizes(t *testing.T) {
	_, srv := apiFixture(t)
	var body struct{ Runs []store.Run }
	_ = json.NewDecoder(get(t, srv.URL+"/v1/runs?agent=agent-a", "reader", "").Body).Decode(&body)
	if len(body.Runs) != 1 || body.Runs[0].ID != "run-1" {
		t.Errorf("runs %+v: want run-1 only (run-x is in a namespace reader may not read)", body.Runs)
	}
}

// A list is bounded: the newest runs the caller may read, up to limit,
// and says when more matched; a bad limit is refused, naming it.
func TestAPIListLimit(t *testing.T) {
	_, srv := apiFixture(t)
	var body struct {
		Runs      []store.Run
		Truncated bool
	}
	_ = json.NewDecoder(get(t, srv.URL+"/v1/runs?limit=1", "reader", "").Body).Decode(&body)
	if len(body.Runs) != 1 || !body.Truncated {
		t.Errorf("limit=1 over two readable runs: %d runs, truncated %v", len(body.Runs), body.Truncated)
	}
	body.Truncated = false
	_ = json.NewDecoder(get(t, srv.URL+"/v1/runs?limit=2", "reader", "").Body).Decode(&body)
	if len(body.Runs) != 2 || body.Truncated {
		t.Errorf("limit=2 over two readable runs (and one unreadable): %d runs, truncated %v", len(body.Runs), body.Truncated)
	}
	for _, bad := range []string{"0", "-1", "x", "10001"} {
		resp := get(t, srv.URL+"/v1/runs?limit="+bad, "reader", "")
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(msg), "limit") {
			t.Errorf("limit=%s: %d %s", bad, resp.StatusCode, msg)
		}
	}
}

func TestAPIPlainLog(t *testing.T) {
	_, srv := apiFixture(t)
	resp := get(t, srv.URL+"/v1/runs/run-1/log?after=1", "reader", "")
	b := new(strings.Builder)
	_, _ = bufio.NewReader(resp.Body).WriteTo(b)
	if b.String() != "two\nthree\n" {
		t.Errorf("plain log %q", b.String())
	}
}

func TestAPINDJSONFollowsUntilEnd(t *testing.T) {
	s, srv := apiFixture(t)
	resp := get(t, srv.URL+"/v1/runs/run-1/log", "reader", "application/x-ndjson")
	sc := bufio.NewScanner(resp.Body)
	var got []string
	for sc.Scan() {
		var ev struct {
			Type  string
			Line  string
			Phase string
		}
		_ = json.Unmarshal(sc.Bytes(), &ev)
		switch ev.Type {
		case "line":
			got = append(got, ev.Line)
			if ev.Line == "three" {
				// The stream has sent all the store had: what comes
				// now, it must follow.
				_, _ = storetest.Append(s, "run-1", "st", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", "four"), time.Now())
				code := int32(0)
				_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase, r.ExitCode = true, "Succeeded", &code })
			}
		case "end":
			got = append(got, "end:"+ev.Phase)
		}
	}
	if strings.Join(got, ",") != "one,two,three,four,end:Succeeded" {
		t.Errorf("events %v", got)
	}
}

func TestAPISSEResumesFromLastEventID(t *testing.T) {
	s, srv := apiFixture(t)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Failed" })
	resp := get(t, srv.URL+"/v1/runs/run-1/log", "reader", "text/event-stream", "Last-Event-ID", "2")
	b := new(strings.Builder)
	_, _ = bufio.NewReader(resp.Body).WriteTo(b)
	out := b.String()
	if !strings.HasPrefix(out, "id: 3\nevent: line\ndata: ") || !strings.Contains(out, `"line":"three"`) ||
		!strings.Contains(out, "event: end\ndata: ") || strings.Contains(out, `"line":"two"`) {
		t.Errorf("SSE stream:\n%s", out)
	}
	// Reconnecting after the end: 204, the EventSource stops.
	if code := get(t, srv.URL+"/v1/runs/run-1/log", "reader", "text/event-stream", "Last-Event-ID", "3").StatusCode; code != http.StatusNoContent {
		t.Errorf("after the end: %d, want 204", code)
	}
}

func TestAPISSEKeepalive(t *testing.T) {
	_, srv := apiFixture(t)
	resp := get(t, srv.URL+"/v1/runs/run-1/log?after=3", "reader", "text/event-stream")
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	if err != nil || line != ": keepalive\n" {
		t.Errorf("first bytes %q (%v), want a keepalive comment", line, err)
	}
}

// reviewingClient is an API server that accepts the token "good" (as
// paperclip:server) and lets it read logs in namespace "paperclip" while
// its accept and allow say so, counting the reviews it answers.
type reviewingClient struct {
	*fake.Clientset
	reviews, sars int
	accept, allow bool
}

func newReviewingClient() *reviewingClient {
	c := &reviewingClient{Clientset: fake.NewClientset(), accept: true, allow: true}
	c.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		c.reviews++
		tr := a.(clienttesting.CreateAction).GetObject().(*authnv1.TokenReview)
		if tr.Spec.Token == "good" && c.accept {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:paperclip:server", UID: "u1"}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		c.sars++
		sar := a.(clienttesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		ra := sar.Spec.ResourceAttributes
		sar.Status.Allowed = c.allow && ra.Namespace == "paperclip" && ra.Resource == "pods" && ra.Subresource == "log" && ra.Verb == "get"
		return true, sar, nil
	})
	return c
}

func TestKubeAuthReviewsAndCaches(t *testing.T) {
	c := newReviewingClient()
	a := &KubeAuth{Client: c}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := a.Authenticate(req); !errors.Is(err, errUnauthenticated) {
		t.Errorf("no token: %v", err)
	}
	req.Header.Set("Authorization", "Bearer bad")
	for i := 0; i < 3; i++ { // a client retrying a bad token: one review
		if _, err := a.Authenticate(req); !errors.Is(err, errUnauthenticated) {
			t.Errorf("bad token: %v", err)
		}
	}
	req.Header.Set("Authorization", "Bearer good")
	for i := 0; i < 3; i++ {
		u, err := a.Authenticate(req)
		if err != nil || u.Username != "system:serviceaccount:paperclip:server" {
			t.Fatalf("good token: %v %v", u, err)
		}
		if ok, _ := a.Allowed(context.Background(), u, "paperclip"); !ok {
			t.Error("allowed namespace refused")
		}
		if ok, _ := a.Allowed(context.Background(), u, "kube-system"); ok {
			t.Error("other namespace allowed")
		}
	}
	if c.reviews != 2 || c.sars != 2 {
		t.Errorf("%d TokenReviews and %d SARs for repeated calls; want 2 and 2 (cached)", c.reviews, c.sars)
	}
}

// TestKubeAuthForgetsDecisionsAfterTheirLifetimes: a decision is cached
// for its lifetime only, so what the API server changes reaches the relay
// within it: a token it no longer accepts (revoked, its ServiceAccount
// deleted) is refused once tokenTTL has passed, a permission taken away
// once allowTTL has, and a denial is asked again after denyTTL. On a fake
// clock, a second short of each lifetime and a second past it.
func TestKubeAuthForgetsDecisionsAfterTheirLifetimes(t *testing.T) {
	c := newReviewingClient()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 28, 18, 0, 0, 0, time.UTC))
	a := &KubeAuth{Client: c, Clock: clk}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("Authorization", "Bearer good")
	user := func() *authnv1.UserInfo {
		t.Helper()
		u, err := a.Authenticate(req)
		if err != nil {
			return nil
		}
		return u
	}
	allowed := func(u *authnv1.UserInfo) bool {
		t.Helper()
		ok, err := a.Allowed(context.Background(), u, "paperclip")
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	u := user()
	if u == nil || !allowed(u) {
		t.Fatal("the good token refused")
	}
	start := clk.Now()
	at := func(d time.Duration) { clk.SetTime(start.Add(d)) }

	// Permission taken away: allowed until allowTTL (30 s), then not.
	c.allow = false
	at(29 * time.Second)
	if !allowed(u) {
		t.Error("a grant forgotten before its 30 s")
	}
	at(31 * time.Second)
	if allowed(u) {
		t.Error("a permission taken away still allowed 31 s later")
	}
	// Given back: the denial stands until denyTTL (10 s), then is asked again.
	c.allow = true
	at(40 * time.Second)
	if allowed(u) {
		t.Error("a denial forgotten before its 10 s")
	}
	at(42 * time.Second)
	if !allowed(u) {
		t.Error("a permission given back still denied 11 s after the denial")
	}

	// Token revoked: accepted until tokenTTL (1 m), then refused.
	c.accept = false
	at(59 * time.Second)
	if user() == nil {
		t.Error("a token forgotten before its minute")
	}
	at(61 * time.Second)
	if user() != nil {
		t.Error("a revoked token still accepted 61 s after its review")
	}
	if c.reviews != 2 || c.sars != 3 {
		t.Errorf("%d TokenReviews and %d SARs, want 2 and 3: one per lifetime that ran out", c.reviews, c.sars)
	}
}

func TestKubeAuthChecksAudiencesAndKeysOnGroups(t *testing.T) {
	cs := fake.NewClientset()
	sars := 0
	cs.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		tr := a.(clienttesting.CreateAction).GetObject().(*authnv1.TokenReview)
		// An authenticator that ignores the audiences it was asked for.
		groups := []string{"team-a"}
		if tr.Spec.Token == "b" {
			groups = []string{"team-b"}
		}
		tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"https://kubernetes.default.svc"},
			User: authnv1.UserInfo{Username: "alice", Groups: groups}}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		sars++
		sar := a.(clienttesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		sar.Status.Allowed = len(sar.Spec.Groups) == 1 && sar.Spec.Groups[0] == "team-a"
		return true, sar, nil
	})
	req := func(tok string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		return r
	}
	strict := &KubeAuth{Client: cs, Audiences: []string{"clipjob-relay"}}
	if _, err := strict.Authenticate(req("a")); !errors.Is(err, errUnauthenticated) || !strings.Contains(err.Error(), "--audience clipjob-relay") {
		t.Errorf("a token for another audience: want 401 saying which audience, got %v", err)
	}
	a := &KubeAuth{Client: cs}
	ua, _ := a.Authenticate(req("a"))
	ub, _ := a.Authenticate(req("b"))
	okA, _ := a.Allowed(context.Background(), ua, "paperclip")
	okB, _ := a.Allowed(context.Background(), ub, "paperclip")
	if !okA || okB {
		t.Errorf("same user name, different groups: allowed %v and %v, want true and false", okA, okB)
	}
	if sars != 2 {
		t.Errorf("%d SubjectAccessReviews; the second caller reused the first one's decision", sars)
	}
}

// TestAPIPagesByBytes: a log of long lines is served in pages bounded by
// bytes (store.PageBytes), and a page that ends early is not mistaken for
// the end of the log.
func TestAPIPagesByBytes(t *testing.T) {
	s, srv := apiFixture(t)
	long := strings.Repeat("x", store.PageBytes/2+1)
	texts := []string{long + "a", long + "b", long + "c", long + "d"}
	_, _ = storetest.Append(s, "run-1", "st", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", texts...), time.Now())
	if page, _ := store.Lines(s, "run-1", 3, 0); len(page) != 2 {
		t.Fatalf("a page holds %d long lines, want 2 (bounded by bytes)", len(page))
	}
	code := int32(0)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase, r.ExitCode = true, "Succeeded", &code })
	resp := get(t, srv.URL+"/v1/runs/run-1/log?follow=false", "reader", "application/x-ndjson")
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4*store.PageBytes)
	var lines, ends int
	for sc.Scan() {
		var ev struct{ Type string }
		_ = json.Unmarshal(sc.Bytes(), &ev)
		switch ev.Type {
		case "line":
			lines++
		case "end":
			ends++
		}
	}
	if lines != 7 || ends != 1 {
		t.Errorf("%d lines and %d ends, want all 7 lines then the end", lines, ends)
	}
}

// TestFollowEndsWhenAccessIsRevoked: a following response checks again,
// each time Reauthorize passed on the API's clock, that its caller may
// read the run: granted, the stream goes on; refused, it ends.
func TestFollowEndsWhenAccessIsRevoked(t *testing.T) {
	s, _ := storetest.Open(t)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Namespace, r.Phase = "paperclip", "Running" })
	_, _ = storetest.Append(s, "run-1", "st", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one"), time.Now())
	auth := &revocable{}
	clk := clocktesting.NewFakeClock(time.Now())
	api := &API{Store: s, Auth: auth, Keepalive: time.Minute, Reauthorize: time.Minute, Clock: clk}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	resp := get(t, srv.URL+"/v1/runs/run-1/log", "reader", "application/x-ndjson")
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, resp.Body); close(done) }()
	following := func(checks int32) {
		t.Helper()
		err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return clk.HasWaiters() && auth.asked.Load() == checks, nil
		})
		select {
		case <-done:
			t.Fatalf("the stream ended while access was granted (after %d checks)", auth.asked.Load())
		default:
		}
		if err != nil {
			t.Fatalf("not following after %d checks of access: %d checks", checks, auth.asked.Load())
		}
	}
	following(1) // the request's own check
	clk.Step(time.Minute)
	following(2) // checked again, granted
	auth.revoked.Store(true)
	following(2) // nothing checks before the clock moves
	clk.Step(time.Minute)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the stream went on (a minute) after access was revoked")
	}
}

// revocable allows everything until revoked, counting the checks.
type revocable struct {
	revoked atomic.Bool
	asked   atomic.Int32
}

func (a *revocable) Authenticate(*http.Request) (*authnv1.UserInfo, error) {
	return &authnv1.UserInfo{Username: "reader"}, nil
}

func (a *revocable) Allowed(context.Context, *authnv1.UserInfo, string) (bool, error) {
	a.asked.Add(1)
	return !a.revoked.Load(), nil
}

// The log stream sends stored lines without decoding them; what it sends
// must be exactly the event a decoded line makes, for SSE and NDJSON.
func TestRawLineEventIsTheEvent(t *testing.T) {
	s, _ := storetest.Open(t)
	line := store.Line{TS: time.Date(2026, 11, 23, 1, 2, 3, 456789, time.UTC), Container: "agent", Line: `{"type":"result","text":"a \"quoted\" <tag> & \u2028"}`}
	if _, err := storetest.Append(s, "run-1", "st", store.Cursor{TS: 1, Count: 1}, []store.Line{line}, time.Now()); err != nil {
		t.Fatal(err)
	}
	raw, err := storetest.RawLines(s, "run-1", 0, 0)
	if err != nil || len(raw) != 1 {
		t.Fatalf("raw lines %v, %v", raw, err)
	}
	decoded, _ := store.Lines(s, "run-1", 0, 0)
	for _, sse := range []bool{true, false} {
		var viaRaw, viaDecoded strings.Builder
		ew := &eventWriter{w: fakeWriter{&viaRaw}, sse: sse}
		if err := ew.writeLine(raw[0]); err != nil || ew.flush() != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(event{Type: "line", Line: &decoded[0]})
		if sse {
			fmt.Fprintf(&viaDecoded, "id: %d\nevent: line\ndata: %s\n\n", decoded[0].Seq, data)
		} else {
			fmt.Fprintf(&viaDecoded, "%s\n", data)
		}
		if viaRaw.String() != viaDecoded.String() {
			t.Errorf("sse=%v:\nraw     %q\ndecoded %q", sse, viaRaw.String(), viaDecoded.String())
		}
	}
}

// fakeWriter is an http.ResponseWriter writing into a builder.
type fakeWriter struct{ b *strings.Builder }

func (f fakeWriter) Header() http.Header         { return http.Header{} }
func (f fakeWriter) Write(p []byte) (int, error) { return f.b.Write(p) }
func (f fakeWriter) WriteHeader(int)             {}

// TestAPIFindsAJobsRunByItsUID: another Job took run-1's id first (the
// collector bound it, and kept this Job's run under its own key); a client
// that knows its Job asks with ?job= and gets its run and its log, never
// the other Job's; the other Job's run is what the bare id names.
func TestAPIFindsAJobsRunByItsUID(t *testing.T) {
	const uidFirst, uidMine = "0b7a9c1d-0000-4000-8000-0000000000a1", "0b7a9c1d-0000-4000-8000-0000000000b2"
	s, srv := apiFixture(t)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.JobUID = uidFirst })
	mine := store.RunKey("run-1", uidMine)
	_, _ = s.UpdateRun(mine, func(r *store.Run) {
		r.Namespace, r.Agent, r.JobUID, r.Phase = "paperclip", "agent-a", uidMine, "Running"
	})
	_, _ = storetest.Append(s, mine, "st", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "mine"), time.Now())
	for _, tt := range []struct{ query, wantJob, wantLog string }{
		{"", uidFirst, "one\ntwo\nthree\n"},
		{"?job=" + uidFirst, uidFirst, "one\ntwo\nthree\n"},
		{"?job=" + uidMine, uidMine, "mine\n"},
	} {
		var run store.Run
		resp := get(t, srv.URL+"/v1/runs/run-1"+tt.query, "reader", "")
		if err := json.NewDecoder(resp.Body).Decode(&run); err != nil || run.JobUID != tt.wantJob {
			t.Errorf("run-1%s: %+v (%v), want the run of %s", tt.query, run, err, tt.wantJob)
		}
		sep := "?"
		if tt.query != "" {
			sep = "&"
		}
		body, _ := io.ReadAll(get(t, srv.URL+"/v1/runs/run-1/log"+tt.query+sep+"follow=false", "reader", "").Body)
		if string(body) != tt.wantLog {
			t.Errorf("log of run-1%s: %q, want %q", tt.query, body, tt.wantLog)
		}
	}
	for _, job := range []string{"0b7a9c1d-0000-4000-8000-0000000000c3", "../x", "a@b"} {
		if code := get(t, srv.URL+"/v1/runs/run-1?job="+job, "reader", "").StatusCode; code != http.StatusNotFound {
			t.Errorf("?job=%s, a Job with no run here: %d, want 404", job, code)
		}
	}
	// To a caller who may read nothing, ?job= tells no more than the id
	// alone: the same answer whether the id or the Job's run exists.
	bodyOf := func(path string) string {
		b, _ := io.ReadAll(get(t, srv.URL+path, "nobody", "").Body)
		return string(b)
	}
	if a, b := bodyOf("/v1/runs/run-1?job="+uidMine), bodyOf("/v1/runs/run-1?job=0b7a9c1d-0000-4000-8000-0000000000c3"); a != b {
		t.Errorf("a run that exists and one that does not answer differently: %q vs %q", a, b)
	}
}

// pickyStore refuses, as PostgreSQL does, a query holding bytes that are
// not UTF-8 or a NUL.
type pickyStore struct{ *bolt.Store }

func sqlText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func (p pickyStore) RunsWhere(f store.Filter) ([]store.Summary, error) {
	if !sqlText(f.Agent + f.Company + f.Phase) {
		return nil, errors.New(`ERROR: invalid byte sequence for encoding "UTF8" (SQLSTATE 22021)`)
	}
	return p.Store.RunsWhere(f)
}

func (p pickyStore) Run(id string) (*store.Run, error) {
	if !sqlText(id) {
		return nil, errors.New(`ERROR: invalid byte sequence for encoding "UTF8" (SQLSTATE 22021)`)
	}
	return p.Store.Run(id)
}

// TestAPIBytesNoRunHasMatchNothing: a filter or run id that is not UTF-8,
// or holds a NUL, names no run (labels cannot): an empty list and a 404,
// never a store's error in a 500 (found by a hostile review on
// PostgreSQL).
func TestAPIBytesNoRunHasMatchNothing(t *testing.T) {
	s, _ := apiFixture(t)
	srv := httptest.NewServer((&API{Store: pickyStore{s}, Auth: tokenAuth{}}).Handler())
	t.Cleanup(srv.Close)
	for _, v := range []string{"%FF", "a%00b", "%C3("} {
		for _, q := range []string{"agent", "company", "phase"} {
			resp := get(t, srv.URL+"/v1/runs?"+q+"="+v, "reader", "")
			var body struct{ Runs []store.Run }
			if err := json.NewDecoder(resp.Body).Decode(&body); resp.StatusCode != http.StatusOK || err != nil || len(body.Runs) != 0 {
				t.Errorf("?%s=%s: %d %v %+v, want 200 and no run", q, v, resp.StatusCode, err, body.Runs)
			}
		}
		if got := get(t, srv.URL+"/v1/runs/"+v, "reader", "").StatusCode; got != http.StatusNotFound {
			t.Errorf("/v1/runs/%s: %d, want 404", v, got)
		}
		if got := get(t, srv.URL+"/v1/runs/run-1?job="+v, "reader", "").StatusCode; got != http.StatusNotFound {
			t.Errorf("/v1/runs/run-1?job=%s: %d, want 404", v, got)
		}
	}
	if got := get(t, srv.URL+"/v1/runs/run-1", "reader", "").StatusCode; got != http.StatusOK {
		t.Errorf("/v1/runs/run-1 through the picky store: %d", got)
	}
}

// pageStore counts the record reads and page reads of a store.
type pageStore struct {
	*bolt.Store
	runs, pages atomic.Int64
}

func (p *pageStore) Run(id string) (*store.Run, error) {
	p.runs.Add(1)
	return p.Store.Run(id)
}

func (p *pageStore) Page(run string, after uint64, limit int, each func(store.RawLine)) (uint64, bool, bool, error) {
	p.pages.Add(1)
	return p.Store.Page(run, after, limit, each)
}

// TestAFollowerReadsTheRecordOnlyForItsEnd: a follower woken by each
// commit asks how far the run is, not for its record (a JSON document
// PostgreSQL sends and the relay decodes: a fifth of a replica's CPU with
// 1,000 runs followed), and reads the record once, for the end event.
func TestAFollowerReadsTheRecordOnlyForItsEnd(t *testing.T) {
	s, _ := storetest.Open(t)
	ps := &pageStore{Store: s}
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Namespace, r.Agent, r.Phase = "paperclip", "agent-a", "Running" })
	_, _ = storetest.Append(s, "run-1", "st", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "line 1"), time.Now())
	srv := httptest.NewServer((&API{Store: ps, Auth: tokenAuth{}, Keepalive: time.Minute}).Handler())
	defer srv.Close()
	resp := get(t, srv.URL+"/v1/runs/run-1/log", "reader", "application/x-ndjson")
	defer resp.Body.Close()
	runsBefore := ps.runs.Load() // the request's own lookup of the run
	sc := bufio.NewScanner(resp.Body)
	lines, ended := 0, false
	for sc.Scan() {
		var ev struct{ Type string }
		_ = json.Unmarshal(sc.Bytes(), &ev)
		switch ev.Type {
		case "line":
			lines++
			if lines < 6 { // one commit per wake-up
				_, _ = storetest.Append(s, "run-1", "st", store.Cursor{TS: int64(lines + 1), Count: 1}, storetest.Lines("agent", fmt.Sprintf("line %d", lines+1)), time.Now())
			} else {
				_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" })
			}
		case "end":
			ended = true
		}
	}
	if !ended || lines != 6 {
		t.Fatalf("%d lines, ended %v", lines, ended)
	}
	if got := ps.runs.Load() - runsBefore; got > 1 {
		t.Errorf("the follower read the run's record %d times over %d wake-ups, want once (for its end)", got, ps.pages.Load())
	}
	if ps.pages.Load() < 6 {
		t.Errorf("%d page reads over 6 commits", ps.pages.Load())
	}
}

// TestALogStreamsFromPostgreSQL: a follower on PostgreSQL reads its lines
// and how far the run is in one query a page (Store.Page, each line's
// JSON written from the connection's buffer): every line once, in order,
// across pages, then the end.
func TestALogStreamsFromPostgreSQL(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s, err := postgres.Open(context.Background(), postgres.Options{ConnString: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Namespace, r.Phase = "paperclip", "Running" })
	const n = 450 // three pages of a follower's 200
	var texts []string
	for i := range n {
		texts = append(texts, fmt.Sprintf(`{"n":%d,"text":"<%s>"}`, i+1, strings.Repeat("é", i%7)))
	}
	if _, err := s.AppendAfter("run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", texts...), time.Now()); err != nil {
		t.Fatal(err)
	}
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" })
	srv := httptest.NewServer((&API{Store: s, Auth: tokenAuth{}, Keepalive: time.Minute}).Handler())
	defer srv.Close()
	resp := get(t, srv.URL+"/v1/runs/run-1/log?after=0", "reader", "text/event-stream")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var got []string
	for _, ev := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		var e struct {
			Type, Line string
			Seq        uint64
		}
		if err := json.Unmarshal([]byte(ev[strings.Index(ev, "data: ")+6:]), &e); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		if e.Type == "line" {
			if want := fmt.Sprintf("id: %d\n", len(got)+1); !strings.HasPrefix(ev, want) || e.Seq != uint64(len(got)+1) {
				t.Fatalf("event %q after %d lines", ev, len(got))
			}
			got = append(got, e.Line)
		} else if e.Type != "end" || len(got) != n {
			t.Fatalf("%s after %d lines", ev, len(got))
		}
	}
	if strings.Join(got, "\n") != strings.Join(texts, "\n") {
		t.Errorf("the lines streamed are not the lines stored")
	}
}
