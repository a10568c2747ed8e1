package collect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// fakeLog is a container log the way the API serves it: timestamped
// lines, from a whole second on, following. breakAfter makes a stream fail
// after that many lines, as a dropped connection does.
type fakeLog struct {
	mu         sync.Mutex
	lines      []string // "ts msg"
	grew       chan struct{}
	breakAfter []int // per stream session, consumed in order
	cutMidLine bool  // a break sends half of the next line first
	eofAfter   []int // per session: end the stream cleanly after that many lines, as a kubelet that stopped at a rotated file's end
	stallAfter []int // per session: send nothing more after that many lines, keeping the stream open, as a kubelet left following a rotated file
	// againAfter, per session: once the stream has sent that many lines
	// it serves the log again from line againFrom (the newest file's
	// first), as the kubelet does when it reopens the newest file for a
	// rotation it learns of late.
	againAfter []int
	againFrom  int
	sessions   int
	ended      bool
}

func newFakeLog() *fakeLog { return &fakeLog{grew: make(chan struct{})} }

func (f *fakeLog) write(ts time.Time, msg string) {
	f.mu.Lock()
	f.lines = append(f.lines, ts.Format(time.RFC3339Nano)+" "+msg+"\n")
	close(f.grew)
	f.grew = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeLog) Stream(ctx context.Context, _, _, _ string, since time.Time, _ bool) (io.ReadCloser, error) {
	f.mu.Lock()
	limit, eofAt, stallAt, againAt := -1, -1, -1, -1
	if f.sessions < len(f.againAfter) {
		againAt = f.againAfter[f.sessions]
	}
	if f.sessions < len(f.stallAfter) {
		stallAt = f.stallAfter[f.sessions]
	}
	if f.sessions < len(f.breakAfter) {
		limit = f.breakAfter[f.sessions]
	}
	if f.sessions < len(f.eofAfter) {
		eofAt = f.eofAfter[f.sessions]
	}
	f.sessions++
	f.mu.Unlock()
	pr, pw := io.Pipe()
	go func() {
		sent, next := 0, 0
		for {
			f.mu.Lock()
			lines, from := f.lines, f.againFrom
			grew, ended := f.grew, f.ended
			f.mu.Unlock()
			for ; next < len(lines); next++ {
				l := lines[next]
				ts, _, _ := splitTimestamp(strings.TrimSuffix(l, "\n"))
				if !since.IsZero() && ts.Before(since) {
					continue
				}
				if eofAt >= 0 && sent == eofAt {
					pw.Close()
					return
				}
				if stallAt >= 0 && sent == stallAt {
					<-ctx.Done()
					pw.CloseWithError(ctx.Err())
					return
				}
				if limit >= 0 && sent == limit {
					if f.cutMidLine {
						_, _ = io.WriteString(pw, l[:len(l)-4]) // timestamp intact, message cut
					}
					pw.CloseWithError(errors.New("connection reset by peer"))
					return
				}
				if _, err := io.WriteString(pw, l); err != nil {
					return
				}
				if sent++; sent == againAt {
					againAt, next = -1, from-1 // the loop steps on to from
				}
			}
			if ended {
				pw.Close() // a kubelet ends the stream of a finished container
				return
			}
			select {
			case <-grew:
			case <-ctx.Done():
				pw.CloseWithError(ctx.Err())
				return
			}
		}
	}()
	return pr, nil
}

// endedAfterFirstStream is a container that runs when its first stream
// opens and has ended by any later one.
// sessionsOpened is how many streams of the log were opened.
func (f *fakeLog) sessionsOpened() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sessions
}

func (f *fakeLog) endedAfterFirstStream() containerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return containerState{ended: f.sessions > 0}
}

// writeUnterminated writes a last line with no newline, as a program that
// exits after printf without one.
func (f *fakeLog) writeUnterminated(ts time.Time, msg string) {
	f.mu.Lock()
	f.lines = append(f.lines, ts.Format(time.RFC3339Nano)+" "+msg)
	close(f.grew)
	f.grew = make(chan struct{})
	f.mu.Unlock()
}

