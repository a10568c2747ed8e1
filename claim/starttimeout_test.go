package claim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
)

// startedRun is a run of agent-q the Job controller started at base, with
// no pod ready.
func startedRun(name string) *jobs.JobWrapper {
	return jobs.MakeJob(name, "paperclip").Agent("agent-q").Created(base).Started(base).Active(1).Ready(0)
}

func pullBackOff(job *batchv1.Job) *corev1.Pod {
	return jobs.MakePod(job.Name+"-x", job.Namespace).OwnedBy(job).
		Waiting("agent", "ImagePullBackOff", `Back-off pulling image "ghcr.io/paperclipai/nope:1"`).Obj()
}

// ended returns the start-timeout patch sent for the Job, if any.
func ended(t *testing.T, cs interface{ Actions() []clienttesting.Action }, name string) (deadline int64, why string, ok bool) {
	t.Helper()
	for _, a := range cs.Actions() {
		p, isPatch := a.(clienttesting.PatchAction)
		if !isPatch || a.GetResource().Resource != "jobs" || p.GetName() != name ||
			!strings.Contains(string(p.GetPatch()), contract.AnnotationStartTimeout) {
			continue
		}
		var body struct {
			Metadata struct{ Annotations map[string]string }
			Spec     struct{ ActiveDeadlineSeconds int64 }
		}
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			t.Fatal(err)
		}
		return body.Spec.ActiveDeadlineSeconds, body.Metadata.Annotations[contract.AnnotationStartTimeout], true
	}
	return 0, "", false
}

func TestARunThatNeverStartsIsEndedAtItsStartTimeout(t *testing.T) {
	job := startedRun("stuck").Obj()
	r, cs := testController(t, "Reject", job, pullBackOff(job))
	clk := clocktesting.NewFakePassiveClock(base.Add(4 * time.Minute))
	r.Clock = clk

	res, err := r.Reconcile(context.Background(), agentQ)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := ended(t, cs, "stuck"); ok {
		t.Fatal("ended 4 minutes into a 10 minute start timeout")
	}
	if res.RequeueAfter != 6*time.Minute {
		t.Errorf("RequeueAfter %v, want 6m0s (when the timeout passes)", res.RequeueAfter)
	}

	clk.SetTime(base.Add(10*time.Minute + 30*time.Second))
	reconcileOK(t, r, agentQ)
	deadline, why, ok := ended(t, cs, "stuck")
	if !ok {
		t.Fatal("a run whose image cannot be pulled was not ended after its start timeout")
	}
	if deadline != 630 {
		t.Errorf("activeDeadlineSeconds %d, want 630 (the time it had, so the Job controller fails it now)", deadline)
	}
	for _, want := range []string{"10m0s", "ImagePullBackOff", "nope:1"} {
		if !strings.Contains(why, want) {
			t.Errorf("the annotation %q does not say %q", why, want)
		}
	}
	if got := getJob(t, cs, "stuck"); ptr.Deref(got.Spec.ActiveDeadlineSeconds, 0) != 630 {
		t.Errorf("the Job's deadline is %v after the patch", got.Spec.ActiveDeadlineSeconds)
	}
}

// What counts as started: any container that ran, even one that has
// ended; a pod that is Running. None of these may be ended, however late.
func TestARunThatStartedIsNeverEndedForIt(t *testing.T) {
	job := startedRun("ran").Obj()
	late := base.Add(time.Hour)
	for name, pod := range map[string]*corev1.Pod{
		"running": jobs.MakePod("p", "paperclip").OwnedBy(job).RunningContainer("agent", base.Add(time.Minute)).Obj(),
		"restarted": func() *corev1.Pod {
			p := pullBackOff(job)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{
				ExitCode: 1, StartedAt: metav1.NewTime(base)}
			return p
		}(),
		"succeeded": jobs.MakePod("p", "paperclip").OwnedBy(job).Phase(corev1.PodSucceeded).Obj(),
	} {
		r, cs := testController(t, "Reject", job, pod)
		r.Clock = clocktesting.NewFakePassiveClock(late)
		reconcileOK(t, r, agentQ)
		if _, why, ok := ended(t, cs, "ran"); ok {
			t.Errorf("%s: a run that started was ended: %s", name, why)
		}
	}
}

