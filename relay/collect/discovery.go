package collect

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/redact"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// PodLookup returns the current state of a pod, or nil when it is gone.
type PodLookup func(namespace, name string) *corev1.Pod

// JobFailure returns the reason of a Job's Failed condition ("" if it has
// none, or the Job is gone): DeadlineExceeded tells a run that timed out
// from one killed otherwise, which its pod alone does not.
type JobFailure func(ctx context.Context, namespace, name string) (string, error)

// Collector turns pod events into followers and run records. It is driven
// by an informer (see Serve) but has no informer of its own, so tests call
// OnPod directly.
type Collector struct {
	Store  store.Backend
	Source LogSource
	Redact *redact.Redactor
	Pods   PodLookup
	// JobFailure, when set, marks a run that ended unsuccessfully as
	// timed out when its Job failed with DeadlineExceeded.
	JobFailure JobFailure
	Follow     FollowOptions
	// MaxStreams bounds the log streams open at once. Default 200.
	MaxStreams int
	// Mirror, when set, keeps each run's NDJSON file on the shared volume.
	Mirror *mirror.Mirror
	// Owns, when set, says whether this relay collects the run with the
	// given id (the pod's run-id label): several relays sharing a store
	// divide the runs. Nil: every run. See Rebalance.
	Owns func(run string) bool
	Log  logr.Logger

	ctx   context.Context
	slots chan struct{}
	// budget bounds the lines all followers hold (Follow.BudgetBytes).
	budget *budget
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	pods    map[types.UID]*podStreams // the pods followed
	// retrying: what a background retry (later) waits to try again.
	retrying map[string]bool
}

// recordRetry is how long OnPod waits to try a pod again whose run record
// it could not write (the store refused: down, read only).
var recordRetry = 3 * time.Second

// retryPod offers pod to OnPod again after recordRetry, as the cache has
// it then: a run whose record could not be written is not left
// uncollected until its pod next changes, which may be its end (a
// hostile review).
func (c *Collector) retryPod(pod *corev1.Pod) {
	c.later("pod/"+string(pod.UID), recordRetry, 1, func() bool {
		if p := c.Pods(pod.Namespace, pod.Name); p != nil && p.UID == pod.UID {
			c.OnPod(p)
		}
		return true
	}, nil)
}

// later runs try in the background after delay, and again after each
// delay while it returns false, at most attempts times, then gaveUp (if
// set). One per key at a time: a call while one waits does nothing (a
// run whose mirror stays locked asks at every commit). It ends with the
// collector, which waits for it.
func (c *Collector) later(key string, delay time.Duration, attempts int, try func() bool, gaveUp func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.ctx == nil || c.retrying[key] {
		return
	}
	if c.retrying == nil {
		c.retrying = map[string]bool{}
	}
	c.retrying[key] = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for attempt := 1; ; attempt++ {
			select {
			case <-c.ctx.Done():
			case <-time.After(delay):
			}
			// The key is free while try runs: what try starts (OnPod)
			// may ask for a retry of its own.
			c.mu.Lock()
			delete(c.retrying, key)
			c.mu.Unlock()
			if c.ctx.Err() != nil || try() {
				return
			}
			if attempt == attempts {
				if gaveUp != nil {
					gaveUp()
				}
				return
			}
			c.mu.Lock()
			taken := c.retrying[key] || c.stopped // another retry goes on, or none may
			if !taken {
				c.retrying[key] = true
			}
			c.mu.Unlock()
			if taken {
				return
			}
		}
	}()
}

// podStreams are the streams of one pod this relay follows.
type podStreams struct {
	run string // the pod's run-id label, what ownership is decided by
	// ctx ends the pod's followers when another relay takes its run over.
	ctx    context.Context
	cancel context.CancelFunc
	// following: stream key -> still following.
	following map[string]bool
}

// Start prepares the collector; followers live until ctx ends.
func (c *Collector) Start(ctx context.Context) {
	c.Follow.setDefaults()
	if c.MaxStreams <= 0 {
		c.MaxStreams = 200
	}
	c.ctx = ctx
	c.slots = make(chan struct{}, c.MaxStreams)
	c.budget = newBudget(int64(c.Follow.BudgetBytes), int64(c.Follow.BatchBytes))
	c.pods = map[types.UID]*podStreams{}
}

