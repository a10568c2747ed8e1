package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

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
			settle(t)
			// The first commit the reader waits on begins the tail, and
			// the reader's query after it finds the run running.
			ch := s.Changed("run-1")
			appendLines("begins the tail")
			begun, _, _ := readNext(s, ch, uint64(len(stored)))
			stored = append(stored, begun...)
			after := uint64(len(stored))
			ch = s.Changed("run-1") // waiting when the lines commit
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
	for _, text := range []string{"fourth", "fifth"} {
		ch := b.Changed("run-1")
		appendLines(text)
		got, _, queried := readNext(b, ch, uint64(len(stored)))
		if len(got) != 1 || text == "fifth" && queried {
			t.Fatalf("the %s line: %q, queried %v", text, got, queried)
		}
		stored = append(stored, got...)
	}
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
