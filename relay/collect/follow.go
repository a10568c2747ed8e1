package collect

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/relay/store"
)

// LogSource opens a container's log, following, with timestamps, from
// since (zero: from the start). previous asks for the container's previous
// instance, once a restart replaced the one being followed.
type LogSource interface {
	Stream(ctx context.Context, namespace, pod, container string, since time.Time, previous bool) (io.ReadCloser, error)
}

// APILogSource reads logs through the API server's pods/log.
type APILogSource struct{ Client kubernetes.Interface }

// Stream implements LogSource.
func (a APILogSource) Stream(ctx context.Context, ns, pod, container string, since time.Time, previous bool) (io.ReadCloser, error) {
	opts := &corev1.PodLogOptions{Container: container, Follow: !previous, Timestamps: true, Previous: previous}
	if !since.IsZero() {
		opts.SinceTime = &metav1.Time{Time: since}
	}
	return a.Client.CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
}

// StreamRef names one container instance of an agent pod: a restarted
// container (new ID) is a new stream of the same run.
type StreamRef struct {
	Run, Namespace, Pod, PodUID, Container, ContainerID string
}

// Key is the stream's cursor key in the store.
func (r StreamRef) Key() string { return r.PodUID + "/" + r.Container + "/" + r.ContainerID }

// FollowOptions tune followers. Each field's comment gives its default.
type FollowOptions struct {
	// MaxStreamLifetime reconnects a stream proactively, before API
	// servers, proxies or the kubelet cut long requests. Default 30m.
	MaxStreamLifetime time.Duration
	// MaxLineBytes bounds a stored line; longer ones are cut, marked with
	// TruncatedMarker and counted. Default 1 MiB.
	MaxLineBytes int
	// BackoffMin and BackoffMax bound the wait between failed attempts.
	// Default 200ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// DrainIdle: a terminated container's stream that some server keeps
	// open is done after this long without a line. Default 3s. DrainMax:
	// how long such a stream may send nothing at all (a kubelet may scan
	// a large file for SinceTime). Default 30s.
	DrainIdle, DrainMax time.Duration
	// BatchLines and BatchWait bound how long lines wait to be committed
	// while more keep coming. Default 256 lines, 100ms.
	BatchLines int
	BatchWait  time.Duration
	// BatchBytes bounds the bytes of a batch, and of the lines read ahead
	// of it (a longer line is committed alone), so that long lines make
	// no huge batch. Default 16 KiB, about 50 agent events.
	BatchBytes int
	// BudgetBytes bounds the bytes of lines all of a collector's streams
	// hold at once, read and not yet committed (see budget). Default 2 MiB.
	BudgetBytes int
}

// DefaultFollowOptions are the values the comments above name.
func DefaultFollowOptions() FollowOptions {
	return FollowOptions{
		MaxStreamLifetime: 30 * time.Minute,
		BackoffMin:        200 * time.Millisecond,
		BackoffMax:        30 * time.Second,
		DrainIdle:         3 * time.Second,
		DrainMax:          30 * time.Second,
		BatchLines:        256,
		BatchBytes:        16 << 10,
		BudgetBytes:       2 << 20,
		MaxLineBytes:      1 << 20,
		BatchWait:         100 * time.Millisecond,
	}
}

// setDefaults fills what is unset from DefaultFollowOptions.
func (o *FollowOptions) setDefaults() {
	d := DefaultFollowOptions()
	for _, f := range [][2]*time.Duration{{&o.MaxStreamLifetime, &d.MaxStreamLifetime}, {&o.BackoffMin, &d.BackoffMin},
		{&o.BackoffMax, &d.BackoffMax}, {&o.DrainIdle, &d.DrainIdle}, {&o.DrainMax, &d.DrainMax}, {&o.BatchWait, &d.BatchWait}} {
		orDefault(f[0], *f[1])
	}
	for _, f := range [][2]*int{{&o.BatchLines, &d.BatchLines}, {&o.BatchBytes, &d.BatchBytes}, {&o.BudgetBytes, &d.BudgetBytes}, {&o.MaxLineBytes, &d.MaxLineBytes}} {
		orDefault(f[0], *f[1])
	}
}

