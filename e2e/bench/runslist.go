package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
)

// listRunsTarget is the bound on GET /v1/runs over 10,000 runs.
const listRunsTarget = 50 * time.Millisecond

type listTiming struct {
	query    string
	p50, max time.Duration
	runs     int
}

// addFinishedRuns writes n finished runs with results into the store in
// dataDir (the relay stopped), as months of agent runs leave it.
func addFinishedRuns(dataDir string, n int) error {
	s, err := bolt.Open(dataDir)
	if err != nil {
		return err
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	next := make(chan int)
	for range 64 { // concurrent writers share commits
		wg.Go(func() {
			for i := range next {
				id := fmt.Sprintf("history-%05d", i)
				cost := 0.42
				_, err := s.UpdateRun(id, func(r *store.Run) {
					r.Namespace, r.Agent, r.Company, r.Phase, r.Job = "paperclip", fmt.Sprintf("history-agent-%03d", i%500), "acme", "Succeeded", id
					r.Containers, r.MainContainer, r.Adapter, r.Session = []string{"agent"}, "agent", "claude_local", "sess-"+id
					r.Done, r.LastSeq, r.Bytes, r.SeenAt = true, 400, 120000, time.Now().Add(-time.Duration(i)*time.Minute)
					r.Result = &result.Result{Outcome: "succeeded", SessionID: "sess-" + id, CostUSD: &cost, Text: "Fixed the failing test and opened a pull request."}
				})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// timeListRuns times GET /v1/runs as a client sees it (TLS, the token's
// review and access check included).
func timeListRuns(client *http.Client, addr, token, query string, times int) (listTiming, error) {
	t := listTiming{query: query}
	var ds []time.Duration
	for range times {
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/v1/runs"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return t, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return t, err
		}
		if resp.StatusCode != http.StatusOK {
			return t, fmt.Errorf("GET /v1/runs%s: %s: %s", query, resp.Status, body)
		}
		ds = append(ds, time.Since(start))
		t.runs = countRuns(body)
	}
	slices.Sort(ds)
	t.p50, t.max = ds[len(ds)/2], ds[len(ds)-1]
	return t, nil
}

func countRuns(body []byte) int {
	n := 0
	for i := 0; i+5 < len(body); i++ {
		if string(body[i:i+5]) == `"id":` {
			n++
		}
	}
	return n
}
