package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

func benchStore(b *testing.B, opts ...postgres.Options) *postgres.Store {
	conn, schema := pgtest.Schema(b)
	var o postgres.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	o.ConnString, o.Schema = conn, schema
	s, err := postgres.Open(context.Background(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

var benchLine = `{"type":"assistant","message":{"id":"msg_01","content":[{"type":"text","text":"` + strings.Repeat("x", 300) + `"}]}}`

// BenchmarkAppend commits batches of 64 stream-json-sized lines with their
// cursor, one transaction per batch, as bbolt's BenchmarkStoreAppend does
// (the throwaway server does not fsync: this is the relay's side).
func BenchmarkAppend(b *testing.B) {
	s := benchStore(b)
	batch := make([]store.Line, 64)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchLine) * len(batch)))
	i := 0
	prev := store.Cursor{}
	for b.Loop() {
		for j := range batch {
			batch[j] = store.Line{TS: time.Unix(0, int64(i*64+j)), Container: "agent", Line: benchLine}
		}
		cur := store.Cursor{TS: int64(i*64 + 63), Count: 1}
		if _, err := s.AppendAfter("run-1", "stream", prev, cur, batch, time.Now()); err != nil {
			b.Fatal(err)
		}
		prev = cur
		i++
	}
}

// BenchmarkAppendManyStreams is many followers at once, each its own run
// and stream, each committing batches of 16 lines.
func BenchmarkAppendManyStreams(b *testing.B) {
	s := benchStore(b)
	var streams atomic.Int64
	b.SetBytes(int64(len(benchLine) * 16))
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		run := fmt.Sprintf("run-%d", streams.Add(1))
		batch := make([]store.Line, 16)
		prev, i := store.Cursor{}, 0
		for pb.Next() {
			for j := range batch {
				batch[j] = store.Line{TS: time.Unix(0, int64(i*16+j)), Container: "agent", Line: benchLine}
			}
			cur := store.Cursor{TS: int64(i*16 + 15), Count: 1}
			if _, err := s.AppendAfter(run, "stream", prev, cur, batch, time.Now()); err != nil {
				b.Error(err)
				return
			}
			prev = cur
			i++
		}
	})
}

// BenchmarkAppendCaughtUp is the steady phase of a large fleet: 64
// followers that have caught up, each committing every line as it comes.
// "grouped" is the store as the relay opens it (group commit); "alone"
// commits each append in its own transaction (MaxGroup 1), as the store
// did before, the baseline.
func BenchmarkAppendCaughtUp(b *testing.B) {
	for _, c := range []struct {
		name string
		o    postgres.Options
	}{{"grouped", postgres.Options{}}, {"alone", postgres.Options{MaxGroup: 1, CommitFlights: 4}}} {
		b.Run(c.name, func(b *testing.B) {
			s := benchStore(b, c.o)
			var streams atomic.Int64
			b.SetBytes(int64(len(benchLine)))
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				run := fmt.Sprintf("run-%d", streams.Add(1))
				prev, i := store.Cursor{}, 0
				for pb.Next() {
					cur := store.Cursor{TS: int64(i + 1), Count: 1}
					line := []store.Line{{TS: time.Unix(0, int64(i)), Container: "agent", Line: benchLine}}
					if _, err := s.AppendAfter(run, "stream", prev, cur, line, time.Now()); err != nil {
						b.Error(err)
						return
					}
					prev = cur
					i++
				}
			})
		})
	}
}

// BenchmarkRunsOf10000 lists one agent's runs among 10,000 (GET /v1/runs?agent=,
// selected by the query).
func BenchmarkRunsOf10000(b *testing.B) {
	s := benchStore(b)
	for i := range 10_000 {
		if _, err := s.UpdateRun(fmt.Sprintf("history-%05d", i), func(r *store.Run) {
			r.Namespace, r.Agent, r.Company, r.Phase, r.Done = "paperclip", fmt.Sprintf("agent-%03d", i%500), "acme", "Succeeded", true
			r.LastSeq, r.Bytes, r.SeenAt = 400, 120000, time.Now().Add(-time.Duration(i)*time.Minute)
		}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		runs, err := s.RunsWhere(store.Filter{Agent: "agent-007"})
		if err != nil || len(runs) != 20 {
			b.Fatalf("%d runs (%v)", len(runs), err)
		}
	}
}

// BenchmarkReadPage reads a page of 1,000 lines from a run of 20,000.
func BenchmarkReadPage(b *testing.B) {
	s := benchStore(b)
	batch := make([]store.Line, 1000)
	prev := store.Cursor{}
	for k := range 20 {
		for j := range batch {
			batch[j] = store.Line{TS: time.Unix(0, int64(k*1000+j)), Container: "agent", Line: benchLine}
		}
		cur := store.Cursor{TS: int64(k*1000 + 999), Count: 1}
		if _, err := s.AppendAfter("run-1", "stream", prev, cur, batch, time.Now()); err != nil {
			b.Fatal(err)
		}
		prev = cur
	}
	b.SetBytes(int64(1000 * len(benchLine)))
	for b.Loop() {
		page, err := storetest.RawLines(s, "run-1", 10_000, 1000)
		if err != nil || len(page) != 1000 {
			b.Fatalf("%d lines (%v)", len(page), err)
		}
	}
}
