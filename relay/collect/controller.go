package collect

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/redact"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// PodCache is the informer's cache of agent pods.
type PodCache interface {
	// Pod returns the current state of a pod, or nil when it is gone.
	Pod(namespace, name string) *corev1.Pod
	// Pods returns every agent pod.
	Pods() ([]corev1.Pod, error)
}

// JobFailure returns the reason of a Job's Failed condition ("" if it has
// none, or the Job is gone): DeadlineExceeded tells a run that timed out
// from one killed otherwise, which its pod alone does not.
type JobFailure func(ctx context.Context, namespace, name string) (string, error)

// PodGone says whether a pod is gone (or replaced by another of its name).
type PodGone func(ctx context.Context, namespace, name string, uid types.UID) (bool, error)

// Collector is a controller: pod events (OnPod) and the ends of its
// followers queue the pod, and a reconcile per pod, on the queue's
// workers, records its run, follows its containers and finishes the run
// once every stream is drained. The runs whose pods are gone (deleted,
// or vanished unseen) are finished by a sweep through the same queue
// (Sweep), and a change of the
// runs this relay owns is applied there too (Rebalance). A reconcile that
// fails (the store down or read only) is tried again through the queue's
// rate limiter.
type Collector struct {
	Store  store.Backend
	Source LogSource
	Redact *redact.Redactor
	Pods   PodCache
	// JobFailure, when set, marks a run that ended unsuccessfully as
	// timed out when its Job failed with DeadlineExceeded.
	JobFailure JobFailure
	// PodGone, when set, says whether the pod namespace/name with uid is
	// gone, asked of the API server: the sweep asks it before finishing a
	// run whose pod the cache does not hold. The cache can be behind the
	// store, where another replica recorded a pod this one's informer has
	// not delivered yet (a takeover a moment after the pod was created, a
	// replica thawed after a freeze); finished, the run would be collected
	// by no one. Nil: the cache is trusted.
	PodGone PodGone
	Follow  FollowOptions
	// MaxStreams bounds the log streams open at once. Default 200.
	MaxStreams int
	// Mirror, when set, keeps each run's NDJSON file on the shared volume.
	Mirror *mirror.Mirror
	// Owns, when set, says whether this relay collects the run with the
	// given id (the pod's run-id label): several relays sharing a store
	// divide the runs. Nil: every run. Call Rebalance when it changes.
	Owns func(run string) bool
	Log  logr.Logger
	// Clock times the queue's retries and the followers' batches, drains
	// and backoff. Default the real clock.
	Clock clock.WithTicker
	// Retry bounds the delay before a failed reconcile is tried again: it
	// grows from Retry.Min, doubling, up to Retry.Max. Default 100ms, 3s.
	Retry struct{ Min, Max time.Duration }

	ctx   context.Context
	slots chan struct{}
	// budget bounds the lines all followers hold (Follow.BudgetBytes).
	budget *budget
	// queue holds pods and runs' Jobs to reconcile; mirrors holds runs
	// whose mirror file another process held locked, apart, so that a
	// wait on such a lock never holds up a pod.
	queue, mirrors workqueue.TypedRateLimitingInterface[item]
	workers        sync.WaitGroup
	wg             sync.WaitGroup // followers

	mu      sync.Mutex
	stopped bool
	pods    map[types.UID]*podStreams // the pods recorded and not gone
}

// item is what the queues hold: a pod, a run (its Job to read, its mirror
// to sync), or work on every run (a sweep, a rebalance).
type item struct {
	kind            itemKind
	namespace, name string
	uid             types.UID
	run             string // a pod's run-id label, or a run's key
}

type itemKind uint8

const (
	podItem       itemKind = iota
	jobItem                // read the Job of a run that ended unsuccessfully
	mirrorItem             // sync a run's mirror again
	sweepItem              // finish the runs whose pods are gone
	rebalanceItem          // apply a change of the runs this relay owns
)

