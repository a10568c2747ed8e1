package claim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
)

type staticConfig struct{ cfg *config.Config }

func (s staticConfig) Current() *config.Config { return s.cfg }

var (
	base   = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	agentQ = Request{Namespace: "paperclip", Agent: "agent-q"}
)

func queuedRun(name string, created time.Time) *batchv1.Job {
	return jobs.MakeJob(name, "paperclip").Agent("agent-q").Created(created).Queued().Obj()
}

func runningRun(name string, created time.Time) *batchv1.Job {
	return jobs.MakeJob(name, "paperclip").Agent("agent-q").Created(created).Suspend(false).Obj()
}

// testController returns a controller whose writes and live reads go to a
// client-go fake, and whose cache is a snapshot of it (see refresh).
func testController(t *testing.T, mode string, objs ...runtime.Object) (*Controller, *fake.Clientset) {
	t.Helper()
	return testControllerWith(t, "policy:\n  concurrency:\n    mode: "+mode+"\n", objs...)
}

// testControllerWith is testController with config (YAML after the
// header).
func testControllerWith(t *testing.T, cfgYAML string, objs ...runtime.Object) (*Controller, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset(objs...)
	cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\n" + cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	r := &Controller{Client: cs, Lock: NewLock(cs), Configs: staticConfig{cfg}, Log: logr.Discard()}
	refresh(t, r, cs)
	return r, cs
}

// refresh shows the controller the Jobs the API has now, as its informer
// would after the events.
func refresh(t *testing.T, r *Controller, cs *fake.Clientset) {
	t.Helper()
	list, err := cs.BatchV1().Jobs("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	r.Jobs = crfake.NewClientBuilder().WithObjects(objs...).
		WithIndex(&batchv1.Job{}, IndexAgent, func(o client.Object) []string {
			return []string{o.GetLabels()[contract.LabelAgentID]}
		}).Build()
}

func started(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok && a.GetResource().Resource == "jobs" && strings.Contains(string(p.GetPatch()), `"suspend":false`) {
			out = append(out, p.GetName())
		}
	}
	return out
}

