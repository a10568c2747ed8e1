package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// BenchmarkFollowersOnPostgreSQL is the flood as the API serves it: 100
// runs on PostgreSQL, each followed by an SSE client over TLS, committed
// 24 lines at a time (the fleet's appends in the flood), with the
// process's CPU per line (commits and serving; the server's is its own).
func BenchmarkFollowersOnPostgreSQL(b *testing.B) {
	const runs, appends, per = 100, 20, 24
	srv, err := pgtest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	texts := make([]string, per)
	for i := range texts {
		texts[i] = `{"type":"bench","i":` + fmt.Sprint(i) + `,"text":"` + strings.Repeat("x", 250) + `"}`
	}
	var cpu time.Duration
	for b.Loop() {
		s, err := postgres.Open(context.Background(), postgres.Options{ConnString: srv.ConnString("postgres"), Schema: fmt.Sprintf("bench_%d", time.Now().UnixNano())})
		if err != nil {
			b.Fatal(err)
		}
		web := httptest.NewTLSServer((&API{Store: s, Auth: tokenAuth{}, Keepalive: time.Minute}).Handler())
		var clients sync.WaitGroup
		for r := range runs {
			run := fmt.Sprintf("run-%d", r)
			_, _ = s.UpdateRun(run, func(r *store.Run) { r.Namespace, r.Phase = "paperclip", "Running" })
			req, _ := http.NewRequest(http.MethodGet, web.URL+"/v1/runs/"+run+"/log", nil)
			req.Header.Set("Authorization", "Bearer reader")
			req.Header.Set("Accept", "text/event-stream")
			resp, err := web.Client().Do(req)
			if err != nil {
				b.Fatal(err)
			}
			clients.Go(func() { _, _ = io.Copy(io.Discard, resp.Body); resp.Body.Close() })
		}
		cpu -= cpuTime() // the clients connected: their TLS handshakes are not the relay's per line
		var writers sync.WaitGroup
		for r := range runs {
			writers.Go(func() {
				run := fmt.Sprintf("run-%d", r)
				prev := store.Cursor{}
				for i := range appends {
					cur := store.Cursor{TS: int64(i + 1), Count: 1}
					if _, err := s.AppendAfter(run, "st", prev, cur, storetest.Lines("agent", texts...), time.Now()); err != nil {
						b.Error(err)
						return
					}
					prev = cur
				}
				_, _ = s.UpdateRun(run, func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" })
			})
		}
		writers.Wait()
		clients.Wait()
		cpu += cpuTime()
		web.Close()
		s.Close()
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*runs*appends*per), "cpu-ns/line")
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
