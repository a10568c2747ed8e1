package collect

import "sync"

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
// Progress: waiters are granted in order, each when its unit fits or when
// no stream holds anything (a line longer than the budget). A stream
// holding bytes commits them without reading more, so the first waiter
// is granted in time, and each after it.
type budget struct {
	mu      sync.Mutex
	limit   int64
	unit    int64
	used    int64
	waiters []*budgetWaiter
}

type budgetWaiter struct {
	acct  *budgetAccount
	n     int64
	ready chan struct{}
}

// budgetAccount is what one stream session holds of a budget. Fields
// are under b.mu.
type budgetAccount struct {
	b *budget // nil: no relay-wide bound
	// held is what the stream took: spent on lines not yet committed,
	// and credit, not spent yet.
	held, credit int64
	closed       bool
}

// newBudget is a budget of limit bytes, taken unit bytes at a time.
func newBudget(limit, unit int64) *budget { return &budget{limit: limit, unit: max(unit, 1)} }

// account opens a stream session's account; b may be nil (no bound).
func (b *budget) account() *budgetAccount { return &budgetAccount{b: b} }

// take spends n bytes on a line, waiting for a grant if the stream's
// credit is short, and returns false if stop closed first (then it holds
// nothing more for the line).
func (a *budgetAccount) take(n int64, stop <-chan struct{}) bool {
	b := a.b
	if b == nil {
		return true
	}
	b.mu.Lock()
	if a.closed {
		b.mu.Unlock()
		return false
	}
	if a.credit >= n {
		a.credit -= n
		b.mu.Unlock()
		return true
	}
	// Short: give the rest back and ask for a unit (or the line).
	a.returnCreditLocked()
	w := &budgetWaiter{acct: a, n: max(n, b.unit), ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.grantLocked()
	b.mu.Unlock()
	select {
	case <-w.ready:
	case <-stop:
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-w.ready: // granted meanwhile: given back when the session closes
		default:
			b.dropWaiterLocked(w)
			b.grantLocked() // a waiter behind this one may fit now
			return false
		}
		a.credit -= n
		return true
	}
	b.mu.Lock()
	a.credit -= n
	b.mu.Unlock()
	return true
}

// give returns the bytes of committed (or skipped) lines, and all the
// credit too when idle: the stream has nothing queued.
func (a *budgetAccount) give(n int64, idle bool) {
	b := a.b
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, a.held-a.credit)
	a.held -= n
	b.used -= n
	if idle {
		a.returnCreditLocked()
	}
	b.grantLocked()
}

// close gives back all the stream holds, at the end of its session; it
// takes nothing more.
func (a *budgetAccount) close() {
	b := a.b
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	a.closed = true
	b.used -= a.held
	a.held, a.credit = 0, 0
	for _, w := range b.waiters {
		if w.acct == a {
			b.dropWaiterLocked(w)
			break
		}
	}
	b.grantLocked()
}

func (a *budgetAccount) returnCreditLocked() {
	a.held -= a.credit
	a.b.used -= a.credit
	a.credit = 0
}

func (b *budget) dropWaiterLocked(w *budgetWaiter) {
	for i, o := range b.waiters {
		if o == w {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			return
		}
	}
}

// grantLocked grants the waiters in order while they fit; the first one
// also when nothing is held at all.
func (b *budget) grantLocked() {
	granted := 0
	for _, w := range b.waiters {
		if b.used > 0 && b.used+w.n > b.limit {
			break
		}
		b.used += w.n
		w.acct.held += w.n
		w.acct.credit += w.n
		close(w.ready)
		granted++
	}
	if granted > 0 {
		clear(b.waiters[:granted])
		b.waiters = b.waiters[granted:]
	}
}