// retries bound the attempts at a run's item, and say what giving up
// leaves; a pod is tried until it succeeds or is gone.
var retries = map[itemKind]struct {
	attempts int
	gaveUp   string
}{
	jobItem:    {8, "its Job never said why it failed"},
	mirrorItem: {10, "its NDJSON mirror file stayed locked by another process; its log is in the store"},
}

// workers reconcile pods at once: each waits on the store, and a takeover
// queues every pod of the runs taken.
const workers = 4

// errNotYet: a reconcile to try again later, which nothing failed.
var errNotYet = errors.New("not yet")

// podStreams are the streams of one pod this relay recorded.
type podStreams struct {
	item item // the pod's, for the ends of its followers
	// ctx ends the pod's followers when another relay takes its run over.
	ctx    context.Context
	cancel context.CancelFunc
	// following: stream key -> still following.
	following map[string]bool
}

// Start starts the queues' workers; followers live until ctx ends.
func (c *Collector) Start(ctx context.Context) {
	c.Follow.setDefaults()
	orDefault(&c.MaxStreams, 200)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Retry.Min <= 0 || c.Retry.Max <= 0 {
		c.Retry.Min, c.Retry.Max = 100*time.Millisecond, 3*time.Second
	}
	c.ctx = ctx
	c.slots = make(chan struct{}, c.MaxStreams)
	c.budget = newBudget(int64(c.Follow.BudgetBytes), int64(c.Follow.BatchBytes))
	c.pods = map[types.UID]*podStreams{}
	newQueue := func(name string) workqueue.TypedRateLimitingInterface[item] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[item](c.Retry.Min, c.Retry.Max),
			workqueue.TypedRateLimitingQueueConfig[item]{Name: name, Clock: c.Clock})
	}
	c.queue, c.mirrors = newQueue("relay-pods"), newQueue("relay-mirrors")
	for range workers {
		c.workers.Go(func() { c.work(c.queue) })
	}
	c.workers.Go(func() { c.work(c.mirrors) })
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
		c.mirrors.ShutDown()
	}()
}

// Stop starts no more followers and waits until the workers and every
// follower have returned (after ctx ended): everything read is flushed.
func (c *Collector) Stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	if c.queue != nil {
		c.queue.ShutDown()
		c.mirrors.ShutDown()
	}
	c.workers.Wait()
	c.wg.Wait()
}

// owns says whether this relay collects run.
func (c *Collector) owns(run string) bool { return c.Owns == nil || c.Owns(run) }

// OnPod handles a pod added, updated or deleted: it queues the pod if it
// carries a run id this relay collects. A pod gone is reconciled too: its
// followers read what they can, and its run is finished then.
func (c *Collector) OnPod(pod *corev1.Pod) {
	if it := podItemOf(pod); it.run != "" && c.owns(it.run) {
		c.queue.Add(it)
	}
}

// Sweep finishes, through the queue, the runs this relay owns whose pods
// vanished unseen (while it was away). Call it once Pods has synced:
// before, every run would look podless.
func (c *Collector) Sweep() { c.queue.Add(item{kind: sweepItem}) }

// Rebalance applies a change of the runs this relay owns (Owns), through
// the queue: the followers of runs it no longer owns stop (their commits
// are refused where the new owner moved the cursor), the runs it now owns
// are followed from their stored cursors, and those whose pods vanished
// are finished.
func (c *Collector) Rebalance() { c.queue.Add(item{kind: rebalanceItem}) }

func podItemOf(pod *corev1.Pod) item {
	return item{kind: podItem, namespace: pod.Namespace, name: pod.Name, uid: pod.UID, run: pod.Labels[contract.LabelRunID]}
}

// work reconciles q's items until q shuts down. A failed one is queued
// again after its rate limiter's delay, a run's at most a few times.
func (c *Collector) work(q workqueue.TypedRateLimitingInterface[item]) {
	for {
		it, shutdown := q.Get()
		if shutdown {
			return
		}
		if c.ctx.Err() != nil { // stopping: what is left is the next start's
			q.Done(it)
			continue
		}
		err := c.reconcile(it)
		switch r := retries[it.kind]; {
		case err == nil:
			q.Forget(it)
		case r.attempts > 0 && q.NumRequeues(it)+1 >= r.attempts:
			q.Forget(it)
			c.Log.Info("gave up on the run: "+r.gaveUp, "run", it.run, "last", err.Error())
		default:
			if !errors.Is(err, errNotYet) {
				c.Log.Error(err, "reconciling; trying again", "run", it.run, "pod", it.namespace+"/"+it.name)
			}
			q.AddRateLimited(it)
		}
		q.Done(it)
	}
}

