package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestHostileRelayBboltRelayBesideReplicasOnOneMirror: a release moved
// from relay.store bbolt to postgres with a rolling update runs the old
// bbolt relay beside the new replicas for a while, all mirroring into one
// volume, each store recording how far it wrote each file. Each cut the
// files back to its own record, so an adapter tailing them saw them
// shrink, again and again (the second hostile review). A reader polling
// the three runs' files every 5 ms through a flood sees them only grow,
// and they end with every line once.
func TestHostileRelayBboltRelayBesideReplicasOnOneMirror(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	old, err := harness.StartRelay(ctx, suite.cluster, replicasSetup.bin, "relay-bbolt-beside-"+rs.group, in.Namespace, "--mirror-dir", rs.mirror)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Stop()
	f := startFlood(in, ctx, t, "e2e-mirror-shared", 3)
	var files []string
	for _, run := range f.runs {
		files = append(files, filepath.Join(rs.mirror, "run-logs", "acme", "agent-"+run, run+".pod.ndjson"))
	}
	var mu sync.Mutex
	var shrinks []string
	polls := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		sizes := make([]int64, len(files))
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			mu.Lock()
			polls++
			for i, file := range files {
				st, err := os.Stat(file)
				if err != nil {
					continue // not created yet
				}
				if st.Size() < sizes[i] {
					shrinks = append(shrinks, fmt.Sprintf("%s: %d -> %d bytes", filepath.Base(file), sizes[i], st.Size()))
				}
				sizes[i] = st.Size()
			}
			mu.Unlock()
		}
	})
	// Both stores hold a good part of every run, so that both write it.
	for _, run := range f.runs {
		waitStoredAtLeast(ctx, t, rs.relays[0], rs.token, run, 600, "in the flood (PostgreSQL)")
		waitStoredAtLeast(ctx, t, old, rs.token, run, 600, "in the flood (the bbolt relay)")
	}
	f.end(ctx, t, rs)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(shrinks) > 0 {
		t.Fatalf("a reader polling the mirror files every 5 ms saw them cut back %d times: %v", len(shrinks), shrinks[:min(len(shrinks), 10)])
	}
	t.Logf("%d polls of %d files: none shrank", polls, len(files))
}
