package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/policy"
)

// ClaimController frees an agent's claim as soon as
// its Job finishes or is deleted, sweeps stale claims periodically, and in
// Queue mode starts the oldest queued run of an agent that became free. It
// runs on the elected leader only. Admission never depends on it for
// safety: a claim whose Job finished is free to take anyway, and starting
// a queued run goes through the validating webhook like any unsuspend.
type ClaimController struct {
	Client  kubernetes.Interface
	Claims  *policy.Claims
	Configs ConfigSource
	// SweepInterval between full sweeps. Default 1m.
	SweepInterval time.Duration
	Log           logr.Logger

	jobs cache.Indexer

	mu       sync.Mutex
	failures map[types.UID]int // failed starts of a queued run
}

// maxStartFailures is how often the oldest queued run may fail to start
// before the queue moves past it.
const maxStartFailures = 3

// NeedLeaderElection makes the manager run it on the leader only.
func (r *ClaimController) NeedLeaderElection() bool { return true }

const byAgent = "agent"

// Start implements manager.Runnable.
func (r *ClaimController) Start(ctx context.Context) error {
	if r.SweepInterval <= 0 {
		r.SweepInterval = time.Minute
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = contract.LabelAgentID
			return r.Client.BatchV1().Jobs(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = contract.LabelAgentID
			return r.Client.BatchV1().Jobs(metav1.NamespaceAll).Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &batchv1.Job{}, 0, cache.Indexers{byAgent: func(obj any) ([]string, error) {
		return []string{obj.(*batchv1.Job).Labels[contract.LabelAgentID]}, nil
	}})
	r.jobs = inf.GetIndexer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if job, ok := obj.(*batchv1.Job); ok && queued(job) {
				r.startNext(ctx, job)
			}
		},
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
	r.Log.Info("claim controller started", "sweepInterval", r.SweepInterval)
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
			r.startAllQueued(ctx)
		}
	}
}

func (r *ClaimController) release(ctx context.Context, job *batchv1.Job, trigger string) {
	r.releaseOrRetry(ctx, job, trigger, 0)
}

// releaseOrRetry frees job's claim once its pods are gone, looking again
// a few times (a deleted Job's pods terminate for up to their grace
// period); the sweep catches anything later. It then starts the agent's
// next queued run, whatever happened to the release.
func (r *ClaimController) releaseOrRetry(ctx context.Context, job *batchv1.Job, trigger string, attempt int) {
	ok, err := r.Claims.Release(ctx, job, r.Configs.Current().Policy.Concurrency)
	switch {
	case err != nil:
		r.Log.Error(err, "releasing claim", "job", job.Namespace+"/"+job.Name)
	case ok:
		claimsReleased.WithLabelValues(trigger).Inc()
		r.Log.V(1).Info("claim released", "job", job.Namespace+"/"+job.Name, "agent", job.Labels[contract.LabelAgentID], "trigger", trigger)
	case attempt < 30 && r.holds(ctx, job):
		time.AfterFunc(2*time.Second, func() {
			if ctx.Err() == nil {
				r.releaseOrRetry(ctx, job, trigger, attempt+1)
			}
		})
	}
	r.startNext(ctx, job)
}

// holds reports whether job still holds its agent's claim.
func (r *ClaimController) holds(ctx context.Context, job *batchv1.Job) bool {
	key := policy.KeyFor(job, r.Configs.Current().Policy.Concurrency)
	lease, err := r.Claims.Leases.Get(ctx, key.Namespace, key.Name)
	return err == nil && policy.HolderOf(lease).UID == string(job.UID)
}

// queued reports whether a Job waits for its turn.
func queued(job *batchv1.Job) bool {
	return job.Annotations[contract.AnnotationQueued] == "true" && job.Annotations[contract.AnnotationQueueError] == "" &&
		job.Spec.Suspend != nil && *job.Spec.Suspend && job.DeletionTimestamp == nil && !policy.Finished(job)
}

