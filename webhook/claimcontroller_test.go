package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

func queueJob(name string, created time.Time, suspended, queuedRun bool) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "paperclip", UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.Time{Time: created}, Annotations: map[string]string{},
		Labels: map[string]string{contract.LabelAgentID: "agent-q", contract.LabelRunID: name}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(suspended)}}
	if queuedRun {
		j.Annotations[contract.AnnotationQueued] = "true"
	}
	return j
}

func testController(t *testing.T, mode string, jobs ...*batchv1.Job) (*ClaimController, *fake.Clientset) {
	t.Helper()
	var objs []runtime.Object
	for _, j := range jobs {
		objs = append(objs, j)
	}
	cs := fake.NewClientset(objs...)
	cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\npolicy:\n  concurrency:\n    mode: " + mode + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byAgent: func(obj any) ([]string, error) {
		return []string{obj.(*batchv1.Job).Labels[contract.LabelAgentID]}, nil
	}})
	for _, j := range jobs {
		_ = idx.Add(j)
	}
	return &ClaimController{Client: cs, Claims: NewClaims(cs), Configs: staticConfig{cfg}, Log: logr.Discard(), jobs: idx}, cs
}

func started(t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	var out []string
	for _, a := range cs.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok && a.GetResource().Resource == "jobs" {
			out = append(out, p.GetName())
		}
	}
	return out
}

func TestStartNextStartsTheOldestWaitingRun(t *testing.T) {
	now := time.Now()
	r, cs := testController(t, "Queue",
		queueJob("b", now.Add(2*time.Second), true, true),
		queueJob("a", now.Add(time.Second), true, true),
		queueJob("c", now.Add(3*time.Second), true, true))
	r.startNext(context.Background(), queueJob("a", now, true, true))
	if got := started(t, cs); len(got) != 1 || got[0] != "a" {
		t.Fatalf("started %v, want [a] (the oldest)", got)
	}
	// As the informer would show it: a runs now. Another round starts
	// nothing while it does.
	_ = r.jobs.Update(queueJob("a", now.Add(time.Second), false, true))
	r.startNext(context.Background(), queueJob("a", now, true, true))
	if got := started(t, cs); len(got) != 1 {
		t.Errorf("a second run started while the first holds the claim: %v", got)
	}
}

// A run that predates a switch to Queue mode holds no claim; it still
// makes the agent busy.
func TestStartNextWaitsForAnUnclaimedRunningJob(t *testing.T) {
	now := time.Now()
	r, cs := testController(t, "Queue",
		queueJob("old-running", now, false, false),
		queueJob("waiting", now.Add(time.Second), true, true))
	r.startNext(context.Background(), queueJob("waiting", now, true, true))
	if got := started(t, cs); len(got) != 0 {
		t.Errorf("started %v beside a running Job", got)
	}
}

// Queued runs are served after a switch to Disabled, without claims.
func TestStartNextWhenDisabled(t *testing.T) {
	r, cs := testController(t, "Disabled", queueJob("waiting", time.Now(), true, true))
	r.startNext(context.Background(), queueJob("waiting", time.Now(), true, true))
	if got := started(t, cs); len(got) != 1 {
		t.Errorf("started %v, want the stranded run", got)
	}
	leases, _ := cs.CoordinationV1().Leases("").List(context.Background(), metav1.ListOptions{})
	if len(leases.Items) != 0 {
		t.Error("Disabled mode took a claim")
	}
}

// A start whose answer is lost although it landed keeps its claim; one
// that really failed gives the claim back.
func TestStartNextFailedPatch(t *testing.T) {
	for _, landed := range []bool{false, true} {
		r, cs := testController(t, "Queue", queueJob("waiting", time.Now(), true, true))
		cs.PrependReactor("patch", "jobs", func(clienttesting.Action) (bool, runtime.Object, error) {
			if landed {
				j, _ := cs.Tracker().Get(batchv1.SchemeGroupVersion.WithResource("jobs"), "paperclip", "waiting")
				job := j.(*batchv1.Job).DeepCopy()
				job.Spec.Suspend = ptr.To(false)
				_ = cs.Tracker().Update(batchv1.SchemeGroupVersion.WithResource("jobs"), job, "paperclip")
			}
			return true, nil, errors.New("connection reset")
		})
		r.startNext(context.Background(), queueJob("waiting", time.Now(), true, true))
		leases, _ := cs.CoordinationV1().Leases("paperclip").List(context.Background(), metav1.ListOptions{})
		if landed && len(leases.Items) != 1 {
			t.Error("the claim of a run that did start was released")
		}
		if !landed && len(leases.Items) != 0 {
			t.Error("the claim of a run that never started was kept")
		}
	}
}

// TestStartNextMovesPastARunThatCannotStart: a run whose start always
// fails is marked after maxStartFailures attempts and the next one starts.
func TestStartNextMovesPastARunThatCannotStart(t *testing.T) {
	now := time.Now()
	stuck, next := queueJob("stuck", now, true, true), queueJob("next", now.Add(time.Second), true, true)
	r, cs := testController(t, "Queue", stuck, next)
	cs.PrependReactor("patch", "jobs", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		if p.GetName() == "stuck" && strings.Contains(string(p.GetPatch()), "suspend") {
			return true, nil, errors.New(`admission webhook "other.policy" denied the request`)
		}
		return false, nil, nil
	})
	for i := 0; i < maxStartFailures; i++ {
		r.startNext(context.Background(), stuck)
	}
	j, _ := cs.BatchV1().Jobs("paperclip").Get(context.Background(), "stuck", metav1.GetOptions{})
	if j.Annotations[contract.AnnotationQueueError] == "" {
		t.Fatalf("the run that cannot start was not marked: %v", j.Annotations)
	}
	_ = r.jobs.Update(j) // as the informer would show it
	r.startNext(context.Background(), stuck)
	got, _ := cs.BatchV1().Jobs("paperclip").Get(context.Background(), "next", metav1.GetOptions{})
	if got.Spec.Suspend == nil || *got.Spec.Suspend {
		t.Error("the queue did not move past the run that cannot start")
	}
}
