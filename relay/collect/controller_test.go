package collect

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// podLogs serves one fakeLog per (pod, container).
type podLogs struct {
	mu   sync.Mutex
	logs map[string]*fakeLog
}

func (p *podLogs) get(pod, container string) *fakeLog {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := pod + "/" + container
	if p.logs[k] == nil {
		p.logs[k] = newFakeLog()
	}
	return p.logs[k]
}

func (p *podLogs) Stream(ctx context.Context, ns, pod, ctr string, since time.Time, prev bool) (io.ReadCloser, error) {
	if prev {
		ctr += "@previous"
	}
	return p.get(pod, ctr).Stream(ctx, ns, pod, ctr, since, prev)
}

// end ends the logs of a pod's containers that exited: their streams
// reach EOF, as a kubelet's do.
func (p *podLogs) end(pod string, containers ...string) {
	for _, c := range containers {
		p.get(pod, c).end()
	}
}

type podCache struct {
	mu   sync.Mutex
	pods map[string]*corev1.Pod
}

func (c *podCache) set(p *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pods[p.Name] = p.DeepCopy()
}

func (c *podCache) delete(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pods, name)
}

func (c *podCache) Pod(_, name string) *corev1.Pod {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pods[name]
}

func (c *podCache) Pods() ([]corev1.Pod, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []corev1.Pod
	for _, p := range c.pods {
		out = append(out, *p)
	}
	return out, nil
}

func terminated(name, id string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, ContainerID: id, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}
}

// runJob is the Job that controls the test pods.
var runJob = jobs.MakeJob("job-1", "ns").Agent("a").Run("run-1").UID("0b7a9c1d-0000-4000-8000-0000000000f1").Obj()

func agentPod(name, uid string, created time.Time) *corev1.Pod {
	p := jobs.MakePod(name, "ns").OwnedBy(runJob).Obj()
	p.UID, p.CreationTimestamp = types.UID(uid), metav1.Time{Time: created}
	p.Spec = corev1.PodSpec{InitContainers: []corev1.Container{{Name: "setup"}}, Containers: []corev1.Container{{Name: "agent"}}}
	return p
}

// runningAgentPod is an agent pod without init containers whose agent
// container, containerID, runs.
func runningAgentPod(name, uid string, created time.Time, containerID string) *corev1.Pod {
	p := agentPod(name, uid, created)
	p.Spec.InitContainers = nil
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", ContainerID: containerID,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	return p
}

func newCollector(t *testing.T) (*Collector, *podLogs, *podCache, *bolt.Store) {
	s, _ := storetest.Open(t)
	logs, cache := &podLogs{logs: map[string]*fakeLog{}}, &podCache{pods: map[string]*corev1.Pod{}}
	return newCollectorOn(t, s, logs, cache), logs, cache, s
}

// newCollectorOn is a collector of its own (a relay restarted, or another
// replica) on s, the logs and the pods.
func newCollectorOn(t *testing.T, s store.Backend, logs *podLogs, cache *podCache, opts ...func(*Collector)) *Collector {
	// The fake logs of exited containers end (podLogs.end), so no stream
	// here waits for the drain: its times are far above any stall of a
	// loaded machine, and the streams of finished containers cannot be
	// cut short by a slow one.
	c := &Collector{Store: s, Source: logs, Pods: cache, Log: logr.Discard(),
		Follow: FollowOptions{DrainIdle: 5 * time.Second, DrainMax: time.Minute, BatchWait: 5 * time.Millisecond, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond}}
	for _, o := range opts {
		o(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); c.Stop() })
	c.Start(ctx)
	return c
}

// syncPod reconciles pod at once, on the test's goroutine, as a worker
// of the queue does.
func syncPod(t *testing.T, c *Collector, pod *corev1.Pod) {
	t.Helper()
	if err := c.reconcile(podItemOf(pod)); err != nil {
		t.Fatal(err)
	}
}

func waitDone(t *testing.T, s *bolt.Store) *store.Run {
	t.Helper()
	var r *store.Run
	poll.WaitFor(t, func() bool { r, _ = s.Run("run-1"); return r != nil && r.Done }, "run not finished")
	return r
}

func storedText(t *testing.T, s *bolt.Store) string {
	lines, _ := store.Lines(s, "run-1", 0, 0)
	var out []string
	for _, l := range lines {
		out = append(out, l.Line)
	}
	return strings.Join(out, ",")
}