func getJob(t *testing.T, cs *fake.Clientset, name string) *batchv1.Job {
	t.Helper()
	j, err := cs.BatchV1().Jobs("paperclip").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func leases(t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	list, err := cs.CoordinationV1().Leases("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range list.Items {
		out = append(out, HolderOf(&l).Name)
	}
	return out
}

func reconcileOK(t *testing.T, r *Controller, req Request) {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
}

func TestStartsTheOldestWaitingRun(t *testing.T) {
	r, cs := testController(t, "Queue",
		queuedRun("b", base.Add(2*time.Second)), queuedRun("a", base.Add(time.Second)), queuedRun("c", base.Add(3*time.Second)))
	reconcileOK(t, r, agentQ)
	if got := started(cs); len(got) != 1 || got[0] != "a" {
		t.Fatalf("started %v, want [a] (the oldest)", got)
	}
	if got := leases(t, cs); len(got) != 1 || got[0] != "a" {
		t.Errorf("claim held by %v, want a", got)
	}
	refresh(t, r, cs)
	reconcileOK(t, r, agentQ)
	if got := started(cs); len(got) != 1 {
		t.Errorf("a second run started while the first runs: %v", got)
	}
}

// A leader that took the claim for the oldest run and died before
// unsuspending it (a restart mid-decision): the next leader finds the
// claim held by that very run and starts it, and no other.
func TestFinishesAStartCutShort(t *testing.T) {
	a, b := queuedRun("a", base.Add(time.Second)), queuedRun("b", base.Add(2*time.Second))
	r, cs := testController(t, "Queue", a, b)
	if err := r.Lock.Acquire(context.Background(), a, r.Configs.Current().Policy.Concurrency, false); err != nil {
		t.Fatal(err)
	}
	next := &Controller{Client: cs, Lock: NewLock(cs), Configs: r.Configs, Log: logr.Discard()}
	refresh(t, next, cs)
	reconcileOK(t, next, agentQ)
	if got := started(cs); len(got) != 1 || got[0] != "a" {
		t.Fatalf("started %v, want [a], whose start was cut short", got)
	}
	if got := leases(t, cs); len(got) != 1 || got[0] != "a" {
		t.Errorf("claim held by %v, want a", got)
	}
}

// A run that predates a switch to Queue mode holds no claim; it still
// makes the agent busy.
func TestWaitsForAnUnclaimedRunningJob(t *testing.T) {
	r, cs := testController(t, "Queue", runningRun("old-running", base), queuedRun("waiting", base.Add(time.Second)))
	reconcileOK(t, r, agentQ)
	if got := started(cs); len(got) != 0 {
		t.Errorf("started %v beside a running Job", got)
	}
}

// Queued runs are served after a switch to Disabled, without claims.
func TestServesTheQueueWhenDisabled(t *testing.T) {
	r, cs := testController(t, "Disabled", queuedRun("waiting", base))
	reconcileOK(t, r, agentQ)
	if got := started(cs); len(got) != 1 {
		t.Errorf("started %v, want the stranded run", got)
	}
	if got := leases(t, cs); len(got) != 0 {
		t.Errorf("Disabled mode took a claim: %v", got)
	}
}

// Agents and namespaces are separate queues under scope Namespace.
func TestOnlyTheRequestedAgentStarts(t *testing.T) {
	other := jobs.MakeJob("other", "paperclip").Agent("agent-other").Created(base).Queued().Obj()
	elsewhere := jobs.MakeJob("elsewhere", "team-b").Agent("agent-q").Created(base).Queued().Obj()
	r, cs := testController(t, "Queue", other, elsewhere, queuedRun("mine", base.Add(time.Second)))
	reconcileOK(t, r, agentQ)
	if got := started(cs); len(got) != 1 || got[0] != "mine" {
		t.Errorf("started %v, want [mine]", got)
	}
}

// A start whose answer is lost although it landed keeps its claim; one
// that really failed gives the claim back, is counted on the Job, and is
// retried (an error makes the controller requeue with backoff).
func TestFailedStart(t *testing.T) {
	for _, landed := range []bool{false, true} {
		r, cs := testController(t, "Queue", queuedRun("waiting", base))
		cs.PrependReactor("patch", "jobs", func(a clienttesting.Action) (bool, runtime.Object, error) {
			if !strings.Contains(string(a.(clienttesting.PatchAction).GetPatch()), `"suspend":false`) {
				return false, nil, nil
			}
			if landed { // through the tracker: the clientset is locked in a reactor
				obj, _ := cs.Tracker().Get(batchv1.SchemeGroupVersion.WithResource("jobs"), "paperclip", "waiting")
				job := obj.(*batchv1.Job).DeepCopy()
				job.Spec.Suspend = ptr.To(false)
				_ = cs.Tracker().Update(batchv1.SchemeGroupVersion.WithResource("jobs"), job, "paperclip")
			}
			return true, nil, errors.New("connection reset")
		})
		_, err := r.Reconcile(context.Background(), agentQ)
		if err == nil || !strings.Contains(err.Error(), "connection reset") {
			t.Errorf("landed=%v: a failed start must be retried, got %v", landed, err)
		}
		held := leases(t, cs)
		if landed && len(held) != 1 {
			t.Error("the claim of a run that did start was released")
		}
		if !landed {
			if len(held) != 0 {
				t.Error("the claim of a run that never started was kept")
			}
			if got := getJob(t, cs, "waiting").Annotations[contract.AnnotationStartFailures]; got != "1" {
				t.Errorf("failure count %q, want 1", got)
			}
		}
	}
}

// A run whose start always fails is marked after maxStartFailures attempts
// (the count lives on the Job, so a new leader keeps it) and the next one
// starts.
func TestMovesPastARunThatCannotStart(t *testing.T) {
	r, cs := testController(t, "Queue", queuedRun("stuck", base), queuedRun("next", base.Add(time.Second)))
	cs.PrependReactor("patch", "jobs", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		if p.GetName() == "stuck" && strings.Contains(string(p.GetPatch()), `"suspend":false`) {
			return true, nil, errors.New(`admission webhook "other.policy" denied the request`)
		}
		return false, nil, nil
	})
	for i := 1; i <= maxStartFailures; i++ {
		refresh(t, r, cs)
		_, err := r.Reconcile(context.Background(), agentQ)
		if i < maxStartFailures && err == nil {
			t.Fatalf("attempt %d: no error, so no retry", i)
		}
		if i == maxStartFailures && err != nil {
			t.Fatalf("attempt %d: the run is marked; want no error, got %v", i, err)
		}
	}
	stuck := getJob(t, cs, "stuck")
	if !strings.Contains(stuck.Annotations[contract.AnnotationQueueError], "other.policy") {
		t.Fatalf("the run that cannot start was not marked: %v", stuck.Annotations)
	}
	if _, ok := stuck.Annotations[contract.AnnotationStartFailures]; ok {
		t.Error("the count stays after marking: removing the error would not give three more tries")
	}
	refresh(t, r, cs)
	reconcileOK(t, r, agentQ)
	if got := getJob(t, cs, "next"); got.Spec.Suspend == nil || *got.Spec.Suspend {
		t.Error("the queue did not move past the run that cannot start")
	}
}

