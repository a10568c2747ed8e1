package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// openPair opens two stores on one schema, as two replicas do.
func openPair(t *testing.T) (a, b *Store) {
	t.Helper()
	conn, schema := pgtest.Schema(t)
	for _, s := range []**Store{&a, &b} {
		var err error
		if *s, err = Open(context.Background(), Options{ConnString: conn, Schema: schema}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (*s).Close() })
	}
	return a, b
}

func waitWoken(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute): // far above any stall of a loaded machine
		t.Fatalf("not woken: %s", what)
	}
}

// TestACaughtUpReaderIsServedWithoutAQuery: a reader waiting on a run, on
// the replica that commits its lines or on another, reads the committed
// lines from the store's memory (no connection taken from the pool), as
// the store would have read them; a change of the run's record (its end)
// is read from the database.
func TestACaughtUpReaderIsServedWithoutAQuery(t *testing.T) {
	a, b := openPair(t)
	cur := store.Cursor{}
	appendLines := func(texts ...string) {
		t.Helper()
		next := store.Cursor{TS: cur.TS + 1, Count: 1}
		var lines []store.Line
		for _, text := range texts {
			lines = append(lines, store.Line{TS: time.Unix(0, next.TS), Container: "agent", Line: text})
		}
		if _, err := a.AppendAfter("run-1", "agent", cur, next, lines, time.Now()); err != nil {
			t.Fatal(err)
		}
		cur = next
	}
	appendLines("first")
	page := func(s *Store, after uint64) (got []string, last uint64, done bool, queried bool) {
		t.Helper()
		before := s.pool.Stat().AcquireCount()
		last, done, found, err := s.Page("run-1", after, 100, func(l store.RawLine) { got = append(got, string(l.JSON)) })
		if err != nil || !found {
			t.Fatalf("page: found %v, %v", found, err)
		}
		return got, last, done, s.pool.Stat().AcquireCount() != before
	}
	// readNext waits on ch, then reads the lines after the cursor, as a
	// caught-up reader does (woken by a commit it already read, it waits
	// again).
	readNext := func(s *Store, ch <-chan struct{}, after uint64) (got []string, last uint64, queried bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			select {
			case <-ch:
			case <-time.After(time.Second):
			}
			ch = s.Changed("run-1")
			if got, last, _, queried = page(s, after); len(got) > 0 {
				return got, last, queried
			}
		}
		t.Fatalf("no line after %d in a minute", after)
		return nil, 0, false
	}
	stored, _, _, _ := page(b, 0)
	// settle waits until the other replica heard every earlier commit: a
	// reader woken by a commit it did not wait for reads what is stored
	// by then, from the database, which is right but not what is tested.
	// The notifications of one relay arrive in order.
	barrier := 0
	settle := func(t *testing.T) {
		t.Helper()
		barrier++
		run := fmt.Sprint("barrier-", barrier)
		ch := b.Changed(run)
		if _, err := a.UpdateRun(run, func(*store.Run) {}); err != nil {
			t.Fatal(err)
		}
		waitWoken(t, ch, "the barrier")
	}
	for name, s := range map[string]*Store{"the committing replica": a, "another replica": b} {
		t.Run(name, func(t *testing.T) {
			after := uint64(len(stored))
			settle(t)
			ch := s.Changed("run-1") // waiting when the lines commit
			appendLines("second", "third")
			got, last, queried := readNext(s, ch, after)
			if queried || last != after+2 || len(got) != 2 {
				t.Fatalf("after %d: %d lines, last %d, queried %v; want the 2 committed, from memory", after, len(got), last, queried)
			}
			// What the database holds for them, byte for byte.
			s.tails.dropAll()
			want, _, _, _ := page(s, after)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("served %q, the database holds %q", got, want)
			}
			stored = append(stored, got...)
		})
	}
	// The other replica's reader holds the run's tail when the run ends.
	settle(t)
	ch := b.Changed("run-1")
	appendLines("fourth")
	if got, _, queried := readNext(b, ch, uint64(len(stored))); len(got) != 1 || queried {
		t.Fatalf("the fourth line: %q, queried %v", got, queried)
	}
	stored = append(stored, "fourth")
	if _, err := a.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ch := b.Changed("run-1")
		if _, _, done, _ := page(b, uint64(len(stored))); done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a minute after the run ended, the other replica's reader still reads it running: its tail outlived the record's change")
		}
		select {
		case <-ch:
		case <-time.After(time.Second):
		}
	}
}

