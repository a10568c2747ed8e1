package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

func openInternal(t *testing.T, o Options) *Store {
	t.Helper()
	conn, schema := pgtest.Schema(t)
	o.ConnString, o.Schema = conn, schema
	s, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func req(run, stream string, prev, cur store.Cursor, lines ...string) *appendReq {
	r := &appendReq{run: run, stream: stream, prev: prev, cur: cur, now: time.Now(), done: make(chan struct{})}
	for i, l := range lines {
		r.lines = append(r.lines, store.Line{TS: time.Unix(int64(cur.TS), int64(i)), Container: "agent", Line: l})
	}
	return r
}

func storedLines(t *testing.T, s *Store, run string) []string {
	t.Helper()
	ls, err := store.Lines(s, run, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, l := range ls {
		if l.Seq != uint64(i+1) {
			t.Errorf("run %s: line %d has seq %d", run, i, l.Seq)
		}
		out = append(out, l.Line)
	}
	return out
}

// One transaction commits several streams' appends, each checked against
// its own stream's cursor: an append whose prev is stale gets its
// CursorConflict and writes nothing, while the others, of its run and of
// another, commit with their runs' sequence numbers following on.
func TestAGroupChecksEachAppendAgainstItsOwnCursor(t *testing.T) {
	s := openInternal(t, Options{})
	if _, err := s.AppendAfter("run-1", "b", store.Cursor{}, store.Cursor{TS: 5, Count: 1}, []store.Line{{Container: "agent", Line: "b0"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := req("run-1", "a", store.Cursor{}, store.Cursor{TS: 10, Count: 1}, "a1", "a2")
	stale := req("run-1", "b", store.Cursor{TS: 4, Count: 1}, store.Cursor{TS: 11, Count: 1}, "b-stale")
	c := req("run-2", "a", store.Cursor{}, store.Cursor{TS: 12, Count: 1}, "c1")
	d := req("run-1", "d", store.Cursor{}, store.Cursor{TS: 13, Count: 1}, "d1")
	s.commitGroup([]*appendReq{d, stale, c, a})
	for _, r := range []*appendReq{a, stale, c, d} {
		<-r.done
	}
	var conflict *store.CursorConflict
	if !errors.As(stale.err, &conflict) || conflict.Stored != (store.Cursor{TS: 5, Count: 1}) {
		t.Fatalf("the stale append: %v, want a CursorConflict naming the stored cursor 5/1", stale.err)
	}
	for _, r := range []*appendReq{a, c, d} {
		if r.err != nil {
			t.Fatalf("append to %s/%s: %v", r.run, r.stream, r.err)
		}
	}
	// Sorted by stream within the run: a's lines, then d's.
	if got := fmt.Sprint(storedLines(t, s, "run-1")); got != "[b0 a1 a2 d1]" {
		t.Errorf("run-1 holds %s", got)
	}
	if a.last != 3 || d.last != 4 || c.last != 1 {
		t.Errorf("last seqs a=%d d=%d c=%d, want 3, 4, 1", a.last, d.last, c.last)
	}
	if got := fmt.Sprint(storedLines(t, s, "run-2")); got != "[c1]" {
		t.Errorf("run-2 holds %s", got)
	}
	for _, r := range []*appendReq{a, c, d} {
		if cur, err := s.Cursor(r.run, r.stream); err != nil || cur != r.cur {
			t.Errorf("cursor of %s/%s is %v (%v), want %v", r.run, r.stream, cur, err, r.cur)
		}
	}
	if cur, _ := s.Cursor("run-1", "b"); cur != (store.Cursor{TS: 5, Count: 1}) {
		t.Errorf("the stale append moved its cursor to %v", cur)
	}
}

// An append PostgreSQL refuses (a stream name that is not UTF-8) fails the
// group's transaction; the others are then committed alone, and only it
// fails.
func TestOneRefusedAppendFailsOnlyItself(t *testing.T) {
	s := openInternal(t, Options{})
	good := req("run-1", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, "kept")
	bad := req("run-1", "\xff\xfe", store.Cursor{}, store.Cursor{TS: 2, Count: 1}, "refused")
	other := req("run-2", "a", store.Cursor{}, store.Cursor{TS: 3, Count: 1}, "kept too")
	s.commitGroup([]*appendReq{good, bad, other})
	if bad.err == nil {
		t.Fatal("the append PostgreSQL cannot store was answered as committed")
	}
	if good.err != nil || other.err != nil {
		t.Fatalf("the other appends failed with it: %v; %v", good.err, other.err)
	}
	if got := fmt.Sprint(storedLines(t, s, "run-1")); got != "[kept]" {
		t.Errorf("run-1 holds %s", got)
	}
	if got := fmt.Sprint(storedLines(t, s, "run-2")); got != "[kept too]" {
		t.Errorf("run-2 holds %s", got)
	}
}

// A group takes at most one append of a stream, in arrival order: the
// stream's next append names the first's cursor as prev, so it waits for
// the next group. An empty queue ends the flight.
func TestAGroupTakesOneAppendPerStream(t *testing.T) {
	c := committer{flights: 1}
	a1, a2 := req("r", "a", store.Cursor{}, store.Cursor{TS: 1}), req("r", "a", store.Cursor{TS: 1}, store.Cursor{TS: 2})
	b, other := req("r", "b", store.Cursor{}, store.Cursor{TS: 1}), req("r2", "a", store.Cursor{}, store.Cursor{TS: 1})
	c.pending = []*appendReq{a1, a2, b, other}
	if g := c.take(2); len(g) != 2 || g[0] != a1 || g[1] != b {
		t.Fatalf("first group %v, want a1 and b (at most 2, one of stream a)", g)
	}
	if g := c.take(10); len(g) != 2 || g[0] != a2 || g[1] != other {
		t.Fatalf("second group %v, want a2 and the other run's", g)
	}
	if g := c.take(10); g != nil || c.flights != 0 {
		t.Fatalf("an empty queue gave %v and left %d flights", g, c.flights)
	}
}

// Appends that arrive while every flight is busy commit together, in one
// transaction, and each caller gets its own last sequence number.
func TestAppendsWaitingForAFlightCommitAsOne(t *testing.T) {
	s := openInternal(t, Options{CommitFlights: 1})
	s.commits.mu.Lock()
	s.commits.flights = 1 // a flight is busy: the appends below queue
	s.commits.mu.Unlock()
	before := commitsObserved(t)
	const n = 40
	var wg sync.WaitGroup
	lasts := make([]uint64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			lasts[i], errs[i] = s.AppendAfter("run-1", fmt.Sprintf("s%02d", i), store.Cursor{}, store.Cursor{TS: int64(i + 1), Count: 1},
				[]store.Line{{Container: "agent", Line: fmt.Sprintf("line %02d", i)}}, time.Now())
		})
	}
	deadline := time.Now().Add(time.Minute)
	for {
		s.commits.mu.Lock()
		queued := len(s.commits.pending)
		s.commits.mu.Unlock()
		if queued == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d appends queued in a minute", queued, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.fly() // the busy flight takes the queue
	wg.Wait()
	after := commitsObserved(t)
	if got := after.GetSampleCount() - before.GetSampleCount(); got != 1 {
		t.Errorf("%d transactions, want 1", got)
	}
	if got := after.GetSampleSum() - before.GetSampleSum(); got != n {
		t.Errorf("%v appends committed, want %d", got, n)
	}
	seen := map[uint64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		seen[lasts[i]] = true
	}
	if len(seen) != n || len(storedLines(t, s, "run-1")) != n {
		t.Errorf("%d distinct last seqs and %d lines stored, want %d of each", len(seen), len(storedLines(t, s, "run-1")), n)
	}
}

func commitsObserved(t *testing.T) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := appendsPerCommit.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}

// A group that fails for no fault of one append's data (here a run's row
// another holds locked past the store's Timeout) fails every append at
// once, each follower going on from its stored cursor. Tried again alone,
// one after the other, each with the whole Timeout, it kept the other
// runs' appends waiting for as many timeouts as the group had appends (a
// hostile review): run-2's append would have committed, late.
func TestAGroupThatTimesOutFailsAtOnce(t *testing.T) {
	s := openInternal(t, Options{Timeout: time.Second})
	if _, err := s.AppendAfter("run-1", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, []store.Line{{Container: "agent", Line: "first"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holder, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, s.sql(`SELECT 1 FROM {schema}.runs WHERE id = 'run-1' FOR UPDATE`)); err != nil {
		t.Fatal(err)
	}
	locked := req("run-1", "b", store.Cursor{}, store.Cursor{TS: 2, Count: 1}, "waits")
	other := req("run-2", "a", store.Cursor{}, store.Cursor{TS: 3, Count: 1}, "healthy")
	s.commitGroup([]*appendReq{locked, other})
	if locked.err == nil || other.err == nil {
		t.Fatalf("appends of a group that timed out: %v; %v, want both failed", locked.err, other.err)
	}
	if ls, _ := store.Lines(s, "run-2", 0, 10); len(ls) != 0 {
		t.Errorf("run-2's append was committed alone after the group failed: %v", ls)
	}
	holder.Rollback(ctx)
	if _, err := s.AppendAfter("run-2", "a", store.Cursor{}, store.Cursor{TS: 3, Count: 1}, []store.Line{{Container: "agent", Line: "healthy"}}, time.Now()); err != nil {
		t.Errorf("run-2's follower, going on from its stored cursor: %v", err)
	}
}

// A stream whose append fails on its own data commits alone from then
// on, not failing every group it joins, until one of its appends
// commits.
func TestAStreamThatFailsOnItsDataCommitsAlone(t *testing.T) {
	s := openInternal(t, Options{})
	bad := req("run-1", "\xff\xfe", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, "refused")
	good := req("run-1", "a", store.Cursor{}, store.Cursor{TS: 2, Count: 1}, "kept")
	s.commitGroup([]*appendReq{bad, good})
	if bad.err == nil || good.err != nil {
		t.Fatalf("bad %v, good %v", bad.err, good.err)
	}
	c := &s.commits
	again := req("run-1", "\xff\xfe", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, "refused")
	if alone, fly := c.enqueue(again, 2); !alone || fly || len(c.pending) != 0 {
		t.Fatalf("the failing stream's next append: alone %v, starts a flight %v, %d pending; want it committed alone, not queued", alone, fly, len(c.pending))
	}
	g1 := req("run-2", "a", store.Cursor{}, store.Cursor{TS: 1})
	if alone, _ := c.enqueue(g1, 2); alone || len(c.pending) != 1 {
		t.Fatalf("another stream's append: alone %v, %d pending; want it queued for a group", alone, len(c.pending))
	}
	fixed := req("run-1", "\xff\xfe", store.Cursor{}, store.Cursor{TS: 1, Count: 1})
	c.setAlone([]*appendReq{fixed}, nil)
	if c.alone[fixed.key()] {
		t.Error("a stream whose append committed still commits alone")
	}
}

// Runs whose rows another transaction holds (a replica frozen mid-commit:
// its locks stay until its transaction ends) fail their appends at the
// lock_timeout, not the store's Timeout, and only theirs: the healthy
// streams of the group commit. Their streams then commit alone, on their
// callers' goroutines: with every flight busy, an append of such a stream
// is still answered, where queued it would wait for a flight that two
// locked streams retrying could hold for good (a hostile review).
func TestRunsAnotherHoldsLockedFailOnlyTheirOwnAppends(t *testing.T) {
	s := openInternal(t, Options{LockTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	for _, run := range []string{"frozen-1", "frozen-2"} {
		if _, err := s.AppendAfter(run, "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, []store.Line{{Container: "agent", Line: "before"}}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, s.sql(`SELECT 1 FROM {schema}.runs WHERE id LIKE 'frozen-%' FOR UPDATE`)); err != nil {
		t.Fatal(err)
	}
	l1 := req("frozen-1", "a", store.Cursor{TS: 1, Count: 1}, store.Cursor{TS: 2, Count: 1}, "after")
	h1 := req("healthy-1", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, "kept")
	l2 := req("frozen-2", "a", store.Cursor{TS: 1, Count: 1}, store.Cursor{TS: 2, Count: 1}, "after")
	h2 := req("healthy-2", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, "kept")
	s.commitGroup([]*appendReq{l1, h1, l2, h2})
	if h1.err != nil || h2.err != nil {
		t.Fatalf("healthy appends in the group: %v; %v", h1.err, h2.err)
	}
	for _, r := range []*appendReq{l1, l2} {
		if !appendDataError(r.err) || !s.commits.alone[r.key()] {
			t.Errorf("append to locked run %s: %v (alone %v), want the lock's refusal and its stream committing alone", r.run, r.err, s.commits.alone[r.key()])
		}
	}
	s.commits.mu.Lock()
	s.commits.flights = s.opts.CommitFlights // every flight busy
	s.commits.mu.Unlock()
	_, err = s.AppendAfter("frozen-1", "a", store.Cursor{TS: 1, Count: 1}, store.Cursor{TS: 2, Count: 1}, []store.Line{{Container: "agent", Line: "after"}}, time.Now())
	if !appendDataError(err) {
		t.Errorf("an append of a locked run's stream with every flight busy: %v, want the lock's refusal", err)
	}
	holder.Rollback(ctx)
	if _, err := s.AppendAfter("frozen-1", "a", store.Cursor{TS: 1, Count: 1}, store.Cursor{TS: 2, Count: 1}, []store.Line{{Container: "agent", Line: "after"}}, time.Now()); err != nil {
		t.Errorf("once the lock is let go: %v", err)
	}
	if s.commits.alone[streamKey{"frozen-1", "a"}] {
		t.Error("a stream whose append committed still commits alone")
	}
}

// TestTheServerEndsAFrozenRelaysTransaction: a relay that stops answering
// in the middle of a transaction (frozen, or its node cut off with the
// connection open) has it ended by the server after IdleInTransaction,
// letting go of its rows' locks.
func TestTheServerEndsAFrozenRelaysTransaction(t *testing.T) {
	s := openInternal(t, Options{IdleInTransaction: 300 * time.Millisecond})
	ctx := context.Background()
	if _, err := s.AppendAfter("run-1", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, []store.Line{{Container: "agent", Line: "x"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	frozen, err := s.pool.Begin(ctx) // a connection of the store's own, with its settings
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Rollback(ctx)
	if _, err := frozen.Exec(ctx, s.sql(`SELECT 1 FROM {schema}.runs WHERE id = 'run-1' FOR UPDATE`)); err != nil {
		t.Fatal(err)
	}
	// Another relay taking the run over: its write goes through once the
	// server has ended the quiet transaction.
	if _, err := s.AppendAfter("run-1", "b", store.Cursor{}, store.Cursor{TS: 2, Count: 1}, []store.Line{{Container: "agent", Line: "y"}}, time.Now()); err != nil {
		// The lock_timeout (5 s) may come first on a busy machine: the
		// follower tries again, as here.
		if !appendDataError(err) {
			t.Fatal(err)
		}
		if _, err := s.AppendAfter("run-1", "b", store.Cursor{}, store.Cursor{TS: 2, Count: 1}, []store.Line{{Container: "agent", Line: "y"}}, time.Now()); err != nil {
			t.Fatalf("after the server ended the frozen transaction: %v", err)
		}
	}
	if _, err := frozen.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the frozen relay's transaction is still open")
	}
}