// end ends the log: a stream sends what is left and then reaches EOF, as a
// kubelet ends the stream of a container that exited.
func (f *fakeLog) end() {
	f.mu.Lock()
	f.ended = true
	close(f.grew)
	f.grew = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeLog) state() containerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return containerState{ended: f.ended}
}

// newFollower's DrainIdle is far above any stall of a loaded test machine:
// the fake's streams end with EOF, so it costs nothing unless a test leaves
// a stream open, and then the test sets its own.
func newFollower(_ testing.TB, s store.Backend, src *fakeLog) *follower {
	return &follower{
		ref: StreamRef{Run: "run-1", Namespace: "ns", Pod: "p", PodUID: "uid", Container: "agent", ContainerID: "c1"}, state: src.state,
		c: &Collector{Source: src, Store: s, slots: make(chan struct{}, 4), Log: logr.Discard(), Clock: clock.RealClock{},
			// DrainMax as in production: a stream that has sent nothing yet is
			// not drained because the machine is slow to deliver its first line.
			Follow: FollowOptions{BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond, DrainIdle: 5 * time.Second, DrainMax: time.Minute,
				BatchWait: 5 * time.Millisecond, BatchLines: 7, MaxStreamLifetime: time.Hour}},
	}
}

// writeBurst writes n lines where runs of 3 share a timestamp, spread over
// several seconds, so breaks land mid-second and mid-timestamp.
func writeBurst(src *fakeLog, from, n int) {
	for i := from; i < from+n; i++ {
		src.write(t0.Add(time.Duration(i/3)*300*time.Millisecond), fmt.Sprintf(`{"n":%d}`, i))
	}
}

func assertExactlyOnce(t *testing.T, s *bolt.Store, n int) {
	t.Helper()
	got, err := store.Lines(s, "run-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("stored %d lines, want %d", len(got), n)
	}
	for i, l := range got {
		if want := fmt.Sprintf(`{"n":%d}`, i); l.Line != want || l.Seq != uint64(i+1) {
			t.Fatalf("line %d: seq %d %q, want %q", i, l.Seq, l.Line, want)
		}
	}
}

func TestFollowerSurvivesBrokenStreams(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	src.breakAfter = []int{5, 1, 0, 13, 2, 40}
	writeBurst(src, 0, 60)
	f := newFollower(t, s, src)
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()
	writeBurst(src, 60, 40)
	src.end()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("follower did not finish within a minute of the container's end")
	}
	assertExactlyOnce(t, s, 100)
	if src.sessions < 7 {
		t.Errorf("%d sessions; the breaks were not exercised", src.sessions)
	}
}

// A stream cut after it delivered is reconnected after the shortest
// wait, however often it happens; only a source that fails without
// delivering anything backs off further. (With the backoff growing across
// cuts, a long run's stream sat idle for the 30 s maximum while its
// agent wrote on: the fleet benchmark's first runs.)
func TestFollowerReconnectsACutStreamPromptly(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	// A session resends the cursor's second (about 10 lines) first: 15
	// lines is progress, 0 is a failure.
	src.breakAfter = []int{15, 15, 15, 15, 15, 15, 0, 0, 15}
	writeBurst(src, 0, 150)
	f := newFollower(t, s, src)
	f.c.Follow.BackoffMin, f.c.Follow.BackoffMax = time.Millisecond, time.Second
	var mu sync.Mutex
	var waits []string
	wait := regexp.MustCompile(`retrying".*"in"=("[^"]*")`)
	f.c.Log = funcr.New(func(_, args string) {
		if m := wait.FindStringSubmatch(args); m != nil {
			mu.Lock()
			waits = append(waits, m[1])
			mu.Unlock()
		}
	}, funcr.Options{Verbosity: 1})
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()
	src.end()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("follower did not finish within a minute of the container's end")
	}
	assertExactlyOnce(t, s, 150)
	mu.Lock()
	defer mu.Unlock()
	// Six cuts after delivering, then two failures without a line (which
	// back off: 1ms after the cut before them, then 2ms), then a cut.
	want := []string{`"1ms"`, `"1ms"`, `"1ms"`, `"1ms"`, `"1ms"`, `"1ms"`, `"2ms"`, `"4ms"`, `"1ms"`}
	if strings.Join(waits, ",") != strings.Join(want, ",") {
		t.Errorf("waits before reconnecting %v, want %v", waits, want)
	}
}