// The cache's ready count spares the pod reads: a run with a ready pod
// started, whatever the clock says.
func TestAReadyRunCostsNoPodRead(t *testing.T) {
	r, cs := testController(t, "Reject", startedRun("ready").Ready(1).Obj())
	r.Clock = clocktesting.NewFakePassiveClock(base.Add(time.Hour))
	reconcileOK(t, r, agentQ)
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "pods" || a.GetVerb() == "patch" {
			t.Errorf("a ready run cost a %s of %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// The profile's startTimeoutSeconds is the bound; a Job whose own
// deadline passed first is the Job controller's to end.
func TestTheProfileSetsTheStartTimeout(t *testing.T) {
	cfg := "profiles:\n  claude_local:\n    startTimeoutSeconds: 60\n"
	claude := startedRun("claude").Adapter("claude_local").Obj()
	own := startedRun("own-deadline").Adapter("claude_local").Obj()
	own.Spec.ActiveDeadlineSeconds = ptr.To[int64](45)
	other := jobs.MakeJob("other", "paperclip").Agent("agent-o").Created(base).Started(base).Ready(0).Obj()
	r, cs := testControllerWith(t, cfg, claude, own, other, pullBackOff(claude), pullBackOff(own), pullBackOff(other))
	r.Clock = clocktesting.NewFakePassiveClock(base.Add(90 * time.Second))
	reconcileOK(t, r, agentQ)
	reconcileOK(t, r, Request{Namespace: "paperclip", Agent: "agent-o"})
	if d, _, ok := ended(t, cs, "claude"); !ok || d != 90 {
		t.Errorf("claude_local run: ended=%v deadline %d, want ended at 90s by its profile's 60s", ok, d)
	}
	if _, _, ok := ended(t, cs, "own-deadline"); ok {
		t.Error("a Job whose own deadline has passed was patched; the Job controller is failing it")
	}
	if _, _, ok := ended(t, cs, "other"); ok {
		t.Error("the default profile's 10 minutes were cut to the claude_local profile's 60s")
	}
}

func TestStartStateSaysWhatThePodsWaitFor(t *testing.T) {
	job := startedRun("j").Obj()
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"no pod", nil, "no pod was created"},
		{"unschedulable", []corev1.Pod{*jobs.MakePod("p", "paperclip").OwnedBy(job).
			Unschedulable("0/1 nodes are available: 1 Insufficient cpu.").Obj()}, "p: Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."},
		{"config error", []corev1.Pod{*jobs.MakePod("p", "paperclip").OwnedBy(job).
			Waiting("agent", "CreateContainerConfigError", `secret "keys" not found`).Obj()}, `p/agent: CreateContainerConfigError: secret "keys" not found`},
		{"pending, nothing said", []corev1.Pod{*jobs.MakePod("p", "paperclip").OwnedBy(job).Phase(corev1.PodPending).Obj()}, "pod p is Pending"},
		{"long message", []corev1.Pod{*jobs.MakePod("p", "paperclip").OwnedBy(job).
			Waiting("agent", "ErrImagePull", strings.Repeat("x", 1000)).Obj()}, strings.Repeat("x", 300) + "..."},
	} {
		started, why := startState(tc.pods)
		if started || !strings.Contains(why, tc.want) {
			t.Errorf("%s: started=%v %q, want not started saying %q", tc.name, started, why, tc.want)
		}
		if len(why) > 400 {
			t.Errorf("%s: %d characters", tc.name, len(why))
		}
	}
}

// The controller hears of a run when the Job controller starts it (and on
// a new leader's first list), not on every status change after.
func TestAStartingRunWakesItsAgent(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[Request]())
	defer q.ShutDown()
	h := jobEvents()
	created := jobs.MakeJob("r", "paperclip").Agent("agent-q").Suspend(false).Obj()
	starting := startedRun("r").Obj()
	h.Update(context.Background(), event.TypedUpdateEvent[*batchv1.Job]{ObjectOld: created, ObjectNew: starting}, q)
	if q.Len() != 1 {
		t.Fatalf("a run that started did not wake its agent (%d queued)", q.Len())
	}
	req, _ := q.Get()
	q.Done(req)
	q.Forget(req)
	h.Update(context.Background(), event.TypedUpdateEvent[*batchv1.Job]{ObjectOld: starting, ObjectNew: startedRun("r").Active(1).Obj()}, q)
	if q.Len() != 0 {
		t.Error("a status change of a run already timed woke its agent again")
	}
	h.Create(context.Background(), event.TypedCreateEvent[*batchv1.Job]{Object: starting}, q)
	if q.Len() != 1 {
		t.Error("a new leader's list of an unstarted run did not wake its agent")
	}
}

// Nothing a client writes on its Job turns the start timeout off: not the
// annotation the controller records, not a deadline raised after the
// controller set one (the webhook refuses that; here the controller sets
// it again).
func TestTheStartTimeoutCannotBeSwitchedOff(t *testing.T) {
	forged := startedRun("forged").Annotation(contract.AnnotationStartTimeout, "none").Obj()
	raised := startedRun("raised").Obj()
	raised.Spec.ActiveDeadlineSeconds = ptr.To[int64](99999)
	r, cs := testController(t, "Reject", forged, raised, pullBackOff(forged), pullBackOff(raised))
	r.Clock = clocktesting.NewFakePassiveClock(base.Add(11 * time.Minute))
	reconcileOK(t, r, agentQ)
	for _, name := range []string{"forged", "raised"} {
		if _, _, ok := ended(t, cs, name); !ok {
			t.Errorf("%s: a run that never started was not ended", name)
		}
	}
}

// A paused run (parallelism 0) is not starting; resumed, its new pod gets
// its own start timeout, not the Job's first start's.
func TestAPausedRunIsNotTimed(t *testing.T) {
	paused := startedRun("paused").Obj()
	paused.Spec.Parallelism = ptr.To[int32](0)
	resumed := startedRun("resumed").Obj()
	fresh := pullBackOff(resumed)
	fresh.CreationTimestamp = metav1.NewTime(base.Add(30 * time.Minute))
	r, cs := testController(t, "Reject", paused, resumed, fresh)
	r.Clock = clocktesting.NewFakePassiveClock(base.Add(35 * time.Minute))
	res, err := r.Reconcile(context.Background(), agentQ)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"paused", "resumed"} {
		if _, why, ok := ended(t, cs, name); ok {
			t.Errorf("%s was ended: %s", name, why)
		}
	}
	if res.RequeueAfter != 5*time.Minute {
		t.Errorf("RequeueAfter %v, want 5m0s: the new pod's own timeout", res.RequeueAfter)
	}
}
