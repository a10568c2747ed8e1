package collect

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

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
			var conflicts atomic.Int64
			log := funcr.New(func(_, args string) {
				if strings.Contains(args, "retrying") && strings.Contains(args, "another writer stored lines") {
					conflicts.Add(1)
				}
			}, funcr.Options{Verbosity: 1})
			var done [2]chan struct{}
			for i, s := range []store.Backend{a, b} {
				f := newFollower(t, nil, src)
				f.store, f.log = s, log
				done[i] = make(chan struct{})
				go func() { f.run(context.Background()); close(done[i]) }()
			}
			// Both have read the (empty) cursor and opened their streams
			// before the first line: their first commits both start from it.
			waitFor(t, func() bool { src.mu.Lock(); defer src.mu.Unlock(); return src.sessions >= 2 }, "the followers did not open their streams")
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
			got, err := a.Lines("run-1", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d lines, %d commits refused, %d stream sessions", len(got), conflicts.Load(), src.sessions)
			if conflicts.Load() == 0 {
				t.Error("no commit was refused: both followers started from the same cursor, so the second commit from it must be")
			}
			if len(got) != n {
				t.Fatalf("stored %d lines, want %d", len(got), n)
			}
			for i, l := range got {
				if want := fmt.Sprintf(`{"n":%d}`, i); l.Line != want || l.Seq != uint64(i+1) {
					t.Fatalf("line %d: seq %d %q, want %q", i, l.Seq, l.Line, want)
				}
			}
		})
	}
}
