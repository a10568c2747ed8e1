package claim

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

// IndexAgent indexes cached agent Jobs by their agent id.
const IndexAgent = "clipjob.agent-id"

// maxStartFailures is how often the oldest queued run may fail to start
// before the queue moves past it.
const maxStartFailures = 3

// Request is the unit of work of the controller: an agent, in the
// namespace of the Job that woke it. Ended, when set, is a run of that
// agent that just finished or was deleted: its claim is freed first. The
// request carries it because a deleted Job is gone from the cache, and an
// absent Job is otherwise indistinguishable from one admitted but not yet
// stored, whose claim must stay.
type Request struct {
	Namespace, Agent string
	Ended            EndedRun
}

// EndedRun names a Job whose run is over: finished, or Deleted.
type EndedRun struct {
	Name    string
	UID     types.UID
	Deleted bool
}

// ConfigSource returns the Config in force (a *config.Store).
type ConfigSource interface {
	Current() *config.Config
}

// Controller frees an agent's claim as soon as its run's Job finishes or
// is deleted and its pods are gone, and in Queue mode starts the oldest
// queued run of an agent that became free. It is the reconciler half of
// Kueue's split: the validating webhook admits a queued run suspended, the
// controller decides when it starts. It runs on the elected leader only.
// Admission never depends on it for safety: a claim whose Job finished is
// free to take anyway, and starting a queued run goes through the
// validating webhook like any unsuspend.
type Controller struct {
	// Jobs reads agent Jobs from the cache, indexed by IndexAgent.
	Jobs client.Reader
	// Client writes: unsuspending a queued run, marking one that cannot
	// start.
	Client  kubernetes.Interface
	Lock    *Lock
	Configs ConfigSource
	Log     logr.Logger
	// Clock is the time source for start timeouts. Default the real clock.
	Clock clock.PassiveClock
}

func (r *Controller) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// Reconcile implements reconcile.TypedReconciler. A run still holding its
// claim while its pods terminate is looked at again with backoff, as is a
// queued run whose start failed; a run not yet started, when its start
// timeout passes.
func (r *Controller) Reconcile(ctx context.Context, req Request) (reconcile.Result, error) {
	cfg := r.Configs.Current()
	cc := cfg.Policy.Concurrency
	var result reconcile.Result
	if req.Ended.UID != "" {
		pending, err := r.release(ctx, req, cc)
		if err != nil {
			return result, err
		}
		// A rate-limited requeue: pods can take their grace period to end,
		// or hang, and the sweep is there for what outlasts the backoff.
		result.Requeue = pending //nolint:staticcheck // the rate-limited requeue is the point
	}
	jobs, err := r.agentJobs(ctx, req, cc)
	if err != nil {
		return result, err
	}
	after, err := r.startTimeouts(ctx, cfg, jobs)
	if err != nil {
		return result, err
	}
	if !result.Requeue { //nolint:staticcheck // a RequeueAfter would override the backoff; the requeue recomputes it
		result.RequeueAfter = after
	}
	return result, r.startNext(ctx, req, cc, jobs)
}

// release frees the ended run's claim if it holds it. pending reports that
// it still does, because pods of the run are still going.
func (r *Controller) release(ctx context.Context, req Request, cc config.Concurrency) (pending bool, err error) {
	job := endedJob(req)
	ok, err := r.Lock.Release(ctx, job, cc)
	switch {
	case err != nil:
		return false, fmt.Errorf("releasing the claim of Job %s/%s: %w", job.Namespace, job.Name, err)
	case ok:
		trigger := "finished"
		if req.Ended.Deleted {
			trigger = "deleted"
		}
		released.WithLabelValues(trigger).Inc()
		r.Log.V(1).Info("claim released", "job", job.Namespace+"/"+job.Name, "agent", req.Agent)
		return false, nil
	}
	return r.holds(ctx, job, cc)
}

// endedJob is as much of the ended Job as the lock needs to recognise its
// claim.
func endedJob(req Request) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Ended.Name, UID: req.Ended.UID,
		Labels: map[string]string{contract.LabelAgentID: req.Agent}}}
}

// holds reports whether job still holds its agent's claim.
func (r *Controller) holds(ctx context.Context, job *batchv1.Job, cc config.Concurrency) (bool, error) {
	key := KeyFor(job, cc)
	lease, err := r.Lock.Leases.Get(ctx, key.Namespace, key.Name)
	if err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return HolderOf(lease).UID == string(job.UID), nil
}