// A run the start check refuses (403: dressed as complete, or completed
// under a source no longer in force) is marked at once with the refusal,
// its claim given back, and the next run starts.
func TestMarksARefusedRunAtOnce(t *testing.T) {
	r, cs := testController(t, "Queue", queuedRun("refused", base), queuedRun("next", base.Add(time.Second)))
	cs.PrependReactor("patch", "jobs", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		if p.GetName() == "refused" && strings.Contains(string(p.GetPatch()), `"suspend":false`) {
			return true, nil, apierrors.NewForbidden(batchv1.Resource("jobs"), "refused", errors.New("this run cannot start: images"))
		}
		return false, nil, nil
	})
	refresh(t, r, cs)
	reconcileOK(t, r, agentQ)
	if got := getJob(t, cs, "refused").Annotations[contract.AnnotationQueueError]; !strings.Contains(got, "this run cannot start") {
		t.Fatalf("the refused run is not marked with its refusal: %q", got)
	}
	if len(leases(t, cs)) != 0 {
		t.Error("the refused run kept the claim")
	}
	refresh(t, r, cs)
	reconcileOK(t, r, agentQ)
	if got := getJob(t, cs, "next"); got.Spec.Suspend == nil || *got.Spec.Suspend {
		t.Error("the queue did not move past the refused run")
	}
}

// With maxQueued, runs beyond the bound that got past admission (their
// CREATE judged at start, with compiled policies) are refused newest
// first, marked with the queue-full cause; the oldest wait on.
func TestRefusesRunsBeyondMaxQueued(t *testing.T) {
	r, cs := testControllerWith(t, "policy:\n  concurrency:\n    mode: Queue\n    maxQueued: 1\n",
		runningRun("holder", base), queuedRun("first", base.Add(time.Second)), queuedRun("second", base.Add(2*time.Second)), queuedRun("third", base.Add(3*time.Second)))
	reconcileOK(t, r, agentQ)
	if got := getJob(t, cs, "first"); got.Annotations[contract.AnnotationQueueError] != "" || got.Annotations[contract.AnnotationQueuePosition] != "1" {
		t.Errorf("the oldest waiting run does not wait at position 1: %v", got.Annotations)
	}
	for _, name := range []string{"second", "third"} {
		if got := getJob(t, cs, name).Annotations[contract.AnnotationQueueError]; !strings.HasPrefix(got, string(contract.CauseQueueFull)+": ") {
			t.Errorf("run %s beyond maxQueued is not refused with the queue-full cause: %q", name, got)
		}
	}
}

