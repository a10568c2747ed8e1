package harness

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/contract"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// AdmissionLoop creates Jobs (dry runs, through both webhooks) from four
// clients at once until stop is closed, so admissions are in flight
// whenever a replica stops, counting what was admitted mutated and what
// failed. Each client pauses briefly between its creates: four back to
// back took the API server and the webhooks a core between them, for
// no more admissions in flight at a stop.
func (in *Install) AdmissionLoop(ctx context.Context, t *testing.T, name string, stop <-chan struct{}) (ok, failed *atomic.Int64, lastErr *atomic.Value, done <-chan struct{}) {
	ok, failed, lastErr = &atomic.Int64{}, &atomic.Int64{}, &atomic.Value{}
	cfg := *in.c.Config
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
				case <-time.After(loopPause):
				}
				job := in.BareJob(t, fmt.Sprintf("%s-%d-%d", name, w, i))
				stored, err := fast.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
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

// loopPause is what each of AdmissionLoop's clients waits between creates.
const loopPause = 10 * time.Millisecond

// Reaches waits until n (an admission loop's count) Reaches want, for
// two minutes at most, and reports whether it did. It does not fail the
// test: the caller stops the loop first.
func Reaches(ctx context.Context, n *atomic.Int64, want int64) bool {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return n.Load() >= want, nil
	}) == nil
}