// TestFollowerResumesAfterRestart: a follower killed mid-stream (context
// cancelled at an arbitrary point) and a new one on the same store produce
// every line exactly once.
func TestFollowerResumesAfterRestart(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	writeBurst(src, 0, 50)
	ctx, cancel := context.WithCancel(context.Background())
	f := newFollower(t, s, src)
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	for {
		if got, _ := store.Lines(s, "run-1", 0, 0); len(got) >= 20 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	writeBurst(src, 50, 50)
	src.mu.Lock()
	src.ended = true
	src.mu.Unlock()
	f2 := newFollower(t, s, src)
	f2.run(context.Background())
	assertExactlyOnce(t, s, 100)
}

// heldOpenLog serves its lines at once and then holds the stream open,
// never at EOF, as kwok does after a container ended. delivered is closed
// once a reader has asked for more after the last line: every line has
// then been queued for the follower (readLines reads again only when it
// has sent each whole line it read), so a stream with nothing queued has
// taken them all. At most 64 lines (readLines' queue) are sent without a
// follower taking any.
type heldOpenLog struct {
	data      []byte
	delivered chan struct{}
	once      sync.Once
}

func newHeldOpenLog(n int) *heldOpenLog {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s {\"n\":%d}\n", t0.Add(time.Duration(i/3)*300*time.Millisecond).Format(time.RFC3339Nano), i)
	}
	return &heldOpenLog{data: []byte(b.String()), delivered: make(chan struct{})}
}

// allQueued reports whether every line has been queued or taken.
func (h *heldOpenLog) allQueued() bool {
	select {
	case <-h.delivered:
		return true
	default:
		return false
	}
}

func (h *heldOpenLog) Stream(ctx context.Context, _, _, _ string, _ time.Time, _ bool) (io.ReadCloser, error) {
	return &heldOpenStream{log: h, rest: h.data, ctx: ctx, closed: make(chan struct{})}, nil
}

type heldOpenStream struct {
	log    *heldOpenLog
	rest   []byte
	ctx    context.Context
	closed chan struct{}
	once   sync.Once
}

func (s *heldOpenStream) Read(p []byte) (int, error) {
	if len(s.rest) > 0 {
		n := copy(p, s.rest)
		s.rest = s.rest[n:]
		return n, nil
	}
	s.log.once.Do(func() { close(s.log.delivered) })
	select {
	case <-s.closed:
		return 0, io.ErrClosedPipe
	case <-s.ctx.Done():
		return 0, s.ctx.Err()
	}
}

func (s *heldOpenStream) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// runWithin runs f until it returns, failing t if that takes over a
// minute: a bound for a follower that would otherwise never return.
func runWithin(t *testing.T, f *follower, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: the follower had not returned after a minute", what)
	}
}

// TestFollowerDrainsAnOpenStreamAfterTermination: a terminated container's
// stream that the server keeps open (kwok never ends one) is ended by the
// drain, with every line. The container reads as ended once its log was
// sent whole, so the drain cannot cut the stream short because this
// machine was slow to hand the lines over; nothing here depends on how
// long anything takes.
func TestFollowerDrainsAnOpenStreamAfterTermination(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newHeldOpenLog(10)
	f := newFollower(t, s, nil)
	f.c.Source = src
	f.state = func() containerState { return containerState{ended: src.allQueued()} }
	f.c.Follow.DrainIdle = 50 * time.Millisecond
	runWithin(t, f, "drain did not end the stream")
	assertExactlyOnce(t, s, 10)
}

func TestFollowerGivesUpWhenPodIsGone(t *testing.T) {
	s, _ := storetest.Open(t)
	f := newFollower(t, s, nil)
	f.c.Source = failingSource{}
	f.state = func() containerState { return containerState{gone: true} }
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("follower kept retrying a pod that is gone (still at it after a minute)")
	}
}