// An ended run frees its claim, and the agent's next queued run starts in
// the same pass; for a deleted Job, the request alone names it.
func TestEndedRunReleasesAndStartsTheNext(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		holder := runningRun("holder", base)
		r, cs := testController(t, "Queue", holder, queuedRun("waiting", base.Add(time.Second)))
		if err := r.Lock.Acquire(context.Background(), holder, r.Configs.Current().Policy.Concurrency, false); err != nil {
			t.Fatal(err)
		}
		if deleted {
			if err := cs.BatchV1().Jobs("paperclip").Delete(context.Background(), "holder", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			done := jobs.MakeJob("holder", "paperclip").Agent("agent-q").Created(base).Suspend(false).Condition(batchv1.JobComplete).Obj()
			if _, err := cs.BatchV1().Jobs("paperclip").Update(context.Background(), done, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		refresh(t, r, cs)
		req := agentQ
		req.Ended = EndedRun{Name: "holder", UID: holder.UID, Deleted: deleted}
		res, err := r.Reconcile(context.Background(), req)
		if err != nil || res.Requeue { //nolint:staticcheck // asserting the rate-limited requeue
			t.Fatalf("deleted=%v: %+v, %v", deleted, res, err)
		}
		if got := leases(t, cs); len(got) != 1 || got[0] != "waiting" {
			t.Errorf("deleted=%v: claim held by %v, want the next run", deleted, got)
		}
		if got := started(cs); len(got) != 1 || got[0] != "waiting" {
			t.Errorf("deleted=%v: started %v", deleted, got)
		}
	}
}

// A run whose pods still terminate keeps its claim (they still write to
// the shared volume); the request is requeued with backoff until they end.
func TestEndedRunHeldWhilePodsTerminate(t *testing.T) {
	holder := runningRun("holder", base)
	pod := jobs.MakePod("holder-pod", "paperclip").OwnedBy(holder).Phase(corev1.PodRunning).Obj()
	r, cs := testController(t, "Reject", holder, pod)
	if err := r.Lock.Acquire(context.Background(), holder, r.Configs.Current().Policy.Concurrency, false); err != nil {
		t.Fatal(err)
	}
	if err := cs.BatchV1().Jobs("paperclip").Delete(context.Background(), "holder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	req := agentQ
	req.Ended = EndedRun{Name: "holder", UID: holder.UID, Deleted: true}
	res, err := r.Reconcile(context.Background(), req)
	if err != nil || !res.Requeue { //nolint:staticcheck // asserting the rate-limited requeue
		t.Fatalf("pods still running: want a requeue, got %+v, %v", res, err)
	}
	if got := leases(t, cs); len(got) != 1 {
		t.Fatal("claim freed while the run's pod still runs")
	}
	if err := cs.CoreV1().Pods("paperclip").Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err = r.Reconcile(context.Background(), req)
	if err != nil || res.Requeue { //nolint:staticcheck // asserting the rate-limited requeue
		t.Fatalf("pods gone: %+v, %v", res, err)
	}
	if got := leases(t, cs); len(got) != 0 {
		t.Errorf("claim kept after the pods ended: %v", got)
	}
}

// A claim taken by another run meanwhile is not the ended run's to free.
func TestEndedRunLeavesAnotherHoldersClaim(t *testing.T) {
	next := runningRun("next", base.Add(time.Second))
	r, cs := testController(t, "Reject", next)
	if err := r.Lock.Acquire(context.Background(), next, r.Configs.Current().Policy.Concurrency, false); err != nil {
		t.Fatal(err)
	}
	req := agentQ
	req.Ended = EndedRun{Name: "old", UID: "uid-old", Deleted: true}
	res, err := r.Reconcile(context.Background(), req)
	if err != nil || res.Requeue { //nolint:staticcheck // asserting the rate-limited requeue
		t.Fatalf("%+v, %v", res, err)
	}
	if got := leases(t, cs); len(got) != 1 || got[0] != "next" {
		t.Errorf("claim %v, want next's kept", got)
	}
}

// TestJobEvents: which Job events wake which request. A running Job's
// status updates wake nothing; the informer is not a write path.
func TestJobEvents(t *testing.T) {
	h := jobEvents()
	ctx := context.Background()
	done := jobs.MakeJob("done", "paperclip").Agent("agent-q").Condition(batchv1.JobFailed).Obj()
	running := runningRun("running", base)
	waiting := queuedRun("waiting", base)
	for _, tc := range []struct {
		name string
		fire func(q workqueue.TypedRateLimitingInterface[Request])
		want []Request
	}{
		{name: "queued run created", fire: func(q workqueue.TypedRateLimitingInterface[Request]) {
			h.Create(ctx, event.TypedCreateEvent[*batchv1.Job]{Object: waiting}, q)
		}, want: []Request{agentQ}},
		{name: "running run created", fire: func(q workqueue.TypedRateLimitingInterface[Request]) {
			h.Create(ctx, event.TypedCreateEvent[*batchv1.Job]{Object: running}, q)
		}},
		{name: "running run's status changes", fire: func(q workqueue.TypedRateLimitingInterface[Request]) {
			h.Update(ctx, event.TypedUpdateEvent[*batchv1.Job]{ObjectOld: running, ObjectNew: runningRun("running", base)}, q)
		}},
		{name: "run finished", fire: func(q workqueue.TypedRateLimitingInterface[Request]) {
			h.Update(ctx, event.TypedUpdateEvent[*batchv1.Job]{ObjectOld: running, ObjectNew: done}, q)
		}, want: []Request{{Namespace: "paperclip", Agent: "agent-q", Ended: EndedRun{Name: "done", UID: done.UID}}}},
		{name: "run deleted", fire: func(q workqueue.TypedRateLimitingInterface[Request]) {
			h.Delete(ctx, event.TypedDeleteEvent[*batchv1.Job]{Object: running}, q)
		}, want: []Request{{Namespace: "paperclip", Agent: "agent-q", Ended: EndedRun{Name: "running", UID: running.UID, Deleted: true}}}},
		{name: "sweep wakes a queued run", fire: func(q workqueue.TypedRateLimitingInterface[Request]) {
			h.Generic(ctx, event.TypedGenericEvent[*batchv1.Job]{Object: waiting}, q)
		}, want: []Request{agentQ}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[Request]())
			defer q.ShutDown()
			tc.fire(q)
			var got []Request
			for q.Len() > 0 {
				req, _ := q.Get()
				got = append(got, req)
				q.Done(req)
			}
			if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Each waiting run says where it stands and whose run it waits for; the
// marks are written once.
func TestQueuedRunsKnowTheirPlace(t *testing.T) {
	r, cs := testController(t, "Queue", runningRun("holder", base),
		queuedRun("b", base.Add(2*time.Second)), queuedRun("a", base.Add(time.Second)))
	reconcileOK(t, r, agentQ)
	for name, want := range map[string]string{"a": "1", "b": "2"} {
		j := getJob(t, cs, name)
		if j.Annotations[contract.AnnotationQueuePosition] != want || j.Annotations[contract.AnnotationQueueHolder] != "paperclip/holder" {
			t.Errorf("%s: position %q holder %q, want %s behind paperclip/holder", name,
				j.Annotations[contract.AnnotationQueuePosition], j.Annotations[contract.AnnotationQueueHolder], want)
		}
	}
	refresh(t, r, cs)
	cs.ClearActions()
	reconcileOK(t, r, agentQ)
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("marks written again: %v", a)
		}
	}
	// Once started, a run waits for nobody: its marks go.
	r2, cs2 := testController(t, "Queue", queuedRun("first", base), queuedRun("second", base.Add(time.Second)))
	reconcileOK(t, r2, agentQ)
	if j := getJob(t, cs2, "first"); j.Annotations[contract.AnnotationQueuePosition] != "" || j.Annotations[contract.AnnotationQueueHolder] != "" || suspendedJob(j) {
		t.Errorf("a started run keeps its queue marks %v (suspend %v)", j.Annotations, j.Spec.Suspend)
	}
	// and the rest wait behind it at once, its start written only once.
	if j := getJob(t, cs2, "second"); j.Annotations[contract.AnnotationQueuePosition] != "1" || j.Annotations[contract.AnnotationQueueHolder] != "paperclip/first" {
		t.Errorf("the next run's marks %v, want 1 behind paperclip/first", j.Annotations)
	}
	patches := 0
	for _, a := range cs2.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok && p.GetName() == "first" {
			patches++
		}
	}
	if patches != 1 {
		t.Errorf("the started run was patched %d times, want once", patches)
	}
}

func suspendedJob(j *batchv1.Job) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }
