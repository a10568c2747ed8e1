// Command bench is the load half of `make bench`: it creates agent Jobs
// through a real kube-apiserver on loopback, first with no clipjob webhook
// registered (the baseline), then with the mutating and validating
// webhooks, and prints latency percentiles and throughput side by side.
//
// Jobs are created suspended so the Job controller, scheduler and kwok do
// not compete for the two cores with what is measured: admission.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

func main() {
	n := flag.Int("n", 300, "Jobs per scenario")
	conc := flag.String("c", "1,10,50", "client concurrency levels")
	flag.Parse()
	if err := run(*n, *conc); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type result struct {
	name                 string
	c, ok, refused, errs int
	lat                  []time.Duration
	wall                 time.Duration
}

func (r result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func run(n int, concList string) error {
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Options{Log: os.Stderr})
	if err != nil {
		return err
	}
	defer c.Stop()
	wh, _, err := harness.Install(ctx, c, "webhook")
	if err != nil {
		return err
	}
	defer wh.Stop()
	cfg := *c.Config
	cfg.QPS, cfg.Burst = 5000, 5000
	cs := kubernetes.NewForConfigOrDie(&cfg)

	var levels []int
	for _, s := range strings.Split(concList, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		levels = append(levels, v)
	}
	if err := unregister(ctx, cs); err != nil {
		return err
	}
	// Warm up the API server's and the webhook's connections and caches.
	if _, err := create(ctx, cs, "warm", 50, 10, false); err != nil {
		return err
	}
	var results []result
	for _, conc := range levels {
		base, err := create(ctx, cs, fmt.Sprintf("base-c%d", conc), n, conc, false)
		if err != nil {
			return err
		}
		base.name = "no webhooks (baseline)"
		if err := harness.Register(ctx, cs, wh.Addr, c.CA.CertPEM); err != nil {
			return err
		}
		with, err := create(ctx, cs, fmt.Sprintf("hook-c%d", conc), n, conc, false)
		if err != nil {
			return err
		}
		with.name = "clipjob mutating + validating"
		busy, err := create(ctx, cs, fmt.Sprintf("busy-c%d", conc), n, conc, true)
		if err != nil {
			return err
		}
		busy.name = "clipjob, one agent (409s)"
		if err := unregister(ctx, cs); err != nil {
			return err
		}
		results = append(results, base, with, busy)
	}
	fmt.Printf("\nJob creation through kube-apiserver %s on loopback, %d Jobs per row (suspended), %d CPUs\n\n", version(cs), n, cpus())
	fmt.Println("| scenario | concurrency | admitted | refused 409 | p50 | p95 | p99 | Jobs/s | p50 vs baseline |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for i, r := range results {
		base := results[i-i%3]
		ratio := float64(r.pct(0.5)) / float64(base.pct(0.5))
		fmt.Printf("| %s | %d | %d | %d | %s | %s | %s | %.0f | %.2fx |\n", r.name, r.c, r.ok, r.refused,
			ms(r.pct(0.5)), ms(r.pct(0.95)), ms(r.pct(0.99)), float64(len(r.lat))/r.wall.Seconds(), ratio)
		if r.errs > 0 {
			fmt.Printf("|   (%d unexpected errors) |||||||||\n", r.errs)
		}
	}
	return nil
}

func create(ctx context.Context, cs kubernetes.Interface, prefix string, n, conc int, sameAgent bool) (result, error) {
	r := result{c: conc}
	var mu sync.Mutex
	var firstErr error
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				agent := fmt.Sprintf("%s-%d", prefix, i)
				if sameAgent {
					agent = prefix
				}
				job := &batchv1.Job{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i), Namespace: "paperclip",
						Labels: map[string]string{"paperclip.io/agent-id": agent, "paperclip.io/run-id": fmt.Sprintf("%s-%d", prefix, i),
							"paperclip.io/adapter-type": "claude_local"}},
					Spec: batchv1.JobSpec{Suspend: ptr.To(true)},
				}
				// The baseline has no webhook to fill the pod template in.
				job.Spec.Template.Spec.RestartPolicy = "Never"
				job.Spec.Template.Spec.Containers = nil
				if !strings.HasPrefix(prefix, "hook") && !strings.HasPrefix(prefix, "busy") {
					job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers,
						baselineContainer())
				}
				t0 := time.Now()
				_, err := cs.BatchV1().Jobs("paperclip").Create(ctx, job, metav1.CreateOptions{})
				d := time.Since(t0)
				mu.Lock()
				r.lat = append(r.lat, d)
				switch {
				case err == nil:
					r.ok++
				case sameAgent && strings.Contains(err.Error(), "already has an active run"):
					r.refused++
				default:
					r.errs++
					if firstErr == nil {
						firstErr = err
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	r.wall = time.Since(start)
	if r.errs > 0 {
		fmt.Fprintf(os.Stderr, "bench: %s: %d errors, first: %v\n", prefix, r.errs, firstErr)
	}
	return r, nil
}

func unregister(ctx context.Context, cs kubernetes.Interface) error {
	if err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, harness.MutatingWebhookName, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, harness.ValidatingWebhookName, metav1.DeleteOptions{}); err != nil {
		return err
	}
	// The API server learns of the deletion through a watch; give it a
	// moment so the baseline really runs without webhooks.
	time.Sleep(time.Second)
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func version(cs kubernetes.Interface) string {
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return "?"
	}
	return v.GitVersion
}