// orDefault sets *v to d unless it is positive.
func orDefault[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// containerState is what the follower needs to know of its container now
// (Collector.containerState).
type containerState struct {
	ended    bool // terminated, replaced, or the pod finished
	replaced bool // a restart replaced this instance: read it as "previous"
	gone     bool // the pod no longer exists
	// restarting: the instance failed and the pod goes on, so the kubelet
	// may have started the next in its place before the cache shows it:
	// its log is read neither as current (perhaps the next instance's)
	// nor as previous (perhaps an older one's) until the cache shows
	// which. Under restartPolicy Never nothing is restarted, and such a
	// pod's failed container is read again once the pod has ended. One
	// that exited 0 is read at once: a Job's pod (Never, OnFailure)
	// restarts none. A sidecar (an init container with restartPolicy
	// Always) is restarted all the same, but the pod cache does not keep
	// that policy, so its stream is read as before.
	restarting bool
	// lost: the cache shows two later instances, so the kubelet serves
	// this one's log no more.
	lost bool
}

// errEndedEarly is a stream that ended while its container still runs: a
// server or proxy cut it. Reconnect, with backoff.
var errEndedEarly = errors.New("log stream ended while the container runs")

// errRestarting: the container's log cannot be read by name until the
// pod shows whether the kubelet restarted it (containerState.restarting).
var errRestarting = errors.New("the container failed and may be restarting: waiting for the pod to show its next instance")

// errReadAgain ends a session that read a line it cannot tell from one
// stored (lineUnsure): the next reads the log again from the cursor, after
// the backoff.
var errReadAgain = errors.New("a line read again or written twice: reading again from the cursor")

// unsureReads and unsureWindow bound the reads again from the cursor
// (errReadAgain) of one stream, which an agent causes by writing a line
// twice in one write: each waits the backoff, doubled for each read again
// within unsureWindow, and after unsureReads of them within it a line the
// stream cannot tell is stored, as one written twice (a file served again
// is then stored twice), until the oldest is unsureWindow old. So an agent
// costs unsureReads pods/log requests (each perhaps a scan of a file up to
// containerLogMaxSize for SinceTime) a stream every unsureWindow, not one
// a write. A kubelet serves a file again at a rotation, at most one every
// 10 s, and such a file holding one write alone is rarer still.
const (
	unsureReads  = 3
	unsureWindow = 10 * time.Minute
)

// follower follows one stream for its collector c, whose options, store,
// source, redaction, bounds, log and clock it uses.
type follower struct {
	c     *Collector
	ref   StreamRef
	state func() containerState
	// committed, when set, runs after each commit (the NDJSON mirror).
	committed func()
	// stored: the current session has committed lines.
	stored bool
	// unsure: when the stream read again from the cursor (errReadAgain)
	// within unsureWindow; unsureLogged: the reads past them were logged.
	unsure       []time.Time
	unsureLogged bool
	// stateRead is when drained last read the pod.
	stateRead time.Time
}

// run follows until the container's log is drained or ctx ends.
func (f *follower) run(ctx context.Context) {
	backoff := f.c.Follow.BackoffMin
	for ctx.Err() == nil {
		done, err := f.session(ctx)
		if done || ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRestarting) {
			// Only the cache is read meanwhile, as often as a quiet
			// stream reads it; the pod shows the restart within a sync
			// of the kubelet's.
			select {
			case <-ctx.Done():
				return
			case <-f.c.Clock.After(f.c.Follow.DrainIdle / 4):
			}
			continue
		}
		if errors.Is(err, errReadAgain) {
			// Not at once, and a few times a window (mayReadAgain): an
			// agent's writes would each open a stream.
			f.stored = false
			reconnects.WithLabelValues("unsure").Inc()
			wait := min(f.c.Follow.BackoffMin<<max(len(f.unsure)-1, 0), f.c.Follow.BackoffMax)
			select {
			case <-ctx.Done():
				return
			case <-f.c.Clock.After(wait):
			}
			continue
		}
		st := f.state()
		if err != nil && f.stored {
			// The stream delivered before it broke: a cut, not a failing
			// source. Reconnect soon: the backoff is for sources that
			// fail again and again, not for streams cut now and then.
			backoff = f.c.Follow.BackoffMin
		}
		f.stored = false
		if err != nil {
			if st.gone {
				f.c.Log.V(1).Info("pod gone; stream closed", "stream", f.ref.Key(), "err", err.Error())
				return
			}
			cause := "error"
			if errors.As(err, new(*store.CursorConflict)) {
				cause = "refused"
			}
			reconnects.WithLabelValues(cause).Inc()
			f.c.Log.V(1).Info("log stream failed; retrying", "stream", f.ref.Key(), "in", backoff, "err", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-f.c.Clock.After(backoff):
			}
			backoff = min(backoff*2, f.c.Follow.BackoffMax)
			continue
		}
		backoff = f.c.Follow.BackoffMin
	}
}