// TestCollectorFinishesOnlyAfterEveryContainer: the event that reaches the
// collector shows only the init container, while the cache already has the
// pod finished. The run must not be finished until the agent container's
// log (with the result) is collected too.
func TestCollectorFinishesOnlyAfterEveryContainer(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	final := agentPod("p1", "uid-1", time.Now())
	final.Status.Phase = corev1.PodSucceeded
	final.Status.InitContainerStatuses = []corev1.ContainerStatus{terminated("setup", "c-setup")}
	final.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-agent")}
	cache.set(final)
	logs.get("p1", "setup").write(at(0), "setup done")
	logs.get("p1", "agent").write(at(1), `{"type":"system","subtype":"init","session_id":"s1"}`)
	logs.get("p1", "agent").write(at(2), `{"type":"result","subtype":"success","result":"ok","session_id":"s1"}`)
	logs.end("p1", "setup", "agent")

	early := final.DeepCopy()
	early.Status.Phase = corev1.PodPending
	early.Status.ContainerStatuses = nil
	c.OnPod(early)
	r := waitDone(t, s)
	if got := storedText(t, s); !strings.Contains(got, "setup done") || !strings.Contains(got, `"result":"ok"`) {
		t.Fatalf("run finished with lines %q: the agent container was not collected", got)
	}
	if r.Result == nil || r.Result.Text != "ok" {
		t.Errorf("result %+v", r.Result)
	}
}

// TestCollectorRetriedPodContinuesRun: a Job that retries makes a second
// pod with the same run id; its lines continue the run.
func TestCollectorRetriedPodContinuesRun(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	first := agentPod("p1", "uid-1", time.Now())
	first.Status.Phase = corev1.PodFailed
	first.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c1")}
	first.Spec.InitContainers = nil
	cache.set(first)
	logs.get("p1", "agent").write(at(0), "attempt 1")
	logs.end("p1", "agent")
	c.OnPod(first)
	waitDone(t, s)

	second := agentPod("p2", "uid-2", time.Now().Add(time.Minute))
	second.Status.Phase = corev1.PodSucceeded
	second.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c2")}
	second.Spec.InitContainers = nil
	cache.set(second)
	logs.get("p2", "agent").write(at(5), "attempt 2")
	logs.end("p2", "agent")
	syncPod(t, c, second)
	r := waitDone(t, s) // the retry took the record back from done at once
	if got := storedText(t, s); got != "attempt 1,attempt 2" {
		t.Fatalf("lines %q", got)
	}
	if r.PodUID != "uid-2" || r.Phase != "Succeeded" {
		t.Errorf("record describes %s %s, want the newest pod", r.PodUID, r.Phase)
	}
	// A late event of the older pod does not take the record back.
	syncPod(t, c, first)
	if r, _ := s.Run("run-1"); r.PodUID != "uid-2" || !r.Done {
		t.Errorf("older pod's event changed the record: %+v", r)
	}
}

// TestAnOlderPodsDeletionDoesNotFinishTheRun: a Job retried, and its
// first pod is deleted while the second runs. The deletion finishes the
// run only if the deleted pod is the run's newest: the run goes on, and
// is finished by its own pod's end, with that pod's lines and result.
func TestAnOlderPodsDeletionDoesNotFinishTheRun(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	first := finishedPod(logs, cache, "p1", time.Now().Truncate(time.Second), "attempt 1")
	syncPod(t, c, first)
	waitDone(t, s)
	second := runningAgentPod("p2", "uid-p2", first.CreationTimestamp.Add(time.Minute), "c-p2")
	cache.set(second)
	syncPod(t, c, second)
	cache.delete("p1")
	syncPod(t, c, first) // its deletion, as the worker sees it
	if r, _ := s.Run("run-1"); r == nil || r.Done || r.PodUID != "uid-p2" {
		t.Fatalf("the older pod's deletion changed the run: %+v", r)
	}
	logs.get("p2", "agent").write(at(5), `{"type":"result","subtype":"success","result":"second","session_id":"s2"}`)
	poll.WaitFor(t, func() bool { return strings.Contains(storedText(t, s), "second") }, "the second pod's line was not stored")
	final := second.DeepCopy()
	final.Status.Phase = corev1.PodSucceeded
	final.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-p2")}
	cache.set(final)
	logs.end("p2", "agent")
	c.OnPod(final)
	r := waitDone(t, s)
	if r.Result == nil || r.Result.Text != "second" || r.Phase != "Succeeded" {
		t.Errorf("the run finished with %+v, phase %s: want the second pod's end", r.Result, r.Phase)
	}
}