// TestReadersOfARunTwoReplicasWriteAtOnceSeeEveryLineOnce: two replicas
// commit lines to one run at once (two streams, as in a takeover), and
// readers on each and on a third follow it as the API does (wait, page,
// repeat): each reads every line once, in order, as stored, whichever
// mix of memory and queries served it.
func TestReadersOfARunTwoReplicasWriteAtOnceSeeEveryLineOnce(t *testing.T) {
	a, b := openPair(t)
	c, err := Open(context.Background(), a.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const each = 300
	var writers sync.WaitGroup
	for i, s := range []*Store{a, b} {
		writers.Go(func() {
			cur := store.Cursor{}
			for n := range each {
				next := store.Cursor{TS: cur.TS + 1, Count: 1}
				line := []store.Line{{TS: time.Unix(0, next.TS), Container: "agent", Line: fmt.Sprintf("writer %d line %d", i, n)}}
				if _, err := s.AppendAfter("run-1", fmt.Sprint("stream-", i), cur, next, line, time.Now()); err != nil {
					t.Error(err)
					return
				}
				cur = next
			}
		})
	}
	follow := func(s *Store) []string {
		var got []string
		deadline := time.Now().Add(2 * time.Minute)
		for len(got) < 2*each && time.Now().Before(deadline) {
			ch := s.Changed("run-1")
			n := 0
			if _, _, _, err := s.Page("run-1", uint64(len(got)), 50, func(l store.RawLine) {
				if l.Seq != uint64(len(got)+1) {
					t.Errorf("line %d read after %d", l.Seq, len(got))
				}
				got, n = append(got, string(l.JSON)), n+1
			}); err != nil {
				t.Error(err)
				return got
			}
			if n == 0 {
				select {
				case <-ch:
				case <-time.After(time.Second): // a missed wake is caught by the count below
				}
			}
		}
		return got
	}
	results := make([][]string, 3)
	var readers sync.WaitGroup
	for i, s := range []*Store{a, b, c} {
		readers.Go(func() { results[i] = follow(s) })
	}
	writers.Wait()
	readers.Wait()
	var want []string
	c.tails.dropAll()
	if _, _, _, err := c.Page("run-1", 0, 1000, func(l store.RawLine) { want = append(want, string(l.JSON)) }); err != nil {
		t.Fatal(err)
	}
	if len(want) != 2*each {
		t.Fatalf("%d lines stored, want %d", len(want), 2*each)
	}
	for i, got := range results {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("reader %d read %d lines, not the %d stored as stored", i, len(got), len(want))
		}
	}
}

// TestLinesAnotherRoleNotifiesAreNotServed: a role that shares the
// relays' database but is not theirs notifies on their channel, carrying
// a line no agent wrote for a run a reader follows. The reader is woken
// and queries: it reads what is stored, never the forged line.
func TestLinesAnotherRoleNotifiesAreNotServed(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s, err := Open(context.Background(), Options{ConnString: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	line := []store.Line{{TS: time.Unix(0, 1), Container: "agent", Line: "stored"}}
	if _, err := s.AppendAfter("run-1", "agent", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, line, time.Now()); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	num, _, _ := strings.Cut(schema, "_") // "t<n>", unique on the server
	role := num + "_intruder"             // roles are the server's, shared by every test
	if _, err := admin.Exec(context.Background(), `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	intruder, err := pgx.Connect(context.Background(), strings.Replace(conn, "user=clipjob", "user="+role, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		intruder.Close(context.Background())
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	}()
	ch := s.Changed("run-1")
	forged := "!someone\nrun-1\n\x012 " + `{"seq":2,"ts":"2026-01-01T00:00:00Z","container":"agent","line":"forged"}`
	if _, err := intruder.Exec(context.Background(), `SELECT pg_notify($1, $2)`, schema, forged); err != nil {
		t.Fatal(err)
	}
	waitWoken(t, ch, "the intruder's notification")
	var got []string
	last, _, _, err := s.Page("run-1", 1, 100, func(l store.RawLine) { got = append(got, string(l.JSON)) })
	if err != nil || last != 1 || len(got) != 0 {
		t.Fatalf("after the intruder's notification: last %d, lines %q (%v); want last 1, no line", last, got, err)
	}
}