func (c *Collector) reconcile(it item) error {
	switch it.kind {
	case jobItem:
		return c.timedOut(it.run)
	case mirrorItem:
		if err := c.Mirror.Sync(it.run); err != nil && !errors.Is(err, mirror.ErrLocked) {
			c.Log.Error(err, "mirroring the run's NDJSON file", "run", it.run)
		} else if err != nil {
			return errNotYet
		}
		return nil
	case sweepItem:
		return c.sweep()
	case rebalanceItem:
		return c.rebalance()
	}
	if !c.owns(it.run) {
		return nil // another relay's since it was queued (rebalance forgot its streams)
	}
	pod := c.Pods.Pod(it.namespace, it.name)
	if pod == nil || pod.UID != it.uid {
		// Gone: once its followers have read what they could (their ends
		// bring it back), the sweep finishes its run, if the pod was the
		// run's newest.
		if !c.streaming(it.uid) {
			c.forget(it.uid)
			c.queue.Add(item{kind: sweepItem})
		}
		return nil
	}
	return c.syncPod(pod)
}

// syncPod records a pod in its run, follows its containers and finishes
// the run once the pod ended and every stream is drained. Only a pod that
// a Job controls is part of a run, and only of the run bound to that Job
// and namespace when first seen: anyone creating Jobs can copy a run id.
// Another Job's pods carrying it are a run of their own, kept under
// store.RunKey(id, their Job's UID).
func (c *Collector) syncPod(pod *corev1.Pod) error {
	run := pod.Labels[contract.LabelRunID]
	job := metav1.GetControllerOf(pod)
	if job == nil || job.Kind != "Job" || !strings.HasPrefix(job.APIVersion, "batch/") {
		c.ignore(pod, run, "no-job", "not controlled by a Job")
		return nil
	}
	// Even while this relay follows the pod: another replica may have
	// finished the run, and retention deleted it, while this one was
	// frozen, and the record written below would bring it back.
	if retired, err := c.retired(pod, job.UID); err != nil || retired {
		return err
	}
	rec, key, err := c.recordPod(pod, run, job.UID)
	if errors.Is(err, errUnkeyable) {
		c.ignore(pod, run, "job-uid", "the run id belongs to another Job, and this one's UID cannot key a run")
		return nil
	}
	if err != nil {
		return err
	}
	if rec.Done && rec.PodUID == string(pod.UID) {
		return nil // collected completely before (e.g. before a relay restart)
	}
	if !c.track(podItemOf(pod)) {
		return nil // stopping
	}
	if rec.LastSeq == 0 {
		c.syncMirror(key) // the file exists from the start: readers wait for it, not long
	}
	c.followAll(pod, key)
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed || c.streaming(pod.UID) {
		return nil // its followers' ends bring it back
	}
	if rec.PodUID != string(pod.UID) {
		// An older attempt of the Job's run: the run goes on with the
		// newer pod the record follows, whose end finishes it. (A replica
		// taking the run over, or a relay restarted, reconciles the pods
		// of a run in no particular order.)
		return nil
	}
	return c.finish(key, false)
}

// track remembers the pod, for its followers and its deletion; false once
// the collector stops.
func (c *Collector) track(it item) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	if c.pods[it.uid] == nil {
		ctx, cancel := context.WithCancel(c.ctx)
		c.pods[it.uid] = &podStreams{item: it, ctx: ctx, cancel: cancel, following: map[string]bool{}}
	}
	return true
}

// forget ends what is left of a pod's followers and forgets it.
func (c *Collector) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps := c.pods[uid]; ps != nil {
		ps.cancel()
		delete(c.pods, uid)
	}
}