// startNext starts the oldest queued run of job's agent (in the claim's
// scope) if the agent is free: it takes the claim for it, then unsuspends
// it. The unsuspend is admitted because that Job now holds the claim.
func (r *ClaimController) startNext(ctx context.Context, job *batchv1.Job) {
	cc := r.Configs.Current().Policy.Concurrency
	if r.jobs == nil {
		return
	}
	objs, err := r.jobs.ByIndex(byAgent, job.Labels[contract.LabelAgentID])
	if err != nil {
		return
	}
	var waiting []*batchv1.Job
	for _, o := range objs {
		j := o.(*batchv1.Job)
		if cc.Scope != config.ScopeCluster && j.Namespace != job.Namespace {
			continue
		}
		if running(j) && cc.Mode != config.ModeDisabled {
			// A run of this agent is going, claimed or not (it may predate
			// a switch to Queue mode): the next one waits.
			return
		}
		if queued(j) {
			waiting = append(waiting, j)
		}
	}
	if len(waiting) == 0 {
		return
	}
	sort.Slice(waiting, func(a, b int) bool {
		ta, tb := waiting[a].CreationTimestamp, waiting[b].CreationTimestamp
		if !ta.Equal(&tb) {
			return ta.Before(&tb)
		}
		return waiting[a].Name < waiting[b].Name
	})
	next := waiting[0]
	if cc.Mode != config.ModeDisabled {
		if err := r.Claims.Acquire(ctx, next, cc, false); err != nil {
			if !policy.IsBusy(err) {
				r.Log.Error(err, "claiming for a queued run", "job", next.Namespace+"/"+next.Name)
			}
			return
		}
	}
	// The UID makes the patch fail on another Job recreated under the name.
	patch := []byte(fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{"suspend":false}}`, next.UID))
	if _, err := r.Client.BatchV1().Jobs(next.Namespace).Patch(ctx, next.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		r.Log.Error(err, "starting a queued run", "job", next.Namespace+"/"+next.Name)
		// The patch may have landed although the answer was lost: free the
		// claim only if the Job is still waiting (the grace window frees a
		// claim of a Job that never started anyway).
		if cur, gerr := r.Client.BatchV1().Jobs(next.Namespace).Get(ctx, next.Name, metav1.GetOptions{}); gerr == nil && cur.UID == next.UID && queued(cur) {
			_, _ = r.Claims.Release(ctx, next, cc)
			r.startFailed(ctx, next, err)
		}
		return
	}
	r.mu.Lock()
	delete(r.failures, next.UID)
	r.mu.Unlock()
	queueStarts.Inc()
	r.Log.Info("queued run started", "job", next.Namespace+"/"+next.Name, "agent", next.Labels[contract.LabelAgentID], "waiting", len(waiting)-1)
}

// startFailed counts a failed start; after maxStartFailures the run is
// marked with the error and the queue moves past it, so one run that can
// never start (say another admission policy refuses it) does not block
// its agent forever.
func (r *ClaimController) startFailed(ctx context.Context, job *batchv1.Job, cause error) {
	r.mu.Lock()
	if r.failures == nil {
		r.failures = map[types.UID]int{}
	}
	r.failures[job.UID]++
	n := r.failures[job.UID]
	r.mu.Unlock()
	if n < maxStartFailures {
		return
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": job.UID,
		"annotations": map[string]string{contract.AnnotationQueueError: cause.Error()}}})
	if _, err := r.Client.BatchV1().Jobs(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		r.Log.Error(err, "marking a queued run that cannot start", "job", job.Namespace+"/"+job.Name)
		return
	}
	r.mu.Lock()
	delete(r.failures, job.UID)
	r.mu.Unlock()
	r.Log.Info("queued run skipped: it failed to start "+fmt.Sprint(maxStartFailures)+" times; remove the annotation to retry it",
		"job", job.Namespace+"/"+job.Name, "annotation", contract.AnnotationQueueError, "error", cause.Error())
}

// running reports whether a Job is a run going on now.
func running(job *batchv1.Job) bool {
	return (job.Spec.Suspend == nil || !*job.Spec.Suspend) && !policy.Finished(job) && job.DeletionTimestamp == nil
}

// startAllQueued catches runs whose agent became free while no event said
// so (a claim swept, the controller restarted, the mode changed). Queued
// runs are served in every mode: switching away from Queue does not strand
// them.
func (r *ClaimController) startAllQueued(ctx context.Context) {
	if r.jobs == nil {
		return
	}
	seen := map[string]bool{}
	for _, o := range r.jobs.List() {
		j := o.(*batchv1.Job)
		key := j.Namespace + "/" + j.Labels[contract.LabelAgentID]
		if queued(j) && !seen[key] {
			seen[key] = true
			r.startNext(ctx, j)
		}
	}
}
