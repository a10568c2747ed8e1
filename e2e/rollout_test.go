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

// TestRollingRestart: two replicas behind a balancer that follows their
// readiness, as a Service does. While a loop creates Jobs, each replica in
// turn gets SIGTERM — it keeps serving, not ready, for its shutdown delay,
// closing connections after each answer — and starts again, as a rolling
// update does: zero failed admissions.
func TestRollingRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, _ = env.cs.BatchV1().Jobs(ns).Create(ctx, bareJob(t, "e2e-rolling-probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		n, _ := replicas[0].Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		m, _ := replicas[1].Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		return n+m > 0, nil // it keeps its connection: one replica takes the calls until that closes
	}); err != nil {
		t.Fatal("the API server never called the replicas through the balancer")
	}

	stop := make(chan struct{})
	ok, failed, lastErr, done := admissionLoop(ctx, t, "e2e-rolling", stop)
	time.Sleep(time.Second)
	for _, r := range replicas {
		r.Stop() // SIGTERM; returns once the process has exited
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	close(stop)
	<-done
	calls := func(r *harness.Webhook) float64 {
		n, _ := r.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		return n
	}
	t.Logf("rolling restart of 2 replicas: %d admissions, %d failed; calls since each replica's restart: %.0f, %.0f",
		ok.Load(), failed.Load(), calls(replicas[0]), calls(replicas[1]))
	if calls(replicas[0]) == 0 && calls(replicas[1]) == 0 {
		t.Error("no admission reached a restarted replica")
	}
	if failed.Load() != 0 {
		t.Errorf("%d admissions failed during the rolling restart; last: %v", failed.Load(), lastErr.Load())
	}
	if ok.Load() < 20 {
		t.Errorf("only %d admissions: the loop did not run", ok.Load())
	}
}
