package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestRollingRestart: two replicas behind a balancer that follows their
// readiness, as a Service does. While a loop creates Jobs, each replica in
// turn gets SIGTERM — it keeps serving, not ready, for its shutdown delay,
// closing connections after each answer — and starts again, as a rolling
// update does: zero failed admissions.
func TestRollingRestart(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var replicas []*harness.Webhook
	// The shutdown delay is long enough that each connection the API
	// server keeps to a stopping replica carries a request, answered with
	// Connection: close, before the replica exits: one still idle then is
	// closed under the API server's next request on it (EOF). At 2 s a
	// loaded machine (load average 60) lost one admission so.
	for i := range 2 {
		wh, err := in.StartReplica(ctx, fmt.Sprintf("%s-webhook-rolling-%d", in.Namespace, i), "--shutdown-delay", "6s")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wh.Stop)
		replicas = append(replicas, wh)
	}
	lb, err := harness.StartServiceBalancer(replicas...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Stop)
	if err := in.Register(ctx, harness.RegisterOptions{Addr: lb.Addr}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Register(context.Background(), harness.RegisterOptions{}); err != nil {
			t.Error(err)
		}
	})
	// Until the API server calls the balancer.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, _ = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-rolling-probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		n, _ := replicas[0].Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		m, _ := replicas[1].Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		return n+m > 0, nil // it keeps its connection: one replica takes the calls until that closes
	}); err != nil {
		t.Fatal("the API server never called the replicas through the balancer")
	}

	calls := func(r *harness.Webhook) float64 {
		n, _ := r.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		return n
	}
	// Each step waits for what it needs, not for a second: the loop
	// admitting, a restarted replica back in the balancer (before the
	// other one goes), admissions going on.
	stop := make(chan struct{})
	ok, failed, lastErr, done := in.AdmissionLoop(ctx, t, "e2e-rolling", stop)
	stalled := ""
	if !harness.Reaches(ctx, ok, 5) {
		stalled = "the loop never got going"
	}
	for i, r := range replicas {
		if stalled != "" {
			break
		}
		r.Stop() // SIGTERM; returns once the process has exited
		if err := r.Start(ctx); err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
		back := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			return lb.Routes(r.Addr), nil
		})
		switch {
		case back != nil:
			stalled = fmt.Sprintf("the balancer never routed to replica %d again after its restart", i)
		case !harness.Reaches(ctx, ok, ok.Load()+5):
			stalled = fmt.Sprintf("admissions stopped after replica %d restarted", i)
		}
	}
	// Both replicas are restarted ones now: the loop's calls reach them.
	if stalled == "" && wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return calls(replicas[0])+calls(replicas[1]) > 0, nil
	}) != nil {
		t.Error("no admission reached a restarted replica")
	}
	if stalled == "" && !harness.Reaches(ctx, ok, 20) {
		stalled = "fewer than 20 admissions"
	}
	close(stop)
	<-done
	t.Logf("rolling restart of 2 replicas: %d admissions, %d failed; calls since each replica's restart: %.0f, %.0f",
		ok.Load(), failed.Load(), calls(replicas[0]), calls(replicas[1]))
	if stalled != "" {
		t.Errorf("%s; see %s and %s", stalled, replicas[0].Log, replicas[1].Log)
	}
	if failed.Load() != 0 {
		t.Errorf("%d admissions failed during the rolling restart; last: %v", failed.Load(), lastErr.Load())
	}
	if ok.Load() < 20 {
		t.Errorf("only %d admissions: the loop did not run", ok.Load())
	}
}
