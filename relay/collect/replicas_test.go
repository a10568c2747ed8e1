package collect

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// TestTwoFollowersOfOneStreamStoreEachLineOnce: two relays that both
// believe they own a container's stream follow it at once, from the same
// stored cursor, each with its own connection to the store. Each commit is
// refused unless the stream's stored cursor is still the one its follower
// last saw; the refused follower reconnects and resumes from the stored
// cursor. Every line is stored once, in order. On bbolt the two followers
// share the one store; on PostgreSQL each has its own pool, as two relay
// replicas do.
func TestTwoFollowersOfOneStreamStoreEachLineOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(t *testing.T) (store.Backend, store.Backend)
	}{
		{"bolt", func(t *testing.T) (store.Backend, store.Backend) {
			s, _ := storetest.Open(t)
			return s, s
		}},
		{"postgres", func(t *testing.T) (store.Backend, store.Backend) {
			srv, err := pgtest.Start()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Stop() })
			open := func() store.Backend {
				s, err := postgres.Open(context.Background(), postgres.Options{ConnString: srv.ConnString("postgres")})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			return open(), open()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.open(t)
			src := newFakeLog()
			refusedBefore := testutil.ToFloat64(reconnects.WithLabelValues("refused"))
			var conflicts atomic.Int64
			log := funcr.New(func(_, args string) {
				if strings.Contains(args, "retrying") && strings.Contains(args, "another writer stored lines") {
					conflicts.Add(1)
				}
			}, funcr.Options{Verbosity: 1})
			var done [2]chan struct{}
			for i, s := range []store.Backend{a, b} {
				f := newFollower(t, nil, src)
				f.c.Store, f.c.Log = s, log
				done[i] = make(chan struct{})
				go func() { f.run(context.Background()); close(done[i]) }()
			}
			// Both have read the (empty) cursor and opened their streams
			// before the first line: their first commits both start from it.
			poll.WaitFor(t, func() bool { src.mu.Lock(); defer src.mu.Unlock(); return src.sessions >= 2 }, "the followers did not open their streams")
			const n = 400
			for i := 0; i < n; i += 40 {
				writeBurst(src, i, 40)
			}
			src.end()
			for i := range done {
				select {
				case <-done[i]:
				case <-time.After(time.Minute):
					t.Fatalf("follower %d did not finish within a minute of the container's end", i)
				}
			}
			t.Logf("%d commits refused, %d stream sessions", conflicts.Load(), src.sessions)
			if conflicts.Load() == 0 {
				t.Error("no commit was refused: both followers started from the same cursor, so the second commit from it must be")
			}
			// Operators see the refusals in the reconnects' cause.
			if refused := testutil.ToFloat64(reconnects.WithLabelValues("refused")) - refusedBefore; refused != float64(conflicts.Load()) {
				t.Errorf("clipjob_relay_reconnects_total{cause=\"refused\"} rose by %v, want %d: one for each refused commit", refused, conflicts.Load())
			}
			storedEachOnce(t, a, n)
		})
	}
}

// TestFollowerSurvivesAPostgresRestart: the PostgreSQL server crashes and
// comes back while a follower stores a flood. Commits in flight fail, or
// commit with their answer lost; the follower reconnects, resumes from the
// stored cursor, and every line is stored once.
func TestFollowerSurvivesAPostgresRestart(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	s, err := postgres.Open(context.Background(), postgres.Options{ConnString: srv.ConnString("postgres"), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	src := newFakeLog()
	f := newFollower(t, nil, src)
	f.c.Store = s
	done := make(chan struct{})
	go func() { f.run(context.Background()); close(done) }()

	written, stop := writeOn(src, 9)
	poll.WaitFor(t, func() bool { return lastSeq(s) >= 200 }, "the follower stored nothing before the restart")
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	after := written.Load()
	poll.WaitFor(t, func() bool { return lastSeq(s) >= uint64(after)+200 }, "the follower stored nothing after the restart")
	stop()
	src.end()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("follower did not finish within a minute of the container's end")
	}
	t.Logf("%d lines by the time the server was back, %d stream sessions", after, src.sessions)
	storedEachOnce(t, s, int(written.Load()))
}

// writeOn has the agent write bursts of burst lines to src, paced, until
// stop, which waits for the last; written counts them.
func writeOn(src *fakeLog, burst int) (written *atomic.Int64, stop func()) {
	written = &atomic.Int64{}
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-quit:
				return
			case <-time.After(time.Millisecond):
			}
			writeBurst(src, int(written.Load()), burst)
			written.Add(int64(burst))
		}
	}()
	return written, func() { close(quit); <-stopped }
}

