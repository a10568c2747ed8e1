package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
)

// Relay replicas whose connections to PostgreSQL go silent: the path
// drops packets without closing anything (a firewall's or NAT's state
// lost, a load balancer or PgBouncer failing over or frozen), so both ends
// wait for bytes that never come, while new connections get through.

// blackHoleFlood silences (swallow) connections of replica r2 mid-flood
// and returns the longest a line of a run r2 collected waited to be
// stored (read through r0) over the 20 s after that: every 100 ms what
// was written of each run is noted, and timed until stored. The flood
// then ends and is checked line by line. swallow says how many
// connections it silenced.
func blackHoleFlood(ctx context.Context, t *testing.T, in *harness.Install, rs *relayReplicas, name string, swallow func() int) time.Duration {
	t.Helper()
	// A flood at least one run of which replica r2 collects (the hash is
	// over the replicas' random ids).
	prefix := ""
	for i := 0; prefix == ""; i++ {
		p := fmt.Sprintf("%s%d", name, i)
		for j := range 6 {
			if rs.owner(t, fmt.Sprintf("%s-%d", p, j)) == 2 {
				prefix = p
			}
		}
	}
	f := startFlood(in, ctx, t, prefix, 6)
	theirs := rs.runsOf(t, 2, f.Runs)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, atLeast(100), "before the black hole")
	n := swallow()
	swallowed := time.Now()
	t.Logf("swallowed %d of replica r2's connections; it collects %v", n, theirs)
	type mark struct {
		at      time.Time
		written int
	}
	pending := map[string][]mark{}
	var worst time.Duration
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		now := time.Now()
		left := 0
		for _, run := range theirs {
			if now.Sub(swallowed) < 20*time.Second {
				pending[run] = append(pending[run], mark{now, f.Written(run)})
			}
			s := stored(t, rs.relays[0], rs.token, run)
			for len(pending[run]) > 0 && pending[run][0].written <= s {
				worst = max(worst, now.Sub(pending[run][0].at))
				pending[run] = pending[run][1:]
			}
			left += len(pending[run])
		}
		return now.Sub(swallowed) >= 20*time.Second && left == 0, nil
	})
	if err != nil {
		t.Fatalf("lines written in the 20 s after replica r2's connections went silent were not stored within five minutes: %v", err)
	}
	t.Logf("in the 20 s after the black hole, a line of r2's runs waited at most %s to be stored (lease %s, renewal %s)", worst.Round(100*time.Millisecond),
		relay.DefaultOptions().Replicas.LeaseDuration, relay.DefaultOptions().Replicas.RenewInterval)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(60), "after the black hole")
	rs.waitMembers(ctx, t, 0, 1, 2)
	f.end(ctx, t, rs)
	return worst
}

// TestHostileRelayBlackHoledAPIServerHandsOverItsRuns: one replica's
// connections to the API server (its clients', its log streams') go
// silent; new ones get through. It follows no log meanwhile, so its runs
// must pass to the others. It notices only by its pings of the API
// server, two failures in a row of 5 s each (13.7 s measured, against
// 4-5 s for a dead replica); allowed here 30 s, well short of the 45 s
// client-go's HTTP/2 health check takes to drop the connection.
func TestHostileRelayBlackHoledAPIServerHandsOverItsRuns(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	proxy := rs.restartBehindAPIProxy(ctx, t)
	took := blackHoleFlood(ctx, t, in, rs, "e2e-hole-api", proxy.swallow)
	if bound := 30 * time.Second; took > bound {
		t.Errorf("replica r2's runs went uncollected for %s with its API server connections silent: more than %s", took.Round(100*time.Millisecond), bound)
	}
}