// streaming says whether this relay still follows a stream of the pod:
// then its run is not finished, so not retired.
func (c *Collector) streaming(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps := c.pods[uid]; ps != nil {
		for _, following := range ps.following {
			if following {
				return true
			}
		}
	}
	return false
}

// retired says whether pod is one of a run retention deleted while its
// pods remain: collected again, it would come back whole.
func (c *Collector) retired(pod *corev1.Pod, jobUID types.UID) (bool, error) {
	r, err := c.Store.RetiredRun(pod.Namespace, string(jobUID))
	if err != nil || !r.Covers(pod.CreationTimestamp.Time) {
		return false, err
	}
	podsIgnored.WithLabelValues("retired").Inc()
	c.Log.V(1).Info("ignoring pod: retention deleted its run", "pod", pod.Namespace+"/"+pod.Name, "run", r.Run)
	return true, nil
}

// streamRetired says whether ref's pod is one of a run retention deleted
// (retired, above), from the pod cache; false for a pod the cache does
// not hold as ref's.
func (c *Collector) streamRetired(ref StreamRef) (bool, error) {
	if c.Pods == nil {
		return false, nil
	}
	pod := c.Pods.Pod(ref.Namespace, ref.Pod)
	if pod == nil || string(pod.UID) != ref.PodUID {
		return false, nil
	}
	job := metav1.GetControllerOf(pod)
	if job == nil {
		return false, nil
	}
	r, err := c.Store.RetiredRun(pod.Namespace, string(job.UID))
	if err != nil || !r.Covers(pod.CreationTimestamp.Time) {
		return false, err
	}
	c.Log.Info("stopped following a stream: retention deleted its run", "run", ref.Run, "stream", ref.Key())
	return true, nil
}

// ForgetRetired forgets the retired runs (store.Retired) of Jobs in the
// namespaces watched (none: all) none of whose pods remain.
func (c *Collector) ForgetRetired(watched []string) (int, error) {
	retired, err := c.Store.RetiredRuns()
	if err != nil || len(retired) == 0 {
		return 0, err
	}
	pods, err := c.Pods.Pods()
	if err != nil {
		return 0, err
	}
	jobs := map[string]bool{} // namespace/Job UID
	for i := range pods {
		if job := metav1.GetControllerOf(&pods[i]); job != nil {
			jobs[pods[i].Namespace+"/"+string(job.UID)] = true
		}
	}
	var gone []store.Retired
	for _, r := range retired {
		if !jobs[r.Namespace+"/"+r.JobUID] && (len(watched) == 0 || slices.Contains(watched, r.Namespace)) {
			gone = append(gone, r)
		}
	}
	return len(gone), c.Store.ForgetRetired(gone...)
}

// errUnkeyable: the run id is bound to another Job, and the pod's Job UID
// (which the API server does not check) cannot key a run of its own.
var errUnkeyable = errors.New("run id taken, and the Job UID cannot key a run")

// recordPod records the pod in its run: the run id's record if that is
// bound to the pod's Job (or to none yet), else the Job's own key.
func (c *Collector) recordPod(pod *corev1.Pod, run string, jobUID types.UID) (*store.Run, string, error) {
	var refused string
	update := func(r *store.Run) {
		if reason := bound(r, pod.Namespace, jobUID); reason != "" {
			refused = reason
			return
		}
		if r.PodUID != "" && r.PodUID != string(pod.UID) {
			if r.PodCreated != nil && pod.CreationTimestamp.Time.Before(*r.PodCreated) {
				return // an older attempt of the run: the record follows the newest
			}
			// A newer pod of the same Job (it retried): the run goes on,
			// and its log continues with the new pod's lines.
			r.Done, r.ExitCode, r.Reason, r.FinishedAt, r.Result = false, nil, "", nil, nil
		}
		r.JobUID = string(jobUID)
		c.describe(r, pod)
	}
	// Once kept apart, a Job's run stays there, even if the record of the
	// run id goes (retention) and the id could be bound anew.
	apart := ""
	if store.ValidJobUID(string(jobUID)) {
		apart = store.RunKey(run, string(jobUID))
		r, err := c.Store.Run(apart)
		if err != nil {
			return nil, apart, err
		}
		if r != nil {
			rec, err := c.Store.UpdateRun(apart, update)
			return rec, apart, err
		}
	}
	rec, err := c.Store.UpdateRun(run, update)
	if err != nil || refused == "" {
		return rec, run, err
	}
	if apart == "" {
		return nil, run, errUnkeyable
	}
	podsKeptApart.WithLabelValues(refused).Inc()
	c.Log.Info("run id taken by another Job: this Job's run is kept under its own key", "pod", pod.Namespace+"/"+pod.Name, "run", run, "key", apart)
	// The key holds the Job's UID, so the pods of that Job (one namespace)
	// are never refused there.
	rec, err = c.Store.UpdateRun(apart, update)
	return rec, apart, err
}