// TestCollectorRestartedContainer: a container that restarted (new
// container ID) is a new stream of the same run; the replaced instance is
// read as "previous", and both instances' lines are kept once each.
func TestCollectorRestartedContainer(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	pod := agentPod("p1", "uid-1", time.Now())
	pod.Spec.InitContainers = nil
	pod.Status.Phase = corev1.PodSucceeded
	st := terminated("agent", "c2")
	st.RestartCount = 1
	st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", ContainerID: "c1"}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{st}
	cache.set(pod)
	logs.get("p1", "agent@previous").write(at(0), "first instance")
	logs.get("p1", "agent").write(at(10), "second instance")
	logs.end("p1", "agent@previous", "agent")
	c.OnPod(pod)
	waitDone(t, s)
	got := storedText(t, s)
	if got != "first instance,second instance" && got != "second instance,first instance" {
		t.Errorf("lines %q, want both instances once", got)
	}
}

// TestARestartedContainersNextInstanceIsNotReadAsItsOwn: the agent's
// container fails and the kubelet restarts it at once. The pod cache
// still has the status the kubelet wrote before the restart, the failed
// instance terminated, while the kubelet already serves the next
// instance's log as the container's current one. The failed instance's
// stream, at its end, reads its log once more from its cursor: not as the
// current log, which is the next instance's and would be stored twice,
// but as the previous one, once the pod shows the restart. Each
// instance's lines are stored once, the first's before the second's.
func TestARestartedContainersNextInstanceIsNotReadAsItsOwn(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	pod := runningAgentPod("p1", "uid-1", time.Now(), "c1")
	cache.set(pod)
	first := logs.get("p1", "agent")
	first.write(at(0), "first 1")
	first.write(at(1), "first 2")
	c.OnPod(pod)
	poll.WaitFor(t, func() bool { return storedText(t, s) == "first 1,first 2" }, "the first instance's lines were not stored")

	failed := pod.DeepCopy()
	failed.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", ContainerID: "c1"}}
	cache.set(failed)
	second := newFakeLog()
	second.write(at(2000), "second 1")
	second.write(at(2001), "second 2")
	logs.mu.Lock()
	logs.logs["p1/agent@previous"], logs.logs["p1/agent"] = first, second
	logs.mu.Unlock()
	first.end()
	c.OnPod(failed)
	// A stream that reads the current log now reads it at once.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && second.sessionsOpened() == 0 {
		time.Sleep(10 * time.Millisecond)
	}

	restarted := failed.DeepCopy()
	restarted.Status.ContainerStatuses[0] = corev1.ContainerStatus{Name: "agent", ContainerID: "c2", RestartCount: 1,
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		LastTerminationState: failed.Status.ContainerStatuses[0].State}
	cache.set(restarted)
	c.OnPod(restarted)
	poll.WaitFor(t, func() bool { return strings.Count(storedText(t, s), "second") >= 2 }, "the second instance's lines were not stored")
	final := restarted.DeepCopy()
	final.Status.Phase = corev1.PodSucceeded
	final.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: "c2"}}
	cache.set(final)
	second.end()
	c.OnPod(final)
	waitDone(t, s)
	if got := storedText(t, s); got != "first 1,first 2,second 1,second 2" {
		t.Errorf("stored %q, want each instance's lines once, the first's first", got)
	}
}

