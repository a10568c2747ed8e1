package webhook

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// Releaser frees an agent's claim as soon as its Job finishes or is
// deleted, and sweeps stale claims periodically. It runs on the elected
// leader only; the admission path never depends on it (a claim whose Job
// finished is free to take anyway), it only keeps claims from piling up
// and makes "deleted" visible without waiting for the grace window.
type Releaser struct {
	Client  kubernetes.Interface
	Claims  *policy.Claims
	Configs ConfigSource
	// SweepInterval between full sweeps. Default 1m.
	SweepInterval time.Duration
	Log           logr.Logger
}

// NeedLeaderElection makes the manager run it on the leader only.
func (r *Releaser) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (r *Releaser) Start(ctx context.Context) error {
	if r.SweepInterval <= 0 {
		r.SweepInterval = time.Minute
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = templates.LabelAgentID
			return r.Client.BatchV1().Jobs(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = templates.LabelAgentID
			return r.Client.BatchV1().Jobs(metav1.NamespaceAll).Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &batchv1.Job{}, 0, cache.Indexers{})
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if job, ok := obj.(*batchv1.Job); ok && (policy.Finished(job) || policy.Deleted(job)) {
				r.release(ctx, job, "finished")
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if job, ok := obj.(*batchv1.Job); ok {
				r.release(ctx, job, "deleted")
			}
		},
	})
	if err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	r.Log.Info("claim releaser started", "sweepInterval", r.SweepInterval)
	t := time.NewTicker(r.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			cc := r.Configs.Current().Policy.Concurrency
			n, err := r.Claims.Sweep(ctx, time.Duration(cc.PendingGraceSeconds)*time.Second)
			if err != nil {
				r.Log.Error(err, "sweeping claims")
			}
			if n > 0 {
				claimsReleased.WithLabelValues("sweep").Add(float64(n))
				r.Log.Info("released stale claims", "count", n)
			}
		}
	}
}

func (r *Releaser) release(ctx context.Context, job *batchv1.Job, trigger string) {
	ok, err := r.Claims.Release(ctx, job, r.Configs.Current().Policy.Concurrency)
	if err != nil {
		r.Log.Error(err, "releasing claim", "job", job.Namespace+"/"+job.Name)
		return
	}
	if ok {
		claimsReleased.WithLabelValues(trigger).Inc()
		r.Log.V(1).Info("claim released", "job", job.Namespace+"/"+job.Name, "agent", job.Labels[templates.LabelAgentID], "trigger", trigger)
	}
}