type failingSource struct{}

func (failingSource) Stream(context.Context, string, string, string, time.Time, bool) (io.ReadCloser, error) {
	return nil, errors.New(`pods "p" not found`)
}

// TestFollowerReconnectsBeforeLifetime: streams are cut proactively (as
// before an API server's long-request limit) and resumed exactly-once.
// Each burst is written once the follower has opened a new stream since
// the last one, so every burst lands in a later stream however slowly the
// machine runs it; no count depends on how much time passed.
func TestFollowerReconnectsBeforeLifetime(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	f := newFollower(t, s, src)
	f.c.Follow.MaxStreamLifetime = 20 * time.Millisecond
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()
	sessions := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.sessions
	}
	for i := 0; i < 10; i++ {
		before := sessions()
		writeBurst(src, i*9, 9)
		deadline := time.Now().Add(time.Minute)
		for sessions() == before {
			if time.Now().After(deadline) {
				t.Fatalf("burst %d: no new stream within a minute of a 20ms lifetime (%d so far)", i, before)
			}
			time.Sleep(time.Millisecond)
		}
	}
	src.end()
	<-done
	assertExactlyOnce(t, s, 90)
	if n := sessions(); n < 10 {
		t.Errorf("%d sessions for 10 bursts each after a reconnect", n)
	}
}

// countingSource records how many streams are open at once.
type countingSource struct {
	LogSource
	open, max *atomic.Int32
}

type countedStream struct {
	io.ReadCloser
	open *atomic.Int32
}

func (c countedStream) Close() error { c.open.Add(-1); return c.ReadCloser.Close() }

func (c countingSource) Stream(ctx context.Context, ns, pod, ctr string, since time.Time, prev bool) (io.ReadCloser, error) {
	rc, err := c.LogSource.Stream(ctx, ns, pod, ctr, since, prev)
	if err != nil {
		return nil, err
	}
	if n := c.open.Add(1); n > c.max.Load() {
		c.max.Store(n)
	}
	return countedStream{rc, c.open}, nil
}

// TestStreamBound: with one slot, two containers are followed one after
// the other, never at once, the wait is counted, and both complete.
func TestStreamBound(t *testing.T) {
	s, _ := storetest.Open(t)
	slots := make(chan struct{}, 1)
	var open, max atomic.Int32
	waitsBefore := testutil.ToFloat64(streamLimitWaits)
	var wg sync.WaitGroup
	for i, name := range []string{"a", "b"} {
		src := newFakeLog()
		for j := 0; j < 5; j++ {
			src.write(at(j), fmt.Sprintf("%s-%d", name, j))
		}
		src.ended = true
		f := newFollower(t, s, src)
		f.ref.Container, f.ref.ContainerID = name, fmt.Sprint(i)
		f.c.slots = slots
		f.c.Source = countingSource{src, &open, &max}
		wg.Add(1)
		go func() { defer wg.Done(); f.run(context.Background()) }()
	}
	wg.Wait()
	if max.Load() != 1 {
		t.Errorf("%d streams open at once with a bound of 1", max.Load())
	}
	if got, _ := store.Lines(s, "run-1", 0, 0); len(got) != 10 {
		t.Errorf("%d lines stored, want 10", len(got))
	}
	if testutil.ToFloat64(streamLimitWaits) <= waitsBefore {
		t.Error("waiting for a stream slot was not counted")
	}
}

// TestFollowerDropsLinesCutMidway: a stream broken in the middle of a line
// must not store the fragment (its timestamp would then hide the whole
// line on resume).
func TestFollowerDropsLinesCutMidway(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	src.breakAfter, src.cutMidLine = []int{4, 3, 7}, true
	writeBurst(src, 0, 30)
	src.ended = true
	newFollower(t, s, src).run(context.Background())
	assertExactlyOnce(t, s, 30)
}

