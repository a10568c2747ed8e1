package collect

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// An open stream that has gone quiet holds little: its read buffer and
// its goroutines, not the lines of its last batch, nor the room it took
// for a long line. The relay follows hundreds of streams, most of them
// quiet at any moment; this held 198 KB a stream (a 64 KiB read buffer,
// the last batch's lines) when it was written. A quiet stream holds
// 28-34 KB now, by the moment the collector runs (measured on a busy
// machine): the bound is twice that, far below what it guards against.
func TestQuietStreamsHoldLittleMemory(t *testing.T) {
	const streams, lines = 100, 600
	const perStream = 64 << 10
	s, _ := storetest.Open(t)
	srcs := make([]*fakeLog, streams)
	for i := range srcs {
		srcs[i] = newFakeLog()
		for j := range lines {
			text := strings.Repeat("x", 280)
			if j == lines/2 {
				text = strings.Repeat("y", 200<<10) // a long line, kept whole
			}
			srcs[i].write(t0.Add(time.Duration(j)*time.Microsecond), fmt.Sprintf(`{"n":%d,"text":"%s"}`, j, text))
		}
	}
	before := heapInUse()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, src := range srcs {
		f := newFollower(t, s, src)
		f.ref.Run = fmt.Sprintf("run-%d", i)
		f.c.slots = make(chan struct{}, 1)
		f.c.Follow = DefaultFollowOptions()
		f.c.Follow.DrainIdle = time.Hour
		wg.Go(func() { f.run(ctx) })
	}
	for i := range srcs {
		run := fmt.Sprintf("run-%d", i)
		poll.WaitFor(t, func() bool {
			r, _ := s.Run(run)
			return r != nil && r.LastSeq == lines
		}, run+" not stored")
	}
	got := (heapInUse() - before) / streams
	t.Logf("a quiet stream holds %d bytes of heap", got)
	if got > perStream {
		t.Errorf("a quiet stream holds %d bytes of heap; want at most %d", got, perStream)
	}
}

// heapInUse is the heap in use after a collection, with the pools'
// spare objects (held until the second collection) gone.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// A stream of long lines whose commits stall (a slow fsync, a flood)
// holds about BatchBytes in its batch and as much read ahead, not
// BatchLines of them and 64 more: with 100 KB lines that was 32 MB a
// stream. Each commit holds at most BatchBytes and one line more.
func TestLongLinesAreBatchedByBytes(t *testing.T) {
	const lineBytes, batchBytes = 100 << 10, 64 << 10
	s, _ := storetest.Open(t)
	src := &endlessLog{text: strings.Repeat("y", lineBytes)}
	held := &heldStore{Backend: s, release: make(chan struct{})}
	f := newFollower(t, s, nil)
	f.c.Source, f.c.Store = src, held
	f.state = func() containerState { return containerState{} }
	f.c.Follow = DefaultFollowOptions()
	f.c.Follow.BatchBytes = batchBytes
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// The first commit waits: the stream reads until its batch and its
	// queue are full, then stops.
	poll.WaitFor(t, func() bool { return held.waiting.Load() }, "no commit")
	var last int64 = -1
	poll.WaitFor(t, func() bool {
		n := src.read.Load()
		time.Sleep(100 * time.Millisecond)
		stable := n == last
		last = n
		return stable
	}, "the stream never stopped reading")
	// A reader descheduled for those 100 ms on a busy machine looks
	// stopped too: half a second more, and what it read by then counts.
	time.Sleep(500 * time.Millisecond)
	last = src.read.Load()
	// The batch (batchBytes and a line), the queue (as much), the read
	// buffer and the HTTP/2 window's worth the source itself buffers.
	if limit := int64(2*(batchBytes+lineBytes) + 2*lineBytes); last > limit {
		t.Errorf("with its commit stalled, the stream read %d bytes ahead; want at most %d", last, limit)
	}
	close(held.release)
	poll.WaitFor(t, func() bool { return held.commits.Load() >= 10 }, "commits did not resume")
	if max := held.maxBytes.Load(); max > batchBytes+lineBytes+1024 {
		t.Errorf("a commit held %d bytes of lines; want at most %d and a line", max, batchBytes)
	}
}

// endlessLog is a container that writes long lines without end, a
// microsecond apart; read counts the bytes its streams were read.
type endlessLog struct {
	text string
	read atomic.Int64
}

func (e *endlessLog) Stream(ctx context.Context, _, _, _ string, since time.Time, _ bool) (io.ReadCloser, error) {
	if since.IsZero() {
		since = t0
	}
	return &endlessStream{log: e, ctx: ctx, next: since}, nil
}

type endlessStream struct {
	log     *endlessLog
	ctx     context.Context
	next    time.Time
	pending []byte
}

func (s *endlessStream) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	if len(s.pending) == 0 {
		s.next = s.next.Add(time.Microsecond)
		s.pending = []byte(s.next.UTC().Format(time.RFC3339Nano) + " " + s.log.text + "\n")
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	s.log.read.Add(int64(n))
	return n, nil
}

func (s *endlessStream) Close() error { return nil }

// heldStore holds every commit until release is closed, and records the
// largest commit's bytes of lines.
type heldStore struct {
	store.Backend
	release           chan struct{}
	waiting           atomic.Bool
	commits, maxBytes atomic.Int64
}

func (h *heldStore) AppendAfter(run, stream string, prev, cur store.Cursor, lines []store.Line, now time.Time) (uint64, error) {
	h.waiting.Store(true)
	<-h.release
	var n int64
	for _, l := range lines {
		n += int64(len(l.Line))
	}
	for m := h.maxBytes.Load(); n > m && !h.maxBytes.CompareAndSwap(m, n); m = h.maxBytes.Load() {
	}
	h.commits.Add(1)
	return h.Backend.AppendAfter(run, stream, prev, cur, lines, now)
}

// A stream's queue of lines read ahead costs its read buffer and little
// more while it is empty: it held 4 KB more (a channel of 64 lines, each
// with room for an error and a fragment) when this was written.
func TestAnEmptyQueueHoldsItsReadBuffer(t *testing.T) {
	const queues = 500
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &quietStream{stop: ctx.Done()}
	before := heapInUse()
	for range queues {
		readLines(ctx, src, 1<<20, 16<<10, nil)
	}
	// Every reader has its buffer once it waits in Read (on a busy
	// machine a fixed pause could measure readers not yet started).
	poll.WaitFor(t, func() bool { return src.reading.Load() == queues }, "the readers never all read")
	got := (heapInUse() - before) / queues
	t.Logf("an empty queue holds %d bytes of heap", got)
	if limit := int64(readBufferBytes + 3<<10); got > limit {
		t.Errorf("an empty queue holds %d bytes of heap; want at most %d", got, limit)
	}
}

// quietStream is a stream that sends nothing until stop; reading counts
// the reads waiting in it.
type quietStream struct {
	stop    <-chan struct{}
	reading atomic.Int64
}

func (q *quietStream) Read([]byte) (int, error) {
	q.reading.Add(1)
	<-q.stop
	return 0, io.EOF
}
