package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// admissionLoop creates Jobs (dry runs, through both webhooks) from four
// clients at once until stop is closed, so admissions are in flight
// whenever a replica stops, counting what was admitted mutated and what
// failed.
func admissionLoop(ctx context.Context, t *testing.T, name string, stop <-chan struct{}) (ok, failed *atomic.Int64, lastErr *atomic.Value, done <-chan struct{}) {
	ok, failed, lastErr = &atomic.Int64{}, &atomic.Int64{}, &atomic.Value{}
	cfg := *env.cluster.Config
	cfg.QPS, cfg.Burst = 1000, 1000 // the client's own limiter must not serialize the loop
	fast := kubernetes.NewForConfigOrDie(&cfg)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				job := bareJob(t, fmt.Sprintf("%s-%d-%d", name, w, i))
				stored, err := fast.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if err != nil || stored.Annotations[contract.AnnotationProfile] == "" {
					failed.Add(1)
					lastErr.Store(fmt.Sprint(err))
					continue
				}
				ok.Add(1)
			}
		}()
	}
	d := make(chan struct{})
	go func() { wg.Wait(); close(d) }()
	return ok, failed, lastErr, d
}

// reaches waits until n (an admission loop's count) reaches want, for
// two minutes at most, and reports whether it did. It does not fail the
// test: the caller stops the loop first.
func reaches(ctx context.Context, n *atomic.Int64, want int64) bool {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return n.Load() >= want, nil
	}) == nil
}

// TestRollingRestart: two replicas behind a balancer that follows their
// readiness, as a Service does. While a loop creates Jobs, each replica in
// turn gets SIGTERM — it keeps serving, not ready, for its shutdown delay,
// closing connections after each answer — and starts again, as a rolling
// update does: zero failed admissions.
func TestRollingRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var replicas []*harness.Webhook
	for i := range 2 {
		wh, err := harness.StartWebhook(ctx, env.cluster, env.webhookBin, fmt.Sprintf("webhook-rolling-%d", i),
			harness.Root()+"/examples/config.yaml", "--shutdown-delay", "2s")
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
	if err := harness.Register(ctx, env.cs, lb.Addr, env.cluster.CA.CertPEM); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := harness.Register(context.Background(), env.cs, env.webhookAddr, env.cluster.CA.CertPEM); err != nil {
			t.Error(err)
		}
	})
	// Until the API server calls the balancer.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, _ = env.cs.BatchV1().Jobs(ns).Create(ctx, bareJob(t, "e2e-rolling-probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
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
	ok, failed, lastErr, done := admissionLoop(ctx, t, "e2e-rolling", stop)
	stalled := ""
	if !reaches(ctx, ok, 5) {
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
		case !reaches(ctx, ok, ok.Load()+5):
			stalled = fmt.Sprintf("admissions stopped after replica %d restarted", i)
		}
	}
	// Both replicas are restarted ones now: the loop's calls reach them.
	if stalled == "" && wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return calls(replicas[0])+calls(replicas[1]) > 0, nil
	}) != nil {
		t.Error("no admission reached a restarted replica")
	}
	if stalled == "" && !reaches(ctx, ok, 20) {
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