// startNext starts the oldest queued run of the agent (in the claim's
// scope) if the agent is free: it takes the claim for it, then unsuspends
// it. The unsuspend is admitted because that Job now holds the claim.
// Queued runs are served in every mode: switching away from Queue does not
// strand them.
func (r *Controller) startNext(ctx context.Context, req Request, cc config.Concurrency, jobs []*batchv1.Job) error {
	var waiting []*batchv1.Job
	var holder *batchv1.Job
	for _, j := range jobs {
		if Running(j) && cc.Mode != config.ModeDisabled && holder == nil {
			// A run of this agent is going, claimed or not (it may predate
			// a switch to Queue mode): the next one waits.
			holder = j
		}
		if queued(j) {
			waiting = append(waiting, j)
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	slices.SortFunc(waiting, func(a, b *batchv1.Job) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if holder != nil {
		return r.markPositions(ctx, r.overflow(ctx, waiting, cc), holder)
	}
	next := waiting[0]
	if cc.Mode != config.ModeDisabled {
		if err := r.Lock.Acquire(ctx, next, cc, false); err != nil {
			if IsBusy(err) {
				return nil // the holder's end wakes the agent again
			}
			return fmt.Errorf("claiming for queued run %s/%s: %w", next.Namespace, next.Name, err)
		}
	}
	// The UID makes the patch fail on another Job recreated under the name.
	// A started run waits for nobody: its queue marks go.
	patch := []byte(fmt.Sprintf(`{"metadata":{"uid":%q,"annotations":{%q:null,%q:null}},"spec":{"suspend":false}}`,
		next.UID, contract.AnnotationQueuePosition, contract.AnnotationQueueHolder))
	if _, err := r.Client.BatchV1().Jobs(next.Namespace).Patch(ctx, next.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return r.startFailed(ctx, next, cc, err)
	}
	queueStarts.Inc()
	r.Log.Info("queued run started", "job", next.Namespace+"/"+next.Name, "agent", req.Agent, "waiting", len(waiting)-1)
	// The rest now wait behind it (the start's own patch cleared its marks).
	return r.markPositions(ctx, r.overflow(ctx, waiting[1:], cc), next)
}

// overflow refuses, in Queue mode with maxQueued, the newest of the
// waiting runs beyond that bound, marking each with the queue-full error,
// and returns those that still wait. The validating webhook refuses such a
// run at its CREATE (409, queue-full); a run whose CREATE it did not see
// (compiled policies: queued runs are judged when they start) is refused
// here instead, as soon as the controller sees it.
func (r *Controller) overflow(ctx context.Context, waiting []*batchv1.Job, cc config.Concurrency) []*batchv1.Job {
	if cc.Mode != config.ModeQueue || cc.MaxQueued <= 0 || len(waiting) <= int(cc.MaxQueued) {
		return waiting
	}
	keep := waiting[:cc.MaxQueued]
	for _, j := range waiting[cc.MaxQueued:] {
		msg := fmt.Sprintf("%s: agent %q already had %d runs waiting (policy.concurrency.maxQueued %d); create the run again once one has started",
			contract.CauseQueueFull, j.Labels[contract.LabelAgentID], cc.MaxQueued, cc.MaxQueued)
		if err := r.patchAnnotations(ctx, j, map[string]any{
			contract.AnnotationQueueError: msg, contract.AnnotationQueuePosition: nil, contract.AnnotationQueueHolder: nil}); err != nil {
			// It keeps its place for now; the next pass tries again.
			r.Log.Error(err, "refusing a queued run beyond maxQueued", "job", j.Namespace+"/"+j.Name)
			keep = append(keep, j)
			continue
		}
		r.Log.Info("queued run refused: its agent's queue is full", "job", j.Namespace+"/"+j.Name, "maxQueued", cc.MaxQueued)
	}
	return keep
}

// markPositions records on each waiting run where it stands and whose run
// it waits for, writing only what changed.
func (r *Controller) markPositions(ctx context.Context, waiting []*batchv1.Job, holder *batchv1.Job) error {
	held := ""
	if holder != nil {
		held = holder.Namespace + "/" + holder.Name
	}
	for i, j := range waiting {
		pos := strconv.Itoa(i + 1)
		if j.Annotations[contract.AnnotationQueuePosition] == pos && j.Annotations[contract.AnnotationQueueHolder] == held {
			continue
		}
		var h any = held
		if held == "" {
			h = nil
		}
		if err := r.patchAnnotations(ctx, j, map[string]any{contract.AnnotationQueuePosition: pos, contract.AnnotationQueueHolder: h}); err != nil {
			return fmt.Errorf("marking queued run %s/%s at position %s: %w", j.Namespace, j.Name, pos, err)
		}
	}
	return nil
}

// patchAnnotations sets (nil: removes) annotations of job by a merge
// patch that carries its UID, so it fails on another Job recreated under
// the name instead of marking that one.
func (r *Controller) patchAnnotations(ctx context.Context, job *batchv1.Job, annotations map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": job.UID, "annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = r.Client.BatchV1().Jobs(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// agentJobs lists the cached Jobs of the request's agent in the claim's
// scope.
func (r *Controller) agentJobs(ctx context.Context, req Request, cc config.Concurrency) ([]*batchv1.Job, error) {
	list, err := listAgentJobs(ctx, r.Jobs, req.Namespace, req.Agent, cc)
	if err != nil {
		return nil, err
	}
	out := make([]*batchv1.Job, len(list))
	for i := range list {
		out[i] = &list[i]
	}
	return out, nil
}

// startFailed handles a queued run whose unsuspend failed. The patch may
// have landed although the answer was lost: the claim is freed only if the
// Job is still waiting (the grace window frees a claim of a Job that never
// started anyway). Each failure is counted on the Job itself, so the count
// survives a new leader; after maxStartFailures the run is marked with the
// error and the queue moves past it, so one run that can never start (say
// another admission policy refuses it) does not block its agent forever.
// A refusal of the Job itself (clipjob's start check: 403) marks it at
// once.
// The error it returns makes the controller try again with backoff.
func (r *Controller) startFailed(ctx context.Context, job *batchv1.Job, cc config.Concurrency, cause error) error {
	cur, err := r.Client.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil || cur.UID != job.UID || !queued(cur) {
		return fmt.Errorf("starting queued run %s/%s: %w", job.Namespace, job.Name, cause)
	}
	if _, err := r.Lock.Release(ctx, cur, cc); err != nil {
		r.Log.Error(err, "freeing the claim of a queued run that did not start", "job", job.Namespace+"/"+job.Name)
	}
	failures, _ := strconv.Atoi(cur.Annotations[contract.AnnotationStartFailures])
	failures++
	if refusedForGood(cause) {
		// Admission judged the run itself (clipjob's start check, another
		// policy): trying again judges the same Job the same way.
		failures = maxStartFailures
	}
	annotations := map[string]any{contract.AnnotationStartFailures: strconv.Itoa(failures)}
	if failures >= maxStartFailures {
		annotations[contract.AnnotationQueueError] = cause.Error()
		annotations[contract.AnnotationStartFailures] = nil
	}
	if err := r.patchAnnotations(ctx, job, annotations); err != nil {
		return fmt.Errorf("starting queued run %s/%s: %w (and recording the failure: %v)", job.Namespace, job.Name, cause, err)
	}
	if failures >= maxStartFailures {
		r.Log.Info("queued run skipped: it failed to start "+strconv.Itoa(maxStartFailures)+" times; remove the annotation to retry it",
			"job", job.Namespace+"/"+job.Name, "annotation", contract.AnnotationQueueError, "error", cause.Error())
		return nil // marking it changed the Job: its event wakes the agent for the next run
	}
	return fmt.Errorf("starting queued run %s/%s (failure %d of %d): %w", job.Namespace, job.Name, failures, maxStartFailures, cause)
}

// refusedForGood says whether a start was refused by admission, for the
// Job itself (403 Forbidden, 422 Invalid), rather than failed on the way.
// A refusal that names the agent busy is a 409, not one of these.
func refusedForGood(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err)
}

// Queued reports whether a Job waits for its turn.
func Queued(job *batchv1.Job) bool { return queued(job) }

// queued reports whether a Job waits for its turn.
func queued(job *batchv1.Job) bool {
	return job.Annotations[contract.AnnotationQueued] == "true" && job.Annotations[contract.AnnotationQueueError] == "" &&
		contract.Suspended(job) && job.DeletionTimestamp == nil && !Finished(job)
}

// jobEvents maps Job events to requests: a queued run wakes its agent, as
// does a run that starts with no pod ready (to time its start); a run that
// finished or was deleted also names itself for release. Other updates
// (status changes of running Jobs) cost nothing.
func jobEvents() handler.TypedEventHandler[*batchv1.Job, Request] {
	agent := func(j *batchv1.Job) Request {
		return Request{Namespace: j.Namespace, Agent: j.Labels[contract.LabelAgentID]}
	}
	ended := func(j *batchv1.Job, deleted bool) Request {
		req := agent(j)
		req.Ended = EndedRun{Name: j.Name, UID: j.UID, Deleted: deleted}
		return req
	}
	type queue = workqueue.TypedRateLimitingInterface[Request]
	return handler.TypedFuncs[*batchv1.Job, Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[*batchv1.Job], q queue) {
			// A create is also what a new leader's cache replays.
			if queued(e.Object) || mayBeUnstarted(e.Object) {
				q.Add(agent(e.Object))
			}
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*batchv1.Job], q queue) {
			switch j := e.ObjectNew; {
			case Finished(j) || Deleted(j):
				q.Add(ended(j, false))
			case queued(j) && !queued(e.ObjectOld), mayBeUnstarted(j) && !mayBeUnstarted(e.ObjectOld):
				q.Add(agent(j))
			}
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[*batchv1.Job], q queue) {
			q.Add(ended(e.Object, true))
		},
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[*batchv1.Job], q queue) {
			q.Add(agent(e.Object))
		},
	}
}

// Options configure the controller's place on a manager.
type Options struct {
	// SweepInterval between sweeps of stale claims. Default 1m.
	SweepInterval time.Duration
	// Namespaces, when set, are the only agent namespaces the sweep looks
	// in (the webhook's --namespace); empty means every namespace.
	Namespaces []string
	// RateLimiter paces retries per request. Default: exponential from 1s
	// to 1m, so a run whose pods hang is looked at about once a minute.
	RateLimiter workqueue.TypedRateLimiter[Request]
}

// SetupWithManager registers the controller and its sweeper on mgr. The
// manager's cache must hold agent Jobs; this adds the agent index.
func (r *Controller) SetupWithManager(ctx context.Context, mgr manager.Manager, o Options) error {
	if o.SweepInterval <= 0 {
		o.SweepInterval = time.Minute
	}
	if o.RateLimiter == nil {
		o.RateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[Request](time.Second, time.Minute)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &batchv1.Job{}, IndexAgent, func(o client.Object) []string {
		if agent, ok := o.GetLabels()[contract.LabelAgentID]; ok {
			return []string{agent}
		}
		return nil
	}); err != nil {
		return err
	}
	c, err := controller.NewTyped[Request]("claim", mgr, controller.TypedOptions[Request]{
		Reconciler:  r,
		RateLimiter: o.RateLimiter,
		LogConstructor: func(req *Request) logr.Logger {
			if req == nil {
				return r.Log
			}
			return r.Log.WithValues("namespace", req.Namespace, "agent", req.Agent)
		},
	})
	if err != nil {
		return err
	}
	wake := make(chan event.TypedGenericEvent[*batchv1.Job])
	if err := c.Watch(source.TypedKind(mgr.GetCache(), &batchv1.Job{}, jobEvents())); err != nil {
		return err
	}
	if err := c.Watch(source.TypedChannel(wake, jobEvents())); err != nil {
		return err
	}
	return mgr.Add(&sweeper{Lock: r.Lock, Jobs: r.Jobs, Configs: r.Configs, Interval: o.SweepInterval, Namespaces: o.Namespaces, Wake: wake, Log: r.Log})
}

// sweeper deletes claims whose holder no longer runs, catching what no
// event said (the controller was down, the Job was deleted during a
// restart), and wakes every agent with a queued run, for runs whose agent
// became free meanwhile (a claim swept, the mode changed).
type sweeper struct {
	Lock     *Lock
	Jobs     client.Reader
	Configs  ConfigSource
	Interval time.Duration
	// Namespaces the sweep looks in, every namespace when empty.
	Namespaces []string
	Wake       chan<- event.TypedGenericEvent[*batchv1.Job]
	Log        logr.Logger
}

// NeedLeaderElection makes the manager run it on the leader only.
func (s *sweeper) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (s *sweeper) Start(ctx context.Context) error {
	s.Log.Info("claim controller started", "sweepInterval", s.Interval)
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.sweep(ctx)
	}
}