// TestFollowerDrainOutlastsSlowCommits: a commit (fsync) slower than the
// drain idle time must not end the stream while lines wait to be read.
// Every commit here takes longer than DrainIdle and returns only once the
// rest of the log waits in the queue; the container reads as ended from
// then on. So at each batch tick after a commit the stream has been
// "quiet" for longer than DrainIdle with lines queued, and only the queue
// keeps it open (without that check, about half of the dozen ticks end it
// early); and it can end only once every line was taken, however slowly
// this machine hands them over.
func TestFollowerDrainOutlastsSlowCommits(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newHeldOpenLog(60)
	f := newFollower(t, s, nil)
	f.c.Source = src
	f.state = func() containerState { return containerState{ended: src.allQueued()} }
	f.c.Follow.DrainIdle, f.c.Follow.BatchLines, f.c.Follow.BatchWait = time.Millisecond, 5, time.Millisecond
	f.committed = func() {
		<-src.delivered                      // 60 lines fit the queue: the reader never waits for the follower
		time.Sleep(2 * f.c.Follow.DrainIdle) // the slow fsync
	}
	runWithin(t, f, "the drained stream was not ended")
	assertExactlyOnce(t, s, 60)
}

// TestLongLinesAreCut: a line longer than MaxLineBytes is stored cut, with
// a marker a reader can see, and the lines after it are whole.
func TestLongLinesAreCut(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	src.write(at(0), strings.Repeat("y", 5000))
	src.write(at(1), "after")
	src.ended = true
	f := newFollower(t, s, src)
	f.c.Follow.MaxLineBytes = 1000
	before := testutil.ToFloat64(linesTruncated)
	f.run(context.Background())
	got, _ := store.Lines(s, "run-1", 0, 0)
	if len(got) != 2 || !strings.HasSuffix(got[0].Line, TruncatedMarker) || len(got[0].Line) > 1000+len(TruncatedMarker) || got[1].Line != "after" {
		t.Fatalf("stored %d lines: %.60q… (%d bytes), %q", len(got), got[0].Line, len(got[0].Line), got[len(got)-1].Line)
	}
	if testutil.ToFloat64(linesTruncated) != before+1 {
		t.Error("the cut was not counted")
	}
}

