package collect

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// The budget's rules: a stream takes a unit at a time and spends it line
// by line; waiters are granted in the order they came, when their unit
// fits, or when nothing is held at all (a line longer than the budget);
// a commit gives back its lines, an idle stream its credit too; a waiter
// whose session ends takes nothing, and a closed session gives back all.
func TestBudgetGrantsUnitsInOrder(t *testing.T) {
	b := newBudget(100, 40)
	never := context.Background()
	a1, a2, a3 := b.account(), b.account(), b.account()
	for range 4 {
		if !a1.take(never, 10) { // one unit: 40
			t.Fatal("a1 waited")
		}
	}
	if !a2.take(never, 10) { // 80
		t.Fatal("a2 waited")
	}
	if got := b.inUse(); got != 80 {
		t.Fatalf("in use %d, want 80: two units", got)
	}
	granted := make(chan string, 3)
	wait := func(name string, a *budgetAccount, n int64, ctx context.Context) {
		go func() {
			if a.take(ctx, n) {
				granted <- name
			} else {
				granted <- name + " stopped"
			}
		}()
	}
	wait("a1", a1, 10, never) // a unit more does not fit
	waitQueued(t, b, 1)
	ctx3, stop3 := context.WithCancel(context.Background())
	wait("a3", a3, 500, ctx3) // longer than the budget, behind a1
	waitQueued(t, b, 2)
	stop3()
	if got := <-granted; got != "a3 stopped" {
		t.Fatalf("%s, want a3's wait ended by its stop", got)
	}
	a1.give(40, false) // a1's committed lines: 40 in use, a1's unit fits
	if got := <-granted; got != "a1" {
		t.Fatalf("granted %s, want a1", got)
	}
	wait("a3", a3, 500, never)
	waitQueued(t, b, 1)
	a1.give(10, true) // a1 idle: its line and its credit back
	a2.give(10, false)
	select {
	case got := <-granted:
		t.Fatalf("granted %s while a2 holds its credit", got)
	case <-time.After(50 * time.Millisecond):
	}
	a2.close()
	if got := <-granted; got != "a3" {
		t.Fatalf("granted %s, want a3 once nothing is held", got)
	}
	if got := b.inUse(); got != 100 {
		t.Errorf("in use %d, want a3's line, longer than the budget, to take all of it", got)
	}
	a3.close()
	if got := b.inUse(); got != 0 {
		t.Errorf("in use %d after every stream gave back, want 0", got)
	}
	if a3.take(never, 1) {
		t.Error("a closed account took")
	}
}

// waitQueued waits until n takes wait.
func waitQueued(t *testing.T, b *budget, n int) {
	t.Helper()
	poll.WaitFor(t, func() bool { return b.waiting.Load() == int64(n) }, fmt.Sprintf("%d takes never waited", n))
}

// Streams whose commits stall hold the relay's budget of lines together,
// not BatchBytes each in their batches and as much read ahead: 20 streams
// read 2.8 MB ahead of a stalled store with 64 KiB batches before the
// budget, 20 times what one stream may hold.
func TestStreamsTogetherHoldTheBudget(t *testing.T) {
	const streams, lineBytes, batchBytes, budgetBytes = 20, 1 << 10, 64 << 10, 64 << 10
	s, _ := storetest.Open(t)
	held := &heldStore{Backend: s, release: make(chan struct{})}
	b := newBudget(budgetBytes, batchBytes)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	srcs := make([]*endlessLog, streams)
	for i := range srcs {
		srcs[i] = &endlessLog{text: strings.Repeat("y", lineBytes)}
		f := newFollower(t, s, nil)
		f.ref.Run = fmt.Sprintf("run-%d", i)
		f.c.Source, f.c.Store, f.c.budget = srcs[i], held, b
		f.state = func() containerState { return containerState{} }
		f.c.slots = make(chan struct{}, 1)
		f.c.Follow = DefaultFollowOptions()
		f.c.Follow.BatchBytes = batchBytes
		wg.Go(func() { f.run(ctx) })
	}
	read := func() (n int64) {
		for _, src := range srcs {
			n += src.read.Load()
		}
		return n
	}
	poll.WaitFor(t, func() bool { return held.waiting.Load() }, "no commit")
	var last int64 = -1
	poll.WaitFor(t, func() bool {
		n := read()
		time.Sleep(200 * time.Millisecond)
		stable := n == last
		last = n
		return stable
	}, "the streams never stopped reading")
	// Streams descheduled for those 200 ms on a busy machine look stopped
	// too: half a second more, and what they read by then counts.
	time.Sleep(500 * time.Millisecond)
	last = read()
	// The budget, and each stream's read buffer and the line it read
	// while waiting.
	if limit := int64(budgetBytes + streams*(readBufferBytes+2*lineBytes)); last > limit {
		t.Errorf("with commits stalled, %d streams read %d bytes ahead; want at most %d", streams, last, limit)
	}
	if got := b.inUse(); got > budgetBytes {
		t.Errorf("the streams hold %d bytes of the budget; want at most %d", got, budgetBytes)
	}
	close(held.release)
	poll.WaitFor(t, func() bool { return held.commits.Load() >= 10*streams }, "commits did not resume")
}

// A budget smaller than a line still lets every stream through, a line
// at a time, each line stored once and in order: a waiter is granted
// when nothing is held.
func TestABudgetUnderALineStarvesNoStream(t *testing.T) {
	const streams, lines = 8, 120
	s, _ := storetest.Open(t)
	b := newBudget(8, 4)
	var wg sync.WaitGroup
	for i := range streams {
		src := newFakeLog()
		writeBurst(src, 0, lines)
		src.end()
		f := newFollower(t, s, src)
		f.ref.Run = fmt.Sprintf("run-%d", i)
		f.c.budget = b
		f.c.Follow.BatchLines = 64
		wg.Go(func() { f.run(context.Background()) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the followers had not returned after a minute")
	}
	for i := range streams {
		got, err := store.Lines(s, fmt.Sprintf("run-%d", i), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != lines {
			t.Fatalf("run-%d: stored %d lines, want %d", i, len(got), lines)
		}
		for j, l := range got {
			if want := fmt.Sprintf(`{"n":%d}`, j); l.Line != want || l.Seq != uint64(j+1) {
				t.Fatalf("run-%d line %d: seq %d %q, want %q", i, j, l.Seq, l.Line, want)
			}
		}
	}
	if got := b.inUse(); got != 0 {
		t.Errorf("%d bytes of the budget still held after every stream ended", got)
	}
}

// A stream that caught up gives back the budget it took and did not
// spend as soon as it commits, not at its next tick: a quiet stream's
// line took a unit, and 500 such kept the budget from the bursts of
// others for up to a tick each (the bench's median latency doubled).
func TestACaughtUpStreamKeepsNoBudget(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	b := newBudget(64<<10, 16<<10)
	f := newFollower(t, s, src)
	f.c.budget = b
	f.c.Follow.BatchWait = time.Hour // no tick
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for i := range 3 {
		src.write(t0.Add(time.Duration(i)*time.Second), fmt.Sprintf(`{"n":%d}`, i))
		poll.WaitFor(t, func() bool {
			r, _ := s.Run("run-1")
			return r != nil && r.LastSeq == uint64(i+1)
		}, "line not stored")
		poll.WaitFor(t, func() bool { return b.inUse() == 0 }, "the stream kept budget after its commit")
	}
}

// inUse is the bytes held by every stream.
func (b *budget) inUse() int64 { return b.used.Load() }