func (s *sweeper) sweep(ctx context.Context) {
	cc := s.Configs.Current().Policy.Concurrency
	n, err := s.Lock.Sweep(ctx, time.Duration(cc.PendingGraceSeconds)*time.Second, sweptNamespaces(s.Namespaces, cc))
	if err != nil {
		s.Log.Error(err, "sweeping claims")
	}
	if n > 0 {
		released.WithLabelValues("sweep").Add(float64(n))
		s.Log.Info("released stale claims", "count", n)
	}
	var list batchv1.JobList
	if err := s.Jobs.List(ctx, &list); err != nil {
		s.Log.Error(err, "listing agent Jobs")
		return
	}
	for i := range list.Items {
		if j := &list.Items[i]; queued(j) {
			select {
			case s.Wake <- event.TypedGenericEvent[*batchv1.Job]{Object: j}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// sweptNamespaces are where a narrowed release's claims live: its agent
// namespaces, and under scope Cluster the one namespace holding every
// agent's claim. Nil (every namespace) when the release is not narrowed.
func sweptNamespaces(namespaces []string, cc config.Concurrency) []string {
	if len(namespaces) == 0 {
		return nil
	}
	if cc.Scope == config.ScopeCluster && !slices.Contains(namespaces, cc.ClaimNamespace) {
		return append(slices.Clone(namespaces), cc.ClaimNamespace)
	}
	return namespaces
}