// owns says whether this relay collects run.
func (c *Collector) owns(run string) bool { return c.Owns == nil || c.Owns(run) }

// Stop starts no more followers and waits until every follower has
// returned (after ctx ended), so a shutdown has flushed everything.
func (c *Collector) Stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.wg.Wait()
}

// OnPod handles a pod added or updated. Only a pod that a Job controls
// is part of a run, and only of the run bound to that Job and namespace
// when first seen: the run id is a label anyone creating Jobs can copy.
// The pods of another Job carrying the same id are a run of their own,
// kept under store.RunKey(id, their Job's UID): nothing is dropped, and a
// client that knows its Job finds its run whoever took the id first.
func (c *Collector) OnPod(pod *corev1.Pod) {
	run := pod.Labels[contract.LabelRunID]
	if run == "" || !c.owns(run) {
		return
	}
	job := metav1.GetControllerOf(pod)
	if job == nil || job.Kind != "Job" || !strings.HasPrefix(job.APIVersion, "batch/") {
		c.ignore(pod, run, "no-job", "not controlled by a Job")
		return
	}
	if !c.following(pod.UID) && c.retired(pod, job.UID) {
		return
	}
	rec, key, err := c.recordPod(pod, run, job.UID)
	if errors.Is(err, errUnkeyable) {
		c.ignore(pod, run, "job-uid", "the run id belongs to another Job, and this one's UID cannot key a run")
		return
	}
	if err != nil {
		c.Log.Error(err, "recording run; trying again", "run", key, "in", recordRetry)
		c.retryPod(pod)
		return
	}
	if rec.Done && rec.PodUID == string(pod.UID) {
		return // collected completely before (e.g. before a relay restart)
	}
	if rec.LastSeq == 0 {
		c.mirror(key) // the file exists from the start: readers wait for it, not long
	}
	c.followAll(pod, key)
	c.maybeFinish(pod.Namespace, pod.Name, pod.UID, key)
}

// following says whether this relay still follows a stream of the pod:
// its run is not finished, so no retired run's (retention takes finished
// runs only), and its updates need no look at the store for one. A pod
// whose streams all drained is remembered until it is gone, and may be a
// retired run's by then.
func (c *Collector) following(uid types.UID) bool {
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
// pods remain, which is then left alone: collected again (after a
// restart, or by the replica taking the run over), it would come back
// whole, its mirror rewritten. A store that cannot say is asked again.
func (c *Collector) retired(pod *corev1.Pod, jobUID types.UID) bool {
	r, err := c.Store.RetiredRun(pod.Namespace, string(jobUID))
	if err != nil {
		c.Log.Error(err, "reading whether retention deleted the run; trying again", "pod", pod.Namespace+"/"+pod.Name, "in", recordRetry)
		c.retryPod(pod)
		return true
	}
	if !r.Covers(pod.CreationTimestamp.Time) {
		return false
	}
	podsIgnored.WithLabelValues("retired").Inc()
	c.Log.V(1).Info("ignoring pod: retention deleted its run", "pod", pod.Namespace+"/"+pod.Name, "run", r.Run)
	return true
}

// ForgetRetired forgets the retired runs (store.Retired) of Jobs in the
// namespaces watched (nil: all) none of whose pods remain; pods are every
// pod the relay's synced cache holds. A pod of such a Job created after
// this is a new attempt of its run, which is collected anyway.
func (c *Collector) ForgetRetired(pods []corev1.Pod, watched func(namespace string) bool) (int, error) {
	retired, err := c.Store.RetiredRuns()
	if err != nil || len(retired) == 0 {
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
		if !jobs[r.Namespace+"/"+r.JobUID] && (watched == nil || watched(r.Namespace)) {
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
		describe(r, pod)
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

// OnPodDeleted handles a pod that is gone: its followers end once they
// have read what they can, and the run is finished then. The deletion of
// a pod that is not part of the run changes nothing.
func (c *Collector) OnPodDeleted(pod *corev1.Pod) {
	run := pod.Labels[contract.LabelRunID]
	job := metav1.GetControllerOf(pod)
	if run == "" || job == nil || !c.owns(run) {
		return
	}
	keys := []string{run}
	if store.ValidJobUID(string(job.UID)) {
		keys = append(keys, store.RunKey(run, string(job.UID)))
	}
	for _, key := range keys {
		if r, err := c.Store.Run(key); err == nil && r != nil && bound(r, pod.Namespace, job.UID) == "" {
			c.maybeFinish(pod.Namespace, pod.Name, pod.UID, key)
		}
	}
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
				Container: st.Name, ContainerID: id}, pod.Labels[contract.LabelRunID])
		}
	}
}