// While lines flow, a stream does not read its pod on every batch tick
// (a cache read copies the pod; with 200 streams that was 15% of the
// relay's CPU): only once the stream has been quiet for DrainIdle.
func TestFollowerReadsThePodOnlyWhenQuiet(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	f := newFollower(t, s, src)
	f.c.Follow.BatchWait = time.Millisecond
	var reads atomic.Int32
	f.state = func() containerState { reads.Add(1); return src.state() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	for i := range 100 {
		src.write(t0.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf(`{"n":%d}`, i))
		// Stored at a batch tick (a batch holds 7): each line is followed
		// by at least one tick, which a stream reading its pod on every
		// tick would spend on the pod.
		poll.WaitFor(t, func() bool { got, _ := store.Lines(s, "run-1", uint64(i), 0); return len(got) > 0 }, fmt.Sprintf("line %d was never stored", i))
	}
	cancel()
	<-done
	if n := reads.Load(); n > 5 {
		t.Errorf("the pod was read %d times while its stream delivered 100 lines, each over a batch tick of its own", n)
	}
}

// TestFollowerRereadsALogThatEndedWhileFollowed: the kubelet ends a
// followed stream at the EOF of the file it was reading once the container
// has exited — under a fast writer, a rotated file, with the rest (the
// result among it) in the newest one. A stream that was open when the
// container ended is read once more from the cursor; only the EOF of one
// opened on an ended container is the end.
func TestFollowerRereadsALogThatEndedWhileFollowed(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	writeBurst(src, 0, 10)
	src.ended = true
	src.eofAfter = []int{5} // the first stream stops half way
	f := newFollower(t, s, src)
	f.state = src.endedAfterFirstStream
	f.run(context.Background())
	assertExactlyOnce(t, s, 10)
	if src.sessions != 2 {
		t.Errorf("%d streams, want the followed one and one final read", src.sessions)
	}
}

// TestFollowerRereadsAFollowThatWentQuietAfterTheEnd: the kubelet, under
// a writer faster than its rotation, can be left following a rotated file
// that will not grow, the stream open and silent, while the rest of the
// log (the result with it) is in the newest file. Quiet after its
// container ended, such a stream is not drained: the follower reads the
// log once more from its cursor.
func TestFollowerRereadsAFollowThatWentQuietAfterTheEnd(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	writeBurst(src, 0, 10)
	src.ended = true
	src.stallAfter = []int{5}
	f := newFollower(t, s, src)
	f.c.Follow.DrainIdle = 20 * time.Millisecond
	f.state = src.endedAfterFirstStream
	f.run(context.Background())
	assertExactlyOnce(t, s, 10)
	if src.sessions != 2 {
		t.Errorf("%d streams, want the quiet one and one final read", src.sessions)
	}
}

// TestFollowerStoresAFileServedAgainAfterItsOnlyLineOnce: the kubelet's
// follow, left behind a flood on a rotated file, reopens the newest file
// for each rotation it is told of, each time serving it again from its
// start; at the end of a flood that file can hold the result alone. The
// result read again, timestamp and text alike, is stored once: the log is
// read again from the cursor rather than the line taken for one written
// twice. (On the real node the flood's result was stored four times,
// TestRealAgentFloodKeepsItsTailAndResult.)
func TestFollowerStoresAFileServedAgainAfterItsOnlyLineOnce(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	for i := range 20 {
		src.write(at(i), fmt.Sprintf(`{"n":%d}`, i))
	}
	src.write(at(10000), `{"n":20}`) // the result, after a pause: the newest file's only line
	src.ended = true
	// The followed stream serves the newest file again after its last
	// line (on the real node, three times).
	src.againAfter, src.againFrom = []int{21}, 20
	f := newFollower(t, s, src)
	f.state = src.endedAfterFirstStream
	runWithin(t, f, "a file served again")
	assertExactlyOnce(t, s, 21)
}

// TestFollowerKeepsALineWrittenTwiceInOneWrite: CRI-O stamps the lines of
// one read of a container's output with one time, so a line written twice
// in one write comes twice with one timestamp and one text, as a file
// served again would. Both are stored, and a line written after them.
func TestFollowerKeepsALineWrittenTwiceInOneWrite(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	for _, l := range []line{{at(0), "a"}, {at(500), "x"}, {at(500), "x"}, {at(500), "y"}, {at(500), "x"}, {at(600), "b"}} {
		src.write(l.ts, l.text)
	}
	src.ended = true
	runWithin(t, newFollower(t, s, src), "a line written twice")
	texts := storedTexts(t, s)
	if strings.Join(texts, " ") != "a x x y x b" {
		t.Errorf("stored %q, want a x x y x b", texts)
	}
}

// afterClock is a fake clock that hands the test each wait the follower
// starts (After), for the test to step the clock by: time moves by those
// waits and as the test says, never by itself.
type afterClock struct {
	*clocktesting.FakeClock
	waits chan time.Duration
}

func (c *afterClock) After(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.After(d)
	c.waits <- d
	return ch
}

// TestFollowerBoundsTheReadsAgainAnAgentCauses: an agent that writes a
// line twice in one write (CRI-O stamps both alike), 1,000 times, makes
// each write a line the relay cannot tell from a file served again. The
// stream reads the log again from the cursor for unsureReads of them, each
// after the backoff, doubled; then, for unsureWindow, it stores such lines
// as written twice, counted and logged once. Every line is stored once,
// in unsureReads+1 pods/log requests, not one a write. Once the window
// has passed, the next writes are read again as often, no more.
func TestFollowerBoundsTheReadsAgainAnAgentCauses(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	const writes = 1000
	write := func(from int) {
		for i := from; i < from+writes; i++ {
			src.write(at(i), "x")
			src.write(at(i), "x")
		}
	}
	write(0)
	f := newFollower(t, s, src)
	f.c.Follow.BackoffMin, f.c.Follow.BackoffMax = 200*time.Millisecond, 30*time.Second
	clk := &afterClock{FakeClock: clocktesting.NewFakeClock(t0), waits: make(chan time.Duration)}
	f.c.Clock = clk
	var logged atomic.Int32
	f.c.Log = funcr.New(func(_, args string) {
		if strings.Contains(args, "read again too often") {
			logged.Add(1)
		}
	}, funcr.Options{})
	reads, kept := testutil.ToFloat64(reconnects.WithLabelValues("unsure")), testutil.ToFloat64(unsureStored)
	var mu sync.Mutex
	var waits []time.Duration
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case d := <-clk.waits:
				mu.Lock()
				waits = append(waits, d)
				mu.Unlock()
				clk.Step(d)
			case <-stop:
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()
	storedAll := func(n int) {
		t.Helper()
		poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.LastSeq >= uint64(n) }, fmt.Sprintf("%d lines were never stored", n))
	}
	sessions := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.sessions
	}
	storedAll(2 * writes)
	if n := sessions(); n != unsureReads+1 {
		t.Errorf("%d writes of a line twice: %d pods/log requests, want %d", writes, n, unsureReads+1)
	}

	clk.Step(unsureWindow)
	write(writes)
	storedAll(4 * writes)
	src.end() // the stream ends while followed: read once more from the cursor
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the follower had not returned after a minute")
	}
	if n := sessions(); n != 2*unsureReads+2 {
		t.Errorf("%d writes of a line twice, in two windows: %d pods/log requests, want %d", 2*writes, n, 2*unsureReads+2)
	}
	mu.Lock()
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	if got, want := fmt.Sprint(waits), fmt.Sprint(append(want, want...)); got != want {
		t.Errorf("waits before reading again: %s, want %s", got, want)
	}
	mu.Unlock()
	if got := testutil.ToFloat64(reconnects.WithLabelValues("unsure")) - reads; got != 2*unsureReads {
		t.Errorf("reconnects{cause=unsure}: %v, want %d", got, 2*unsureReads)
	}
	if got := testutil.ToFloat64(unsureStored) - kept; got != 2*(writes-unsureReads) {
		t.Errorf("unsure lines stored: %v, want %d", got, 2*(writes-unsureReads))
	}
	if n := logged.Load(); n != 2 {
		t.Errorf("logged %d times that the stream read again too often, want once a window", n)
	}
	got, err := store.Lines(s, "run-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4*writes {
		t.Fatalf("stored %d lines, want %d", len(got), 4*writes)
	}
	for i, l := range got {
		if !l.TS.Equal(at(i/2)) || l.Line != "x" {
			t.Fatalf("line %d: %v %q, want %v x", i, l.TS, l.Line, at(i/2))
		}
	}
}