// bound says why a pod of namespace ns controlled by Job jobUID is not
// part of run r, or "" if it is. Records from before runs were bound to a
// Job bind to the first Job seen.
func bound(r *store.Run, ns string, jobUID types.UID) string {
	switch {
	case r.Namespace != "" && r.Namespace != ns:
		return "namespace"
	case r.JobUID != "" && r.JobUID != string(jobUID):
		return "job"
	}
	return ""
}

// ignore counts and logs a pod labeled with a run id that is not part of
// the run.
func (c *Collector) ignore(pod *corev1.Pod, run, reason, why string) {
	podsIgnored.WithLabelValues(reason).Inc()
	c.Log.Info("ignoring pod: "+why, "pod", pod.Namespace+"/"+pod.Name, "run", run)
}

// followAll starts a follower for every container instance of the pod
// that has a log: running or terminated, and instances a restart replaced.
func (c *Collector) followAll(pod *corev1.Pod, run string) {
	for _, st := range allStatuses(pod) {
		ids := []string{st.ContainerID}
		if t := st.LastTerminationState.Terminated; t != nil && t.ContainerID != "" {
			ids = append(ids, t.ContainerID)
		}
		for _, id := range ids {
			if id == "" || (id == st.ContainerID && st.State.Running == nil && st.State.Terminated == nil) {
				continue
			}
			c.follow(StreamRef{Run: run, Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID),
				Container: st.Name, ContainerID: id})
		}
	}
}

func (c *Collector) follow(ref StreamRef) {
	key := ref.Key()
	c.mu.Lock()
	ps := c.pods[types.UID(ref.PodUID)]
	if c.stopped || ps == nil {
		c.mu.Unlock()
		return
	}
	if _, seen := ps.following[key]; seen {
		c.mu.Unlock()
		return
	}
	ps.following[key] = true
	c.mu.Unlock()

	f := &follower{c: c, ref: ref, state: func() containerState { return c.containerState(ref) }, committed: func() { c.syncMirror(ref.Run) }}
	c.Log.V(1).Info("following", "run", ref.Run, "pod", ref.Namespace+"/"+ref.Pod, "container", ref.Container)
	c.wg.Go(func() {
		f.run(ps.ctx)
		if ps.ctx.Err() != nil {
			// Shutting down (not drained: resumed after a restart), or
			// another relay took the run over (rebalance forgot the pod).
			return
		}
		c.mu.Lock()
		ps.following[key] = false
		c.mu.Unlock()
		c.queue.Add(ps.item)
	})
}

// rebalance stops the followers of runs this relay no longer owns and
// queues every agent pod, then a sweep.
func (c *Collector) rebalance() error {
	c.mu.Lock()
	for uid, ps := range c.pods {
		if !c.owns(ps.item.run) {
			ps.cancel()
			delete(c.pods, uid)
		}
	}
	c.mu.Unlock()
	pods, err := c.Pods.Pods()
	if err != nil {
		return err
	}
	for i := range pods {
		c.OnPod(&pods[i])
	}
	c.queue.Add(item{kind: sweepItem})
	return nil
}

