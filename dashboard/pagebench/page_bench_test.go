package pagebench

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authzv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/dashboard"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/store"
)

// logLines is the log's length; BENCH_PAGE_LINES changes it.
func logLines() int {
	n := 100_000
	if v := os.Getenv("BENCH_PAGE_LINES"); v != "" {
		fmt.Sscan(v, &n)
	}
	return n
}

// fakeRelay serves one run of n lines, as the relay's API does: the
// record, and the log as NDJSON, every line at once, then the end.
func fakeRelay(n int) *httptest.Server {
	started := time.Now().Add(-time.Hour)
	run := store.Run{ID: "run-long", Namespace: "paperclip", Job: "run-long", JobUID: "uid-long", Agent: "agent-long",
		Company: "acme", Phase: "Succeeded", StartedAt: &started, LastSeq: uint64(n), Done: true}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runs": []store.Run{run}})
	})
	mux.HandleFunc("GET /v1/runs/{run}", func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(run) })
	mux.HandleFunc("GET /v1/runs/{run}/log", func(w http.ResponseWriter, r *http.Request) {
		var after int
		fmt.Sscan(r.URL.Query().Get("after"), &after)
		w.Header().Set("Content-Type", "application/x-ndjson")
		ts := started
		for i := after + 1; i <= n; i++ {
			// An agent's stream-json lines: about 200 bytes each.
			text := fmt.Sprintf(`{"type":"assistant","message":{"content":[{"type":"text","text":"step %d: reading pkg/foo/bar_%d.go and running the tests again"}]}}`, i, i%97)
			l := store.Line{Seq: uint64(i), TS: ts.Add(time.Duration(i) * time.Millisecond), Container: "agent", Line: text}
			data, _ := json.Marshal(struct {
				Type string `json:"type"`
				store.Line
			}{"line", l})
			fmt.Fprintf(w, "%s\n", data)
		}
		fmt.Fprintf(w, "{\"type\":\"end\",\"phase\":\"Succeeded\",\"exitCode\":0,\"lastSeq\":%d}\n", n)
	})
	return httptest.NewServer(mux)
}

// BenchmarkRunsPageLongLog opens a run of logLines() lines in the page
// and reports, per opening: ms until every line arrived and was drawn,
// the longest main-thread task meanwhile (what a person feels as a
// freeze), a search over every line, a redraw after jumping to the
// middle, and the page's JavaScript heap.
func BenchmarkRunsPageLongLog(b *testing.B) {
	n := logLines()
	relay := fakeRelay(n)
	defer relay.Close()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "paperclip", Name: "run-long", UID: "uid-long",
		CreationTimestamp: metav1.Now(), Labels: map[string]string{contract.LabelAgentID: "agent-long", contract.LabelRunID: "run-long", contract.LabelCompanyID: "acme"}},
		Status: batchv1.JobStatus{Succeeded: 1}}
	kube := fake.NewClientset(job)
	kube.PrependReactor("create", "selfsubjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authzv1.SelfSubjectAccessReview{Status: authzv1.SubjectAccessReviewStatus{Allowed: true}}, nil
	})
	tokenFile := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("token"), 0o600); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &dashboard.Server{Kube: kube, Namespaces: []string{"paperclip"}, Hosts: dashboard.HostsFor(ln.Addr().String()),
		Relay: &dashboard.Relay{URL: relay.URL, TokenFile: tokenFile, HTTP: relay.Client()}}
	srv := &http.Server{Handler: s.Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	page := "http://" + ln.Addr().String() + "/"

	br := harness.NewBrowser(b, 1280, 900, "UTC")
	var load, longest, search, jump, heap float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		br.Do(chromedp.Navigate(page + "#x=" + fmt.Sprint(i)))
		harness.Wait(br, "the runs", `document.querySelectorAll('#runs tbody tr').length`, func(n int) bool { return n == 1 })
		raw, err := br.Eval(`new Promise((done) => {
			let longest = 0;
			new PerformanceObserver((l) => { for (const e of l.getEntries()) longest = Math.max(longest, e.duration); }).observe({type: "longtask"});
			const t0 = performance.now();
			location.hash = "#run=paperclip/run-long";
			const poll = () => {
				if (open && open.ended && document.querySelectorAll('#log .line').length > 0) {
					requestAnimationFrame(() => done({load: performance.now() - t0, longest, lines: open.lines.length}));
				} else setTimeout(poll, 5);
			};
			poll();
		})`, chromedp.EvalAwaitPromise)
		if err != nil {
			b.Fatal(err)
		}
		var m struct {
			Load, Longest float64
			Lines         int
		}
		if err := json.Unmarshal(raw, &m); err != nil || m.Lines != n {
			b.Fatalf("the page holds %d lines, want %d (%v): %s", m.Lines, n, err, raw)
		}
		raw, err = br.Eval(`(() => {
			let t = performance.now(); setQuery("bar_42.go"); const search = performance.now() - t;
			const matched = open.matches.length; setQuery("");
			$("follow").checked = false;
			t = performance.now(); $("log").scrollTop = $("log").scrollHeight / 2; drawLog(false); const jump = performance.now() - t;
			return {search, jump, matched, heap: performance.memory ? performance.memory.usedJSHeapSize / 1048576 : 0};
		})()`)
		if err != nil {
			b.Fatal(err)
		}
		var r struct {
			Search, Jump, Heap float64
			Matched            int
		}
		if err := json.Unmarshal(raw, &r); err != nil || r.Matched == 0 {
			b.Fatalf("the search matched nothing (%v): %s", err, raw)
		}
		load, longest, search, jump, heap = load+m.Load, longest+m.Longest, search+r.Search, jump+r.Jump, heap+r.Heap
	}
	per := float64(b.N)
	b.ReportMetric(load/per, "ms-load")
	b.ReportMetric(longest/per, "ms-longest-task")
	b.ReportMetric(search/per, "ms-search")
	b.ReportMetric(jump/per, "ms-jump")
	b.ReportMetric(heap/per, "MiB-js-heap")
}