// TestFollowerKeepsAnUnterminatedLastLine: a finished container's last line
// with no newline (printf of a result) is a line, not a fragment to resume.
func TestFollowerKeepsAnUnterminatedLastLine(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	src.write(t0, "first")
	src.writeUnterminated(t0.Add(time.Second), `{"type":"result","total_cost_usd":0.5}`)
	src.ended = true
	f := newFollower(t, s, src)
	f.run(context.Background())
	got, err := store.Lines(s, "run-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Line != `{"type":"result","total_cost_usd":0.5}` {
		t.Fatalf("stored %+v", got)
	}
}

// A line is committed as soon as the follower has taken every line the
// stream sent, not at the next batch tick: waiting for the tick added up
// to BatchWait (100 ms) to each line's way to a reader.
func TestFollowerCommitsOnceCaughtUp(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newFakeLog()
	f := newFollower(t, s, src)
	f.c.Follow.BatchWait, f.c.Follow.BatchLines = time.Hour, 1000
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	src.write(at(0), `{"n":0}`)
	poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.LastSeq == 1 }, "the line was not committed before the batch tick")
}

// TestAQuietStreamReadsItsPodSeldom: a stream quiet past DrainIdle reads
// its pod at most every DrainIdle/4, not at every tick; at 1,000 runs
// whose agents waited to write, those reads were a tenth of a replica's
// CPU.
func TestAQuietStreamReadsItsPodSeldom(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	reads := 0
	f := &follower{c: &Collector{Clock: clk, Follow: FollowOptions{DrainIdle: time.Second, DrainMax: time.Minute}},
		state: func() containerState { reads++; return containerState{} }}
	last := clk.Now()
	clk.Step(2 * time.Second)
	for range 30 { // 3 s of ticks
		if f.drained(0, last, last) {
			t.Fatal("a running container's stream drained")
		}
		clk.Step(100 * time.Millisecond)
	}
	if reads < 10 || reads > 12 {
		t.Errorf("%d reads of the pod in 3 s, want one every 250 ms", reads)
	}
	f.state = func() containerState { return containerState{ended: true} }
	clk.Step(250 * time.Millisecond)
	if !f.drained(0, last, last) {
		t.Error("an ended container's quiet stream did not drain")
	}
}