// containerState is what the pod cache says of the instance ref, and by
// which name the kubelet serves its log. The kubelet serves a container's
// current log (no "previous") from its own view of the pod, which the
// cache follows late: once it has restarted the container, that log is
// the next instance's, and read under ref's stream it would be stored
// twice, there and under its own. So the current log is read only while
// the cache shows ref current and no restart can have replaced it yet,
// and the previous log only while the cache shows ref the previous
// instance.
func (c *Collector) containerState(ref StreamRef) containerState {
	pod := c.Pods.Pod(ref.Namespace, ref.Pod)
	if pod == nil || string(pod.UID) != ref.PodUID {
		return containerState{ended: true, gone: true}
	}
	finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	for _, st := range allStatuses(pod) {
		if st.Name != ref.Container {
			continue
		}
		last := st.LastTerminationState.Terminated
		goesOn := !finished && pod.DeletionTimestamp == nil
		switch previous := last != nil && last.ContainerID == ref.ContainerID; {
		case previous && (st.ContainerID != ref.ContainerID || st.State.Running == nil):
			// Replaced, or waiting to be (a crash loop's back-off, the
			// status still naming ref): its log is the previous one, the
			// next instance's the current one, as soon as it starts.
			return containerState{ended: true, replaced: true}
		case st.ContainerID == "":
			// No instance named: wait until the status names one.
			return containerState{ended: true, restarting: goesOn, lost: !goesOn}
		case st.ContainerID != ref.ContainerID:
			return containerState{ended: true, lost: true}
		case st.State.Terminated != nil:
			return containerState{ended: true, restarting: st.State.Terminated.ExitCode != 0 && goesOn}
		}
		return containerState{ended: finished}
	}
	return containerState{ended: finished}
}

// finish marks the run done and parses its result from the stored lines;
// gone: its pod vanished before it was seen to end.
func (c *Collector) finish(run string, gone bool) error {
	// Every stream's end and the pod's deletion each come here; the log is
	// read and parsed once.
	if rec, err := c.Store.Run(run); err != nil || (rec != nil && rec.Done) {
		return err
	}
	var p result.Parser
	if err := store.EachLine(c.Store, run, 0, func(l store.Line) (bool, error) {
		p.Feed([]byte(l.Line))
		return true, nil
	}); err != nil {
		return err
	}
	rec, err := c.Store.UpdateRun(run, func(r *store.Run) {
		if r.Done {
			return
		}
		if gone && r.Phase != string(corev1.PodSucceeded) && r.Phase != string(corev1.PodFailed) {
			r.Phase = "Unknown"
			if r.Reason == "" {
				r.Reason = "the pod was deleted before it was seen to finish"
			}
		}
		var term *result.Termination
		if r.ExitCode != nil {
			term = &result.Termination{ExitCode: *r.ExitCode, Reason: r.Reason}
		} else if gone {
			term = &result.Termination{ExitCode: -1, Reason: r.Reason}
		}
		r.Result = p.Result(term)
		r.Done = true
	})
	if err != nil {
		return err
	}
	c.syncMirror(run)
	c.Log.Info("run collected", "run", run, "phase", rec.Phase, "lines", rec.LastSeq)
	if c.JobFailure != nil && rec.Result != nil && rec.Result.Outcome != "" && rec.Result.Outcome != "succeeded" {
		c.queue.Add(item{kind: jobItem, run: run})
	}
	return nil
}

// syncMirror syncs the run's mirror. A file someone else holds locked is
// left to the next commit's sync and, for a run that has no next commit
// (it finished), to the mirrors' queue, without holding up the caller.
func (c *Collector) syncMirror(run string) {
	err := c.Mirror.Sync(run)
	if errors.Is(err, mirror.ErrLocked) {
		c.Log.Info("the run's NDJSON mirror file is locked by another process; trying again later", "run", run)
		c.mirrors.AddRateLimited(item{kind: mirrorItem, run: run})
	} else if err != nil {
		c.Log.Error(err, "mirroring the run's NDJSON file", "run", run)
	}
}

