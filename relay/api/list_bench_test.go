package api

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// BenchmarkListRuns is GET /v1/runs over a store of 10,000 finished runs
// (each with a result, as a finished run has) and a few running ones:
// the adapter's re-attach query (one agent's running run) and the whole
// list. Issue target: under 50 ms with 10,000 runs.
func BenchmarkListRuns(b *testing.B) {
	s, _ := storetest.Open(b)
	// Concurrent writers share commits (and fsyncs): setting up 10,000
	// runs one commit each would take a minute.
	var wg sync.WaitGroup
	next := make(chan int)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				put(b, s, i)
			}
		})
	}
	for i := range 10000 {
		next <- i
	}
	close(next)
	wg.Wait()
	srv := httptest.NewServer((&API{Store: s, Auth: tokenAuth{}}).Handler())
	b.Cleanup(srv.Close)
	for _, q := range []struct{ name, query string }{
		{"agent-running", "?agent=agent-000&phase=Running"},
		{"all", ""},
	} {
		b.Run(q.name, func(b *testing.B) {
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/runs"+q.query, nil)
				req.Header.Set("Authorization", "Bearer reader")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}

// put stores one finished (or, one in a thousand, running) run with a
// result, as the relay keeps them.
func put(b *testing.B, s *bolt.Store, i int) {
	cost := 0.42
	id := fmt.Sprintf("run-%05d", i)
	phase := "Succeeded"
	if i%1000 == 0 {
		phase = "Running"
	}
	if _, err := s.UpdateRun(id, func(r *store.Run) {
		r.Namespace, r.Agent, r.Company, r.Phase, r.Job = "paperclip", fmt.Sprintf("agent-%03d", i%500), "acme", phase, id
		r.Containers, r.MainContainer, r.Adapter, r.Session = []string{"agent"}, "agent", "claude_local", "sess-"+id
		r.Done, r.LastSeq, r.Bytes, r.SeenAt = phase != "Running", 400, 60000, time.Now()
		r.Result = &result.Result{Outcome: "succeeded", SessionID: "sess-" + id, CostUSD: &cost, Text: "Fixed the failing test in pkg/foo and opened a pull request."}
	}); err != nil {
		b.Error(err)
	}
}