func (c *Collector) follow(ref StreamRef, run string) {
	key := ref.Key()
	uid := types.UID(ref.PodUID)
	c.mu.Lock()
	ps := c.pods[uid]
	if c.stopped || (ps != nil && ps.seen(key)) {
		c.mu.Unlock()
		return
	}
	if ps == nil {
		ctx, cancel := context.WithCancel(c.ctx)
		ps = &podStreams{run: run, ctx: ctx, cancel: cancel, following: map[string]bool{}}
		c.pods[uid] = ps
	}
	ps.following[key] = true
	c.mu.Unlock()

	f := &follower{ref: ref, src: c.Source, store: c.Store, redact: c.Redact, opts: c.Follow, slots: c.slots, budget: c.budget,
		log: c.Log, state: func() containerState { return c.containerState(ref) }, committed: func() { c.mirror(ref.Run) }}
	c.Log.V(1).Info("following", "run", ref.Run, "pod", ref.Namespace+"/"+ref.Pod, "container", ref.Container)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f.run(ps.ctx)
		if ps.ctx.Err() != nil {
			// Shutting down (not drained: resumed after a restart), or
			// another relay took the run over (Rebalance forgot the pod).
			return
		}
		c.mu.Lock()
		if c.pods[uid] == ps {
			ps.following[key] = false
		}
		c.mu.Unlock()
		c.maybeFinish(ref.Namespace, ref.Pod, uid, ref.Run)
	}()
}

// seen says whether the stream is or was followed.
func (ps *podStreams) seen(key string) bool {
	_, ok := ps.following[key]
	return ok
}

// Rebalance applies a change of the runs this relay owns (Owns): the
// followers of pods whose run it no longer owns stop (what they read is
// committed, from the cursor they started from, so a relay that took the
// run over meanwhile loses nothing to them and gets nothing twice), and
// the pods of runs it now owns are followed from their stored cursors.
// pods are every agent pod there is (the informer's cache). Call
// Reconcile after it to finish the runs it now owns whose pod is gone.
func (c *Collector) Rebalance(pods []*corev1.Pod) {
	c.mu.Lock()
	for uid, ps := range c.pods {
		if !c.owns(ps.run) {
			ps.cancel()
			delete(c.pods, uid)
		}
	}
	c.mu.Unlock()
	for _, p := range pods {
		c.OnPod(p)
	}
}

func (c *Collector) containerState(ref StreamRef) containerState {
	pod := c.Pods(ref.Namespace, ref.Pod)
	if pod == nil || string(pod.UID) != ref.PodUID {
		return containerState{ended: true, gone: true}
	}
	finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	for _, st := range allStatuses(pod) {
		if st.Name == ref.Container {
			replaced := st.ContainerID != ref.ContainerID
			return containerState{ended: finished || replaced || st.State.Terminated != nil, replaced: replaced}
		}
	}
	return containerState{ended: finished}
}

// maybeFinish marks the run done once its pod has ended (or is gone) and
// every stream is drained, and parses its result from the stored lines.
func (c *Collector) maybeFinish(ns, name string, uid types.UID, run string) {
	pod := c.Pods(ns, name)
	gone := pod == nil || pod.UID != uid
	if !gone && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return
	}
	if !gone {
		// The cache can show the pod finished before this collector saw
		// every container start: follow what is not followed yet first.
		c.followAll(pod, run)
	}
	c.mu.Lock()
	if ps := c.pods[uid]; ps != nil {
		for _, following := range ps.following {
			if following {
				c.mu.Unlock()
				return
			}
		}
		if gone {
			// Nothing more can come from this pod: forget its streams.
			ps.cancel()
			delete(c.pods, uid)
		}
	}
	c.mu.Unlock()
	if err := c.finish(run, gone); err != nil {
		c.Log.Error(err, "finishing run", "run", run)
	}
}