// describe copies what the pod says about its run into the record.
func (c *Collector) describe(r *store.Run, pod *corev1.Pod) {
	l := pod.Labels
	r.Namespace, r.Pod, r.PodUID = pod.Namespace, pod.Name, string(pod.UID)
	created := pod.CreationTimestamp.Time
	r.PodCreated = &created
	r.Job = l["batch.kubernetes.io/job-name"]
	r.Agent, r.Company = l[contract.LabelAgentID], l[contract.LabelCompanyID]
	r.Task, r.Session = l[contract.LabelTaskID], l[contract.LabelSessionID]
	r.Adapter = contract.AdapterType(l)
	r.Containers = r.Containers[:0]
	for _, c := range pod.Spec.InitContainers {
		r.Containers = append(r.Containers, c.Name)
	}
	for _, c := range pod.Spec.Containers {
		r.Containers = append(r.Containers, c.Name)
	}
	if len(pod.Spec.Containers) > 0 {
		r.MainContainer = pod.Spec.Containers[0].Name
	}
	if pod.Status.Phase != "" {
		r.Phase = string(pod.Status.Phase)
	}
	if t := pod.Status.StartTime; t != nil && r.StartedAt == nil {
		s := t.Time
		r.StartedAt = &s
	}
	// The agent is the first app container; its exit is the run's.
	if len(pod.Status.ContainerStatuses) > 0 {
		if term := pod.Status.ContainerStatuses[0].State.Terminated; term != nil {
			code := term.ExitCode
			r.ExitCode, r.Reason = &code, term.Reason
			f := term.FinishedAt.Time
			if f.IsZero() {
				f = c.Clock.Now()
			}
			r.FinishedAt = &f
		}
	}
}

func allStatuses(pod *corev1.Pod) []corev1.ContainerStatus {
	out := append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...)
	return append(out, pod.Status.ContainerStatuses...)
}

// sweep finishes the runs this relay owns left unfinished in the store
// whose pod no longer exists and is followed no more (deleted, perhaps
// while the relay was away or another relay collected it): their log is
// what was stored, and their phase is Unknown unless it was seen to end.
// Pods gone queue it, and the queue holds one sweep at a time however
// many are gone.
func (c *Collector) sweep() error {
	runs, err := c.Store.RunsWhere(store.Filter{Unfinished: true})
	if err != nil {
		return err
	}
	n := 0
	var unsure error
	for _, r := range runs {
		if !c.owns(runID(r.ID)) {
			continue // another relay's to finish
		}
		if p := c.Pods.Pod(r.Namespace, r.Pod); (p != nil && string(p.UID) == r.PodUID) || c.streaming(types.UID(r.PodUID)) {
			continue
		}
		if c.PodGone != nil && r.Namespace != "" && r.Pod != "" {
			gone, err := c.PodGone(c.ctx, r.Namespace, r.Pod, types.UID(r.PodUID))
			if err != nil {
				unsure = errors.Join(unsure, err) // the sweep is tried again
				continue
			}
			if !gone {
				continue // the cache is behind: the pod's event brings it
			}
		}
		if err := c.finish(r.ID, true); err != nil {
			return err
		}
		n++
	}
	if n > 0 {
		c.Log.Info("finished runs whose pods are gone", "runs", n)
	}
	return unsure
}

// runID is the run id (the pods' label) of the run kept under key: key
// itself, or what precedes the Job's UID in store.RunKey.
func runID(key string) string {
	id, _, _ := strings.Cut(key, "@")
	return id
}

// timedOut marks the run's result timed out if its Job failed with
// DeadlineExceeded; the Job controller deletes the pods before it records
// that, so a Job without it yet is read again (errNotYet).
func (c *Collector) timedOut(run string) error {
	rec, err := c.Store.Run(run)
	if err != nil || rec == nil {
		return err
	}
	reason, err := c.JobFailure(c.ctx, rec.Namespace, rec.Job)
	switch {
	case err != nil:
		return err
	case reason == "":
		return errNotYet
	case reason != string(batchv1.JobReasonDeadlineExceeded):
		return nil // failed for another reason
	}
	_, err = c.Store.UpdateRun(run, func(r *store.Run) {
		if r.Result != nil {
			r.Result.Outcome = result.OutcomeTimedOut
		}
	})
	return err
}
