package collect

import (
	"context"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// budget bounds the bytes of lines that all the streams of a collector
// hold at once between reading them and their commit (each stream's own
// bound, BatchBytes, times hundreds of streams in a flood is too much). A
// reader that finds it spent waits, its data unread in its HTTP/2 window
// and the kubelet's log file.
//
// A stream takes the budget a unit (BatchBytes) at a time and spends it
// line by line, so a stream that waited commits a batch's worth, not a
// line at a time. Commits give back what their lines took; the unspent
// rest goes back when the stream waits again or has caught up, so a quiet
// stream keeps no unit from the others.
//
// Progress: the semaphore grants waiters in order, each when its unit
// fits; a line longer than the budget takes the whole budget, so it is
// granted once no stream holds anything. A stream holding bytes commits
// them without reading more, so the first waiter is granted in time, and
// each after it.
type budget struct {
	sem         *semaphore.Weighted
	limit, unit int64
	// used and waiting are what the streams hold and how many wait, for
	// tests.
	used, waiting atomic.Int64
}

// budgetAccount is what one stream session holds of a budget: its reader
// takes, its follower gives.
type budgetAccount struct {
	b  *budget // nil: no relay-wide bound
	mu sync.Mutex
	// held is what the stream took: spent on lines not yet committed,
	// and credit, not spent yet.
	held, credit int64
	closed       bool
}

// newBudget is a budget of limit bytes, taken unit bytes at a time.
func newBudget(limit, unit int64) *budget {
	return &budget{sem: semaphore.NewWeighted(limit), limit: limit, unit: max(unit, 1)}
}

// account opens a stream session's account; b may be nil (no bound).
func (b *budget) account() *budgetAccount { return &budgetAccount{b: b} }

// take spends n bytes on a line, waiting for a grant if the stream's
// credit is short, and returns false if ctx ended first (then it holds
// nothing more for the line) or the session closed.
func (a *budgetAccount) take(ctx context.Context, n int64) bool {
	if a.b == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.credit < n && !a.closed {
		// Short: give the rest back and ask for a unit (or the line).
		a.release(a.credit)
		a.credit = 0
		a.mu.Unlock()
		want := min(max(n, a.b.unit), a.b.limit)
		a.b.waiting.Add(1)
		err := a.b.sem.Acquire(ctx, want)
		a.b.waiting.Add(-1)
		a.mu.Lock()
		if err != nil {
			return false
		}
		a.held, a.credit = a.held+want, want
		a.b.used.Add(want)
	}
	if a.closed {
		a.release(a.held) // granted as the session closed
		a.credit = 0
		return false
	}
	a.credit -= min(n, a.credit)
	return true
}

// give returns the bytes of committed (or skipped) lines, and all the
// credit too when idle: the stream has nothing queued.
func (a *budgetAccount) give(n int64, idle bool) {
	if a.b == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.release(min(n, a.held-a.credit))
	if idle {
		a.release(a.credit)
		a.credit = 0
	}
}

// close gives back all the stream holds, at the end of its session; it
// takes nothing more.
func (a *budgetAccount) close() {
	if a.b == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.release(a.held)
	a.credit = 0
}

// release gives n of what the stream holds back.
func (a *budgetAccount) release(n int64) {
	if n <= 0 {
		return
	}
	a.held -= n
	a.b.used.Add(-n)
	a.b.sem.Release(n)
}