// TestContainerStateNamesTheLogOfTheInstance: which of the container's
// logs, current or previous, is the instance c1's for each status the
// pod cache may show of it, and when neither can be told yet.
func TestContainerStateNamesTheLogOfTheInstance(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	failed := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, ContainerID: "c1"}}
	done := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, ContainerID: "c1"}}
	backOff := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	older := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, ContainerID: "c2"}}
	for _, tc := range []struct {
		name     string
		phase    corev1.PodPhase
		deleting bool
		st       corev1.ContainerStatus
		want     containerState
	}{
		{"running", corev1.PodRunning, false, corev1.ContainerStatus{ContainerID: "c1", State: running}, containerState{}},
		{"failed, the pod going on", corev1.PodRunning, false, corev1.ContainerStatus{ContainerID: "c1", State: failed}, containerState{ended: true, restarting: true}},
		{"failed, the pod deleted", corev1.PodRunning, true, corev1.ContainerStatus{ContainerID: "c1", State: failed}, containerState{ended: true}},
		{"failed, the pod failed", corev1.PodFailed, false, corev1.ContainerStatus{ContainerID: "c1", State: failed}, containerState{ended: true}},
		{"exited 0", corev1.PodRunning, false, corev1.ContainerStatus{ContainerID: "c1", State: done}, containerState{ended: true}},
		{"backing off", corev1.PodRunning, false, corev1.ContainerStatus{ContainerID: "c1", State: backOff, LastTerminationState: failed}, containerState{ended: true, replaced: true}},
		{"restarted", corev1.PodRunning, false, corev1.ContainerStatus{ContainerID: "c2", State: running, LastTerminationState: failed}, containerState{ended: true, replaced: true}},
		{"restarted twice", corev1.PodRunning, false, corev1.ContainerStatus{ContainerID: "c3", State: running, LastTerminationState: older}, containerState{ended: true, lost: true}},
		{"no instance named", corev1.PodRunning, false, corev1.ContainerStatus{State: backOff}, containerState{ended: true, restarting: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, cache, _ := newCollector(t)
			pod := agentPod("p1", "uid-1", time.Now())
			pod.Status.Phase = tc.phase
			if tc.deleting {
				pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			}
			tc.st.Name = "agent"
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{tc.st}
			cache.set(pod)
			got := c.containerState(StreamRef{Namespace: "ns", Pod: "p1", PodUID: "uid-1", Container: "agent", ContainerID: "c1"})
			if tc.phase == corev1.PodFailed {
				tc.want.ended = true
			}
			if got != tc.want {
				t.Errorf("%+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCollectorKeepsOtherJobsApart: a run id is a label anyone who
// creates pods can copy. A bare pod, a pod in another namespace, or a pod
// of another Job carrying a run's id neither joins it (no line of theirs
// is stored, the run does not move namespace) nor finishes or reopens it;
// another Job's pods are kept as a run of their own.
func TestCollectorKeepsOtherJobsApart(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	real := runningAgentPod("p1", "uid-1", time.Now(), "c1")
	cache.set(real)
	logs.get("p1", "agent").write(at(0), "the agent's line")
	syncPod(t, c, real) // first: the run id is bound to its Job

	otherJob := jobs.MakeJob("job-x", "ns").Agent("a").Run("run-1").UID("6f1c2f1e-0000-4000-8000-00000000000a").Obj()
	intruders := map[string]*corev1.Pod{
		"bare pod":          jobs.MakePod("bare", "ns").Label(contract.LabelRunID, "run-1").Obj(),
		"another namespace": jobs.MakePod("pb", "team-b").OwnedBy(jobs.MakeJob("job-1", "team-b").Run("run-1").UID("0b7a9c1d-0000-4000-8000-000000000001").Obj()).Obj(),
		"another Job":       jobs.MakePod("px", "ns").OwnedBy(otherJob).Obj(),
	}
	before := testutil.ToFloat64(podsKeptApart.WithLabelValues("namespace"))
	for name, p := range intruders {
		p.Spec.Containers = []corev1.Container{{Name: "agent"}}
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "cx-"+p.Name)}
		logs.get(p.Name, "agent").write(at(1), `{"type":"result","result":"forged by `+name+`"}`)
		logs.end(p.Name, "agent")
		cache.set(p)
		c.OnPod(p)
		c.OnPod(p)
	}
	// Each other Job's pod is collected as a run of its own: once that run
	// is done, its follower has stored all it would have stored anywhere.
	// (The bare pod belongs to no run: it is ignored before any follower.)
	// Not collected, the checks below say where its pod went.
	for name, p := range intruders {
		if owner := metav1.GetControllerOf(p); owner != nil {
			key := store.RunKey("run-1", string(owner.UID))
			if !poll.Eventually(func() bool { r, _ := s.Run(key); return r != nil && r.Done }) {
				t.Errorf("%s: its own run %s was never collected", name, key)
			}
		}
	}
	r, _ := s.Run("run-1")
	if r.Namespace != "ns" || r.PodUID != "uid-1" || r.JobUID != string(runJob.UID) {
		t.Errorf("the run moved to an intruder: %+v", r)
	}
	if r.Done {
		t.Error("an intruder's end finished the run")
	}
	if got := storedText(t, s); got != "the agent's line" {
		t.Errorf("stored %q: an intruder's lines joined the run", got)
	}
	if testutil.ToFloat64(podsKeptApart.WithLabelValues("namespace")) <= before {
		t.Error("the pod kept apart was not counted")
	}
	// Nothing is dropped: each other Job's pods are a run of their own,
	// under the run id and that Job's UID, where a client that knows its
	// Job finds them (GET /v1/runs/run-1?job=<uid>).
	for name, p := range intruders {
		owner := metav1.GetControllerOf(p)
		if owner == nil {
			continue // a bare pod is part of no run
		}
		key := store.RunKey("run-1", string(owner.UID))
		apart, _ := s.Run(key)
		if apart == nil || apart.Namespace != p.Namespace || apart.JobUID != string(owner.UID) || apart.LastSeq != 1 {
			t.Errorf("%s: its run under %s is %+v", name, key, apart)
		}
	}

	// Once the run is over, a pod of another Job does not reopen it.
	real.Status.Phase = corev1.PodSucceeded
	real.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c1")}
	cache.set(real)
	logs.end("p1", "agent")
	c.OnPod(real)
	waitDone(t, s)
	late := jobs.MakePod("late", "ns").OwnedBy(otherJob).Obj()
	late.Spec.Containers = []corev1.Container{{Name: "agent"}}
	cache.set(late)
	syncPod(t, c, late)
	if r, _ := s.Run("run-1"); !r.Done || r.PodUID != "uid-1" {
		t.Errorf("a finished run was reopened: %+v", r)
	}
}

// TestKeptApartRunStaysApart: the bait that took the run id first printed
// nothing and finished; retention drops its record. The run kept apart
// must stay where it is (found by its Job, finished by its pod), not be
// split by a new record of the bare id (the relay's hostile review).
func TestKeptApartRunStaysApart(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	baitJob := jobs.MakeJob("bait", "team-b").Run("run-1").UID("0b7a9c1d-0000-4000-8000-00000000000b").Obj()
	bait := jobs.MakePod("bait-pod", "team-b").OwnedBy(baitJob).Obj()
	bait.Spec.Containers = []corev1.Container{{Name: "agent"}}
	bait.Status.Phase = corev1.PodSucceeded
	bait.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-bait")}
	logs.end("bait-pod", "agent")
	cache.set(bait)
	syncPod(t, c, bait) // first: the bait takes the run id

	real := runningAgentPod("p1", "uid-1", time.Now(), "c1")
	owner := metav1.GetControllerOf(real)
	key := store.RunKey("run-1", string(owner.UID))
	cache.set(real)
	logs.get("p1", "agent").write(at(0), "the agent's line")
	c.OnPod(real)
	poll.WaitFor(t, func() bool { r, _ := s.Run(key); return r != nil && r.LastSeq == 1 }, "the real run was not kept apart with its line")
	waitIndexedDone(t, s, "run-1") // the bait's
	if dropped, err := s.Retain(time.Nanosecond, 0, time.Now().Add(time.Hour)); err != nil || len(dropped) != 1 || dropped[0].ID != "run-1" {
		t.Fatalf("retention dropped %+v (%v), want the bait's finished run only", dropped, err)
	}
	syncPod(t, c, real) // a later update of the real pod
	if r, _ := s.Run("run-1"); r != nil {
		t.Errorf("the bare id was bound anew: %+v; the run must stay under %s", r, key)
	}
	real.Status.Phase = corev1.PodSucceeded
	real.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c1")}
	cache.set(real)
	logs.end("p1", "agent")
	c.OnPod(real)
	c.OnPod(real)
	poll.WaitFor(t, func() bool { r, _ := s.Run(key); return r != nil && r.Done }, "the run kept apart was not finished by its pod")
}

// TestPodWithAMalformedOwnerUIDIsNotKeptApart: the API server does not
// check an owner reference's UID, and a kept-apart run's key names its
// mirror file: a UID that is not one keys no run.
func TestPodWithAMalformedOwnerUIDIsNotKeptApart(t *testing.T) {
	c, _, cache, s := newCollector(t)
	first := jobs.MakePod("first", "ns").OwnedBy(jobs.MakeJob("j1", "ns").Run("run-1").UID("0b7a9c1d-0000-4000-8000-000000000011").Obj()).Obj()
	first.Spec.Containers = []corev1.Container{{Name: "agent"}}
	cache.set(first)
	syncPod(t, c, first)
	forged := jobs.MakePod("forged", "kube-system").OwnedBy(jobs.MakeJob("j2", "kube-system").Run("run-1").UID("x/../../pwned").Obj()).Obj()
	forged.Spec.Containers = []corev1.Container{{Name: "agent"}}
	cache.set(forged)
	before := testutil.ToFloat64(podsIgnored.WithLabelValues("job-uid"))
	syncPod(t, c, forged)
	if testutil.ToFloat64(podsIgnored.WithLabelValues("job-uid")) <= before {
		t.Error("the pod was not counted as ignored")
	}
	runs, _ := s.RunsWhere(store.Filter{})
	for _, r := range runs {
		if strings.Contains(r.ID, "pwned") {
			t.Errorf("a run keyed by a malformed UID: %q", r.ID)
		}
	}
}

// refusingStore refuses its first refusals record writes, as a store
// that is down or read only does.
type refusingStore struct {
	*bolt.Store
	refusals atomic.Int32
}

func (r *refusingStore) UpdateRun(run string, f func(*store.Run)) (*store.Run, error) {
	if r.refusals.Add(-1) >= 0 {
		return nil, errors.New("cannot execute UPDATE in a read-only transaction")
	}
	return r.Store.UpdateRun(run, f)
}

// TestCollectorTriesARefusedRecordAgain: the store refuses to record a
// run when its pod is first seen, and the pod does not change again
// (found by a hostile review: it was collected only at its pod's next
// event, which may be its end). The work queue tries the pod again after
// its rate limiter's delay, on the collector's clock: not before the
// clock moves, and by itself once it has, until the run's lines are
// stored.
func TestCollectorTriesARefusedRecordAgain(t *testing.T) {
	s, _ := storetest.Open(t)
	refusing := &refusingStore{Store: s}
	refusing.refusals.Store(2)
	logs, cache := &podLogs{logs: map[string]*fakeLog{}}, &podCache{pods: map[string]*corev1.Pod{}}
	clk := clocktesting.NewFakeClock(time.Now())
	c := newCollectorOn(t, refusing, logs, cache, func(c *Collector) { c.Clock = clk })
	pod := agentPod("p1", "uid-1", time.Now())
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", ContainerID: "c-agent",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	cache.set(pod)
	logs.get("p1", "agent").write(at(1), `{"type":"assistant","n":1}`)
	c.OnPod(pod)
	it := podItemOf(pod)
	poll.WaitFor(t, func() bool { return c.queue.NumRequeues(it) == 1 }, "the refused pod was not queued again")
	if n := refusing.refusals.Load(); n != 1 {
		t.Fatalf("the store was asked %d times before the clock moved, want once", 2-n)
	}
	poll.WaitFor(t, func() bool {
		clk.Step(c.Retry.Min)
		return strings.Contains(storedText(t, s), `"n":1`)
	}, "the run was never recorded after the store refused it")
	if n := refusing.refusals.Load(); n > -1 {
		t.Errorf("the store was asked %d times, want the refused two and more", 2-n)
	}
	if n := c.queue.NumRequeues(it); n != 0 {
		t.Errorf("the pod's failures counted %d after it was recorded, want them forgotten", n)
	}
}

// TestSweepFinishesTheRunsWhosePodsVanished: a relay that starts finds in
// its store runs whose pods were deleted while it was away; the sweep
// (through the queue) finishes them with what was stored, phase Unknown,
// and leaves the run whose pod remains and the run another relay owns.
func TestSweepFinishesTheRunsWhosePodsVanished(t *testing.T) {
	s, _ := storetest.Open(t)
	for _, r := range []struct{ id, pod string }{{"gone", "p-gone"}, {"running", "p-running"}, {"other@x", "p-other"}} {
		if _, err := s.UpdateRun(r.id, func(rec *store.Run) {
			rec.Namespace, rec.Pod, rec.PodUID, rec.Phase = "ns", r.pod, "uid-"+r.pod, "Running"
		}); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = storetest.Append(s, "gone", "st", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "stored before the pod went"), time.Now())
	logs, cache := &podLogs{logs: map[string]*fakeLog{}}, &podCache{pods: map[string]*corev1.Pod{}}
	cache.set(agentPod("p-running", "uid-p-running", time.Now()))
	c := newCollectorOn(t, s, logs, cache, func(c *Collector) { c.Owns = func(run string) bool { return run != "other" } })
	c.Sweep()
	poll.WaitFor(t, func() bool { r, _ := s.Run("gone"); return r.Done }, "the run whose pod vanished was not finished")
	if r, _ := s.Run("gone"); r.Phase != "Unknown" || r.LastSeq != 1 {
		t.Errorf("the run whose pod vanished: phase %s, %d lines; want Unknown and the line stored", r.Phase, r.LastSeq)
	}
	for _, id := range []string{"running", "other@x"} {
		if r, _ := s.Run(id); r.Done {
			t.Errorf("run %s finished by the sweep", id)
		}
	}
}
