package store

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Backend is what the relay needs of a store: Store (bbolt, the default)
// and package postgres implement it, held to the same behaviour by
// storetest's conformance suite.
type Backend interface {
	// AppendAfter stores lines of one container instance (stream) of run
	// with the stream's cursor after them, in one transaction, and returns
	// the run's last sequence number. It commits only if the stream's
	// stored cursor is still prev, the one the writer started from, else
	// returns a *CursorConflict: two writers of one stream never store a
	// line twice.
	AppendAfter(run, stream string, prev, cur Cursor, lines []Line, now time.Time) (uint64, error)
	// Cursor returns how far a stream of run is stored (zero: nothing yet).
	Cursor(run, stream string) (Cursor, error)
	// UpdateRun applies fn to the run's record, creating it if needed. fn
	// may run more than once: it must only set fields of the record.
	UpdateRun(id string, fn func(*Run)) (*Run, error)
	// Run returns a run's record, or nil if the relay never saw it.
	Run(id string) (*Run, error)
	// RunsWhere returns the summaries of the runs f selects (f.Match),
	// newest first, selected where the runs are kept.
	RunsWhere(f Filter) ([]Summary, error)
	// Page hands each the lines of run with sequence numbers above after,
	// in order, as stored (each line's JSON, valid during the call only):
	// up to limit of them (limit <= 0: as many as the store reads at
	// once) and about PageBytes of text (at least one line). It returns how far the run is stored
	// and whether it is done, read with the lines, without its record's
	// other fields; found is false for a run the store does not hold. A
	// log's follower reads both after every change; Lines decodes them.
	Page(run string, after uint64, limit int, each func(RawLine)) (lastSeq uint64, done, found bool, err error)
	// Changed returns a channel closed at the run's next change (lines or
	// record), by this relay or another sharing the store. Take it before
	// reading, then wait on it, to miss nothing.
	Changed(run string) <-chan struct{}
	// Retain deletes finished runs older than maxAge (by last activity),
	// then the oldest finished runs until the stored line bytes are under
	// maxBytes, and returns them (see Retirees). Zero disables a limit.
	// It keeps a Retired for each (RetiredOf), in the same transaction.
	Retain(maxAge time.Duration, maxBytes int64, now time.Time) ([]Run, error)
	// RetiredRun returns what is kept of the retired run of Job jobUID in
	// namespace, or nil if none: its pods are not collected again.
	RetiredRun(namespace, jobUID string) (*Retired, error)
	// RetiredRuns returns everything kept of retired runs.
	RetiredRuns() ([]Retired, error)
	// ForgetRetired deletes what is kept of the retired runs given (by
	// their namespace and Job: no pod of those Jobs remains).
	ForgetRetired(gone ...Retired) error
	// MirrorState returns what the run's mirror holds; zero if nothing.
	MirrorState(run string) (MirrorState, error)
	// SetMirrorState records what the run's mirror holds.
	SetMirrorState(run string, st MirrorState) error
	// Size is the store's size on disk in bytes.
	Size() int64
	// Close releases the store.
	Close() error
}

// Filter selects runs by their summary; a zero field selects any.
type Filter struct {
	Agent, Company, Phase string
	// Unfinished: only runs not done.
	Unfinished bool
}

// Match says whether f selects the run s summarizes.
func (f Filter) Match(s *Summary) bool {
	return (f.Agent == "" || s.Agent == f.Agent) && (f.Company == "" || s.Company == f.Company) &&
		(f.Phase == "" || s.Phase == f.Phase) && (!f.Unfinished || !s.Done)
}

// ErrCursorConflict is what a *CursorConflict matches with errors.Is.
var ErrCursorConflict = errors.New("the stream's stored cursor moved")

// CursorConflict is AppendAfter refusing a write: another writer (or an
// earlier attempt of this one) stored lines since the writer's cursor.
// Nothing of the refused write is stored; resume from Stored.
type CursorConflict struct {
	Run, Stream string
	// Prev is the cursor the writer started from; Stored is the store's.
	Prev, Stored Cursor
}

func (e *CursorConflict) Error() string {
	return fmt.Sprintf("run %s stream %s: stored cursor %+v, not %+v the write started from: another writer stored lines in between; resume from the stored cursor",
		e.Run, e.Stream, e.Stored, e.Prev)
}

// Is makes errors.Is(err, ErrCursorConflict) true.
func (e *CursorConflict) Is(target error) bool { return target == ErrCursorConflict }

// RunOfJob is run id's record in b, or with jobUID that Job's run: kept
// under RunKey when another Job took the id first (once there, it stays
// there), else the id's record if it is that Job's or bound to none (from
// before runs were bound); nil if neither.
func RunOfJob(b Backend, id, jobUID string) (*Run, error) {
	if jobUID == "" {
		return b.Run(id)
	}
	if !ValidJobUID(jobUID) {
		return nil, nil
	}
	if apart, err := b.Run(RunKey(id, jobUID)); err != nil || apart != nil {
		return apart, err
	}
	run, err := b.Run(id)
	if err != nil || run == nil || (run.JobUID != "" && run.JobUID != jobUID) {
		return nil, err
	}
	return run, nil
}

// Retirees chooses what retention deletes from runs, newest first:
// finished runs older than maxAge (by last activity), then the oldest
// finished runs until the stored line bytes are under maxBytes. Zero
// disables a limit; running runs are never chosen. The result is oldest
// first.
func Retirees(runs []Summary, maxAge time.Duration, maxBytes int64, now time.Time) []Summary {
	var total int64
	for _, r := range runs {
		total += r.Bytes
	}
	var drop []Summary
	for i := len(runs) - 1; i >= 0; i-- { // oldest first
		r := runs[i]
		if !r.Done {
			continue
		}
		if (maxAge > 0 && now.Sub(r.SeenAt) > maxAge) || (maxBytes > 0 && total > maxBytes) {
			drop = append(drop, r)
			total -= r.Bytes
		}
	}
	return drop
}

// Changes hands out the channels Changed returns and closes them when a
// run changes. The zero value is ready.
type Changes struct {
	mu      sync.Mutex
	changed map[string]chan struct{} // run -> closed on the next change
}

// Changed returns a channel closed at the run's next Notify.
func (c *Changes) Changed(run string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed == nil {
		c.changed = map[string]chan struct{}{}
	}
	ch, ok := c.changed[run]
	if !ok {
		ch = make(chan struct{})
		c.changed[run] = ch
	}
	return ch
}

// Notify closes the channels handed out for runs.
func (c *Changes) Notify(runs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, run := range runs {
		if ch, ok := c.changed[run]; ok {
			close(ch)
			delete(c.changed, run)
		}
	}
}

// Waiting says whether a channel handed out for run waits for its next
// Notify.
func (c *Changes) Waiting(run string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.changed[run]
	return ok
}

// NotifyAll closes every channel handed out: their waiters re-read.
func (c *Changes) NotifyAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for run, ch := range c.changed {
		close(ch)
		delete(c.changed, run)
	}
}