// pipeLog serves one stream, what the test writes to w.
type pipeLog struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func newPipeLog() *pipeLog { r, w := io.Pipe(); return &pipeLog{r, w} }

func (p *pipeLog) Stream(context.Context, string, string, string, time.Time, bool) (io.ReadCloser, error) {
	return p.r, nil
}

func (p *pipeLog) write(t *testing.T, ls ...line) {
	t.Helper()
	for _, l := range ls {
		if _, err := io.WriteString(p.w, l.ts.Format(time.RFC3339Nano)+" "+l.text+"\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// storedTexts are the texts of the lines stored for run-1.
func storedTexts(t *testing.T, s store.Backend) []string {
	t.Helper()
	got, err := store.Lines(s, "run-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, l := range got {
		texts = append(texts, l.Line)
	}
	return texts
}

// TestFollowerHoldsALineOutOfOrderUntilTheNext: the first line of a file
// the kubelet serves again, after the session read it joined to a rotated
// file's last head (TestResumeSkipsTheFirstLineOfAFileServedAgainAfterAJoin),
// is told from a line written out of order only by the line after it. The
// kubelet sends it alone, and the follower, caught up, would commit it at
// once: it holds it until the next line says which it is. Here the stream
// stays quiet after it for longer than the follower takes to commit.
func TestFollowerHoldsALineOutOfOrderUntilTheNext(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newPipeLog()
	f := newFollower(t, s, newFakeLog())
	f.c.Source = src
	f.state = func() containerState { return containerState{ended: true} }
	f.c.Follow.BatchWait, f.c.Follow.BatchLines = time.Hour, 1000
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()

	first := line{at(15700), "new 0"}
	newest := []line{first, {at(16000), "new 1"}, {at(16001), "new 2"}}
	src.write(t, line{at(0), "old 0"}, line{at(1), "old 1"}, line{at(2), "old 2 head," + first.text})
	src.write(t, newest[1:]...)
	poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.LastSeq == 5 }, "the first lines were not committed")
	src.write(t, first) // the newest file served again
	time.Sleep(50 * time.Millisecond)
	if r, _ := s.Run("run-1"); r.LastSeq != 5 {
		t.Errorf("a line out of order was committed before the next line came")
	}
	src.write(t, newest[1:]...)
	src.write(t, line{at(16500), "new 3"})
	_ = src.w.Close()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the follower had not returned after a minute")
	}
	if got, want := strings.Join(storedTexts(t, s), " | "), "old 0 | old 1 | old 2 head,new 0 | new 1 | new 2 | new 3"; got != want {
		t.Errorf("stored %q, want %q", got, want)
	}
}

// TestFollowerCommitsAHeldLineWithinATick: a line written out of order
// that nothing follows is committed at the next batch tick.
func TestFollowerCommitsAHeldLineWithinATick(t *testing.T) {
	s, _ := storetest.Open(t)
	src := newPipeLog()
	f := newFollower(t, s, newFakeLog())
	f.c.Source = src
	f.state = func() containerState { return containerState{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	defer func() { cancel(); _ = src.w.Close(); <-done }()
	src.write(t, line{at(0), "a"}, line{at(20), "b"}, line{at(10), "c, out of order"})
	poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.LastSeq == 3 }, "the line out of order was not committed")
}