// session is one stream: it returns done when the log is drained, or
// (false, err) to reconnect.
func (f *follower) session(ctx context.Context) (bool, error) {
	if !f.takeSlot(ctx) {
		return false, ctx.Err()
	}
	defer func() { <-f.c.slots }()

	cur, err := f.c.Store.Cursor(f.ref.Run, f.ref.Key())
	if err != nil {
		return false, err
	}
	if cur == (store.Cursor{}) {
		// Nothing stored of the stream: perhaps nothing yet, or retention
		// deleted its run (and its cursors) since this follower started,
		// while another replica finished it: a replica thawed after a
		// freeze, its commits refused, reads again from here. Read from
		// the start, the whole run would come back.
		if retired, err := f.c.streamRetired(f.ref); err != nil || retired {
			return retired, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, f.c.Follow.MaxStreamLifetime)
	defer cancel()
	// A stream opened once the container had ended reads its whole last
	// file; one following it when it ended stops at the EOF of the file
	// the kubelet was reading, perhaps a rotated one (see streamEnded).
	st := f.state()
	switch {
	case st.restarting:
		return false, errRestarting
	case st.lost:
		f.c.Log.Info("container restarted twice since this instance's log was read: the rest of it is not served", "stream", f.ref.Key())
		return true, nil
	}
	endedAtOpen := st.ended
	rc, err := f.c.Source.Stream(sctx, f.ref.Namespace, f.ref.Pod, f.ref.Container, cur.SinceTime(), st.replaced)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	streamsOpen.Inc()
	defer streamsOpen.Dec()
	acct := f.c.budget.account()
	defer acct.close()
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading() // before rc.Close (defers run last-first): the reader exits
	q := readLines(rctx, rc, f.c.Follow.MaxLineBytes, f.c.Follow.BatchBytes, acct)

	b := &batch{f: f, res: newResume(cur), from: cur, acct: acct}
	b.res.mayEnd = f.mayReadAgain
	started := f.c.Clock.Now()
	tick := f.c.Clock.NewTicker(f.c.Follow.BatchWait)
	defer tick.Stop()
	for {
		select {
		case line, ok := <-q.lines:
			if !ok && q.err == nil {
				b.keepHeld()
				return false, b.flush(true)
			}
			if !ok {
				ended := f.state().ended
				if errors.Is(q.err, io.EOF) && endedAtOpen && ended && len(q.fragment) > 0 {
					if err := b.add(q.fragment); err != nil { // the last line, with no newline
						return false, err
					}
				}
				b.keepHeld() // nothing follows it in this session
				if err := b.flush(true); err != nil {
					return false, err
				}
				return f.streamEnded(ctx, sctx, q.err, endedAtOpen, ended)
			}
			q.taken(line)
			b.held += int64(len(line))
			if err := b.add(line); err != nil {
				return false, err
			}
			// Caught up: commit now rather than at the next tick, which
			// would delay every line. A busy stream's lines queue up
			// meanwhile and still commit together.
			if len(q.lines) == 0 {
				if err := b.flush(true); err != nil {
					return false, err
				}
			}
		case <-tick.C():
			if b.res.held && len(q.lines) == 0 && f.c.Clock.Since(b.heldAt) >= f.c.Follow.BatchWait {
				// Nothing followed it for a tick. (A line queued decides
				// it: the tick can be chosen before a line ready too.)
				b.keepHeld()
			}
			if err := b.flush(len(q.lines) == 0); err != nil {
				return false, err
			}
			if f.drained(len(q.lines), b.lastLine, started) {
				b.keepHeld()
				if err := b.flush(true); err != nil {
					return false, err
				}
				if endedAtOpen {
					return true, nil
				}
				// Opened while the container ran: the kubelet may be on a
				// rotated file; read once more from the cursor.
				reconnects.WithLabelValues("final").Inc()
				return false, nil
			}
		}
	}
}

// mayReadAgain says whether a session may end at a line it cannot tell
// from one stored, to read the log again from the cursor: not after
// unsureReads such reads within unsureWindow. Else the line is stored,
// counted, and logged once for those reads.
func (f *follower) mayReadAgain() bool {
	now := f.c.Clock.Now()
	f.unsure = slices.DeleteFunc(f.unsure, func(t time.Time) bool { return now.Sub(t) >= unsureWindow })
	if len(f.unsure) < unsureReads {
		f.unsure, f.unsureLogged = append(f.unsure, now), false
		return true
	}
	unsureStored.Inc()
	if !f.unsureLogged {
		f.unsureLogged = true
		f.c.Log.Info("stream read again too often at lines written twice or served again; storing them as written twice",
			"stream", f.ref.Key(), "reads", len(f.unsure), "within", unsureWindow.String(), "until", f.unsure[0].Add(unsureWindow))
	}
	return false
}

// takeSlot waits for one of the open-stream slots, counting the wait.
func (f *follower) takeSlot(ctx context.Context) bool {
	select {
	case f.c.slots <- struct{}{}:
		return true
	default:
		streamLimitWaits.Inc()
	}
	select {
	case f.c.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// readBufferBytes is each stream's read buffer, held while the stream is
// open, idle or not, so it is small: a longer line is gathered in a slice
// of its own (readLine), which goes once the line is committed.
const readBufferBytes = 4 << 10

// lineQueue hands the lines a stream's reader read to its follower: at
// most 64 lines, and while it holds any, less than maxBytes of them; each
// line's bytes taken from the relay's budget first.
type lineQueue struct {
	// lines are whole lines, newline included. The reader closes it after
	// an error, which it sets in err first, with fragment: what came after
	// the last newline (a finished container's last line may have none).
	lines    chan string
	err      error
	fragment string
	queued   atomic.Int64  // bytes sent and not yet taken
	room     chan struct{} // lines were taken: half the bound or more is free
	maxBytes int64
}

// taken tells the reader that the follower took line, once the queue is
// at most half full: a reader waiting for room then reads many lines, not
// one a line taken (each a wake-up of both goroutines).
func (q *lineQueue) taken(line string) {
	if q.queued.Add(-int64(len(line))) > q.maxBytes/2 {
		return
	}
	select {
	case q.room <- struct{}{}:
	default:
	}
}

// readLines reads whole lines from rc until an error, which it leaves in
// the queue with the fragment before it, and closes the queue. A fragment
// is a line cut short, read whole by the resume, unless it is a finished
// container's last line, written without a newline. It reads on only
// while the queue has room and the budget allows: the rest waits in the
// stream's HTTP/2 window and the log file.
func readLines(ctx context.Context, rc io.Reader, maxLine, maxQueued int, acct *budgetAccount) *lineQueue {
	q := &lineQueue{lines: make(chan string, 64), room: make(chan struct{}, 1), maxBytes: math.MaxInt64}
	if maxQueued > 0 {
		q.maxBytes = int64(maxQueued)
	}
	go func() {
		defer close(q.lines)
		send := func(line string) bool {
			n := int64(len(line))
			for {
				// A line longer than the bound goes once the queue is empty.
				if queued := q.queued.Load(); queued == 0 || queued+n <= q.maxBytes {
					break
				}
				select {
				case <-q.room:
				case <-ctx.Done():
					return false
				}
			}
			if !acct.take(ctx, n) {
				return false
			}
			q.queued.Add(n)
			select {
			case q.lines <- line:
				return true
			case <-ctx.Done():
				return false
			}
		}
		br := bufio.NewReaderSize(rc, readBufferBytes)
		for {
			b, err := readLine(br, maxLine)
			if err != nil {
				q.err, q.fragment = err, b // before the close: the follower reads them after
				return
			}
			if !send(b) {
				return
			}
		}
	}()
	return q
}

// TruncatedMarker ends a line cut at MaxLineBytes, so a reader sees that
// the line was longer.
const TruncatedMarker = " [clipjob: line truncated]"

// readLine reads one line, newline included, keeping at most max bytes of
// it (max <= 0: no bound) and ending what it kept with TruncatedMarker: an
// enormous line costs max bytes, not the line. A line is a string: its
// text is copied once, from the read buffer, and the batch stores it
// without another copy.
func readLine(br *bufio.Reader, max int) (string, error) {
	if max <= 0 {
		max = math.MaxInt
	}
	frag, err := br.ReadSlice('\n')
	if err == nil && len(frag) <= max {
		return string(frag), nil // a line the read buffer holds whole
	}
	var line []byte
	cut := false
	for {
		if !cut {
			if room := max - len(line); len(frag) > room {
				line, cut = append(line, frag[:room]...), true
			} else {
				line = append(line, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			frag, err = br.ReadSlice('\n')
			continue
		}
		if err != nil {
			return string(line), err // the fragment, for a caller that knows it is whole
		}
		if cut {
			linesTruncated.Inc()
			line = append(append(bytes.TrimRight(line, "\n"), TruncatedMarker...), '\n')
		}
		return string(line), nil
	}
}

// streamEnded decides what the end of a stream means: done for the EOF of
// a stream opened on a finished container; for the EOF of one that ended
// while followed, one more read from the cursor (see session); a quiet
// reconnect at the proactive lifetime; else an error to reconnect after.
func (f *follower) streamEnded(ctx, sctx context.Context, err error, endedAtOpen, ended bool) (bool, error) {
	lifetime := sctx.Err() != nil && ctx.Err() == nil
	switch {
	case errors.Is(err, io.EOF) && ended && endedAtOpen:
		return true, nil // the server ended the stream of a finished container
	case errors.Is(err, io.EOF) && ended:
		reconnects.WithLabelValues("final").Inc()
		return false, nil
	case lifetime:
		reconnects.WithLabelValues("lifetime").Inc()
		return false, nil
	case errors.Is(err, io.EOF):
		reconnects.WithLabelValues("eof").Inc()
		return false, errEndedEarly
	}
	return false, err
}

// drained reports whether a stream the server keeps open after its
// container ended has said all it will: nothing queued, and quiet for
// DrainIdle since the last line, or silent for DrainMax from the start.
// The pod is read last, and at most every DrainIdle/4: a read from the
// cache copies it, and a quiet stream asks on every tick (with 1,000 runs
// waiting to write, a tenth of a replica's CPU).
func (f *follower) drained(queued int, lastLine, started time.Time) bool {
	if queued > 0 {
		return false
	}
	quiet := f.c.Clock.Since(lastLine) >= f.c.Follow.DrainIdle
	if lastLine.IsZero() {
		quiet = f.c.Clock.Since(started) >= f.c.Follow.DrainMax
	}
	if !quiet || f.c.Clock.Since(f.stateRead) < f.c.Follow.DrainIdle/4 {
		return false
	}
	f.stateRead = f.c.Clock.Now()
	st := f.state()
	return st.ended || st.gone
}

// batch collects a stream's lines and commits them together.
type batch struct {
	f   *follower
	res *resume
	// lines is taken from linesPool at the first line of a batch and
	// given back, cleared, after its commit: an idle stream holds none.
	lines []store.Line
	// from is the stream's stored cursor as this session last saw it: a
	// commit is refused (store.CursorConflict) if another writer moved it
	// since, and the session ends to resume from the store's.
	from store.Cursor
	// bytes are the bytes of lines.
	bytes int
	// held is what the lines taken since the last commit took from the
	// budget, given back once they are committed.
	held int64
	acct *budgetAccount
	// lastLine is when the stream last sent a line or a commit ended;
	// zero until the stream sends anything.
	lastLine time.Time
	// heldAt is when the resume's held line, the last of lines, was read,
	// and heldBytes what it took from the budget: a commit leaves it out
	// until the next line says whether it is stored already, or a tick
	// passes without one (resume.held).
	heldAt    time.Time
	heldBytes int64
}

// keepHeld ends the hold of the last line: the next commit stores it.
func (b *batch) keepHeld() { b.res.keepHeld() }

// add takes one raw line, skipping what the store already has, and
// commits when the batch is full. A line the session cannot tell from one
// stored commits the batch and returns errReadAgain.
func (b *batch) add(raw string) error {
	b.lastLine = b.f.c.Clock.Now()
	ts, msg, err := splitTimestamp(trimNewline(raw))
	if err != nil {
		b.f.c.Log.V(1).Info("skipping a line without timestamp", "stream", b.f.ref.Key())
		return nil
	}
	switch b.res.accept(ts, msg) {
	case lineStored:
		return nil
	case lineHeldServedAgain:
		// The held line, the last of the batch, was this file's first
		// line served again.
		last := len(b.lines) - 1
		b.bytes -= len(b.lines[last].Line)
		b.lines[last] = store.Line{}
		b.lines = b.lines[:last]
		return nil
	case lineUnsure:
		if err := b.flush(true); err != nil {
			return err
		}
		return errReadAgain
	}
	if b.lines == nil {
		b.lines = getLines()
	}
	b.lines = append(b.lines, store.Line{TS: ts, Container: b.f.ref.Container, Line: b.f.c.Redact.Redact(msg)})
	b.bytes += len(b.lines[len(b.lines)-1].Line)
	if b.res.held {
		b.heldAt, b.heldBytes = b.lastLine, int64(len(raw))
	}
	if len(b.lines) >= b.f.c.Follow.BatchLines || (b.f.c.Follow.BatchBytes > 0 && b.bytes >= b.f.c.Follow.BatchBytes) {
		return b.flush(false)
	}
	return nil
}

// flush commits the batch with the stream's cursor. caughtUp: nothing is
// queued behind it, so the stream gives back the budget it took and did
// not spend (see budget).
//
// A held line (resume.held), the last of the batch, is left out with its
// budget, and the cursor committed is the one before it.
func (b *batch) flush(caughtUp bool) error {
	lines, cur, held := b.lines, b.res.cur, b.res.held
	if held {
		lines, cur = lines[:len(lines)-1], b.res.heldCur
	}
	if len(lines) == 0 {
		b.giveBack(caughtUp)
		return nil
	}
	now := b.f.c.Clock.Now()
	if _, err := b.f.c.Store.AppendAfter(b.f.ref.Run, b.f.ref.Key(), b.from, cur, lines, now); err != nil {
		return err
	}
	b.from = cur
	var bytes int
	for _, l := range lines {
		bytes += len(l.Line)
		storeLag.Observe(now.Sub(l.TS).Seconds())
	}
	b.f.stored = true
	linesStored.Add(float64(len(lines)))
	bytesStored.Add(float64(bytes))
	if held {
		kept := b.lines[len(b.lines)-1]
		clear(b.lines)
		b.lines, b.bytes = append(b.lines[:0], kept), len(kept.Line)
	} else {
		putLines(b.lines)
		b.lines, b.bytes = nil, 0
	}
	b.giveBack(caughtUp)
	// Time spent committing is not idle: lines may have queued behind it.
	b.lastLine = b.f.c.Clock.Now()
	if b.f.committed != nil {
		b.f.committed()
	}
	return nil
}

// giveBack returns to the budget what the committed (or skipped) lines
// took, and once the stream caught up, what it took and did not spend.
func (b *batch) giveBack(caughtUp bool) {
	keep := int64(0)
	if b.res.held {
		keep = b.heldBytes // the held line's, until it is committed or dropped
	}
	b.acct.give(b.held-keep, caughtUp)
	b.held = keep
}

func trimNewline(b string) string {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// linesPool holds the slices batches gather their lines in: only the
// streams with lines waiting for a commit hold one.
var linesPool sync.Pool

// getLines returns an empty slice, which a batch grows as it needs.
func getLines() []store.Line {
	if p, ok := linesPool.Get().(*[]store.Line); ok {
		return (*p)[:0]
	}
	return make([]store.Line, 0, 32)
}

// putLines gives a batch's slice back, cleared: the pool must not keep
// the lines' strings alive.
func putLines(l []store.Line) {
	l = l[:cap(l)]
	clear(l)
	l = l[:0]
	linesPool.Put(&l)
}