// lastSeq is run-1's last stored sequence number in s (0: none yet).
func lastSeq(s store.Backend) uint64 {
	r, _ := s.Run("run-1")
	if r == nil {
		return 0
	}
	return r.LastSeq
}

// storedEachOnce checks that s holds the n lines writeBurst wrote to
// run-1, each once, in order.
func storedEachOnce(t *testing.T, s store.Backend, n int) {
	t.Helper()
	var got []store.Line
	for after := uint64(0); ; {
		more, err := store.Lines(s, "run-1", after, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(more) == 0 {
			break
		}
		got, after = append(got, more...), more[len(more)-1].Seq
	}
	t.Logf("%d lines written, %d stored", n, len(got))
	if len(got) != n {
		t.Fatalf("stored %d lines, want %d", len(got), n)
	}
	for i, l := range got {
		if want := fmt.Sprintf(`{"n":%d}`, i); l.Line != want || l.Seq != uint64(i+1) {
			t.Fatalf("line %d: seq %d %q, want %q", i, l.Seq, l.Line, want)
		}
	}
}

// TestRunsHandedOverBetweenRelaysStoreEachLineOnce: two relays, each with
// its own connection to one PostgreSQL store, follow one pod while a flood
// of lines is written, and the run is handed back and forth between them
// (Owns, then Rebalance on both, as a change of the members does),
// sometimes with both owning it at once (their views of the members
// differ for a moment). Each line is stored once, in order, and the run
// is finished once.
func TestRunsHandedOverBetweenRelaysStoreEachLineOnce(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	var owner atomic.Value
	owner.Store("a")
	logs, cache := &podLogs{logs: map[string]*fakeLog{}}, &podCache{pods: map[string]*corev1.Pod{}}
	relay := func(name string) (*Collector, store.Backend) {
		s, err := postgres.Open(context.Background(), postgres.Options{ConnString: srv.ConnString("postgres")})
		if err != nil {
			t.Fatal(err)
		}
		c := &Collector{Store: s, Source: logs, Pods: cache, Log: logr.Discard(),
			Owns: func(string) bool { o := owner.Load().(string); return o == name || o == "both" },
			Follow: FollowOptions{DrainIdle: 5 * time.Second, DrainMax: time.Minute, BatchWait: 5 * time.Millisecond, BatchLines: 16,
				BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond}}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); c.Stop(); s.Close() })
		c.Start(ctx)
		return c, s
	}
	a, s := relay("a")
	b, _ := relay("b")
	pod := agentPod("p1", "uid-1", time.Now())
	pod.Status.Phase = corev1.PodRunning
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{terminated("setup", "c-setup")}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", ContainerID: "c-agent",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	logs.end("p1", "setup")
	cache.set(pod)
	for _, c := range []*Collector{a, b} {
		c.OnPod(pod)
	}
	agent := logs.get("p1", "agent")
	written, stop := writeOn(agent, 6)
	for i, next := range []string{"b", "both", "a", "both", "b", "a"} {
		at := lastSeq(s)
		poll.WaitFor(t, func() bool { return lastSeq(s) >= at+100 }, fmt.Sprintf("handover %d: nothing stored", i))
		owner.Store(next)
		for _, c := range []*Collector{a, b} {
			c.Rebalance()
		}
	}
	stop()
	final := pod.DeepCopy()
	final.Status.Phase = corev1.PodSucceeded
	final.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-agent")}
	cache.set(final)
	agent.end()
	for _, c := range []*Collector{a, b} {
		c.OnPod(final)
	}
	poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.Done }, "the run was not finished")
	t.Logf("%d stream sessions", agent.sessions)
	storedEachOnce(t, s, int(written.Load()))
}
