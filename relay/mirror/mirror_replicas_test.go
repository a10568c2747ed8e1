package mirror

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// TestTwoRelaysMirrorARunOnce: for the seconds two relay replicas both
// own a run, both sync its mirror file on the shared volume, from the
// same store, while its lines are committed. One sync at a time (a lock
// on the file), each from what the other recorded: the file never
// shrinks under a reader tailing it, and holds each line once.
func TestTwoRelaysMirrorARunOnce(t *testing.T) {
	s, a := mirrorFixture(t)
	b := &Mirror{Dir: a.Dir, Store: s} // another relay: its own per-run locks
	const n = 600
	var appended atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for i := range n {
			if _, err := storetest.Append(s, "run-1", "agent", store.Cursor{TS: int64(i + 1), Count: 1}, storetest.Lines("agent", fmt.Sprintf(`{"n":%d}`, i)), time.Now()); err != nil {
				t.Error(err)
				return
			}
			appended.Add(1)
		}
	})
	for _, m := range []*Mirror{a, b} {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				// Given up on the other's lock (mirrorLockWait; two syncs
				// back to back can keep it from each other): skipped, as
				// a follower does, and caught up by the next.
				if err := m.Sync("run-1"); err != nil && !errors.Is(err, ErrLocked) {
					t.Error(err)
					return
				}
			}
		})
	}
	var shrank atomic.Value
	wg.Go(func() {
		r, _ := s.Run("run-1")
		path, last := a.Path(r), int64(0)
		for {
			select {
			case <-done:
				return
			default:
			}
			if st, err := os.Stat(path); err == nil {
				if st.Size() < last {
					shrank.Store(fmt.Sprintf("%d bytes after %d", st.Size(), last))
				}
				last = st.Size()
			}
		}
	})
	wg.Wait()
	if err := a.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	if v := shrank.Load(); v != nil {
		t.Errorf("a reader saw the mirror file cut back: %s", v)
	}
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "{\"n\":%d}\n", i)
	}
	if got := readMirror(t, a); got != want.String() {
		lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
		t.Fatalf("mirror holds %d lines, want %d, each once in order (first: %.200q)", len(lines), n, got)
	}
}