func (c *Collector) finish(run string, gone bool) error {
	// Every stream's end and the pod's deletion each come here; the log is
	// read and parsed once.
	if rec, err := c.Store.Run(run); err != nil || (rec != nil && rec.Done) {
		return err
	}
	var p result.Parser
	for after := uint64(0); ; {
		lines, err := c.Store.Lines(run, after, 1000)
		if err != nil {
			return err
		}
		if len(lines) == 0 {
			break
		}
		for _, l := range lines {
			p.Feed([]byte(l.Line))
		}
		after = lines[len(lines)-1].Seq
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
	if err == nil {
		c.mirror(run)
		c.Log.Info("run collected", "run", run, "phase", rec.Phase, "lines", rec.LastSeq)
		if c.JobFailure != nil && rec.Result != nil && rec.Result.Outcome != "" && rec.Result.Outcome != "succeeded" {
			c.wg.Add(1)
			go c.timedOut(rec)
		}
	}
	return err
}

func (c *Collector) mirror(run string) {
	err := c.Mirror.Sync(run)
	if errors.Is(err, mirror.ErrLocked) {
		// Someone held the file's lock: the next commit's sync catches
		// it up, and for a run that has no next commit (it finished) one
		// in a while does, without holding up the caller.
		c.Log.Info("the run's NDJSON mirror file is locked by another process; trying again later", "run", run)
		c.retryMirror(run)
		return
	}
	if err != nil {
		c.Log.Error(err, "mirroring the run's NDJSON file", "run", run)
	}
}

// retryMirror syncs run's mirror again in the background, every few
// seconds while its file stays locked, ten times at most.
func (c *Collector) retryMirror(run string) {
	c.later("mirror/"+run, 3*time.Second, 10, func() bool {
		err := c.Mirror.Sync(run)
		if err != nil && !errors.Is(err, mirror.ErrLocked) {
			c.Log.Error(err, "mirroring the run's NDJSON file", "run", run)
		}
		return !errors.Is(err, mirror.ErrLocked)
	}, func() {
		c.Log.Info("gave up mirroring the run's NDJSON file: it stayed locked by another process; its log is in the store", "run", run)
	})
}

// describe copies what the pod says about its run into the record.
func describe(r *store.Run, pod *corev1.Pod) {
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
				f = time.Now()
			}
			r.FinishedAt = &f
		}
	}
}

func allStatuses(pod *corev1.Pod) []corev1.ContainerStatus {
	out := append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...)
	return append(out, pod.Status.ContainerStatuses...)
}

// Reconcile finishes runs left unfinished in the store whose pod no
// longer exists (deleted while the relay was down): their log is what was
// stored, and their phase is Unknown unless it was seen to end.
func (c *Collector) Reconcile() (int, error) {
	runs, err := c.Store.RunsWhere(store.Filter{Unfinished: true})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range runs {
		if !c.owns(runID(r.ID)) {
			continue // another relay's to finish
		}
		if p := c.Pods(r.Namespace, r.Pod); p != nil && string(p.UID) == r.PodUID {
			continue
		}
		if err := c.finish(r.ID, true); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// runID is the run id (the pods' label) of the run kept under key: key
// itself, or what precedes the Job's UID in store.RunKey.
func runID(key string) string {
	id, _, _ := strings.Cut(key, "@")
	return id
}

// timedOut marks the run's result timed out if its Job failed with
// DeadlineExceeded. The Job controller deletes the pods before it records
// the condition, so the Job is read a few times, off the informer's path.
func (c *Collector) timedOut(rec *store.Run) {
	defer c.wg.Done()
	for attempt := 0; attempt < 5; attempt++ {
		reason, err := c.JobFailure(c.ctx, rec.Namespace, rec.Job)
		if err == nil && reason == string(batchv1.JobReasonDeadlineExceeded) {
			if _, err := c.Store.UpdateRun(rec.ID, func(r *store.Run) {
				if r.Result != nil {
					r.Result.Outcome = result.OutcomeTimedOut
				}
			}); err != nil {
				c.Log.Error(err, "marking a run timed out", "run", rec.ID)
			}
			return
		}
		if err == nil && reason != "" {
			return // failed for another reason
		}
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
