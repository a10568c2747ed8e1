package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestQueuedRunsWaitWhileClipjobIsDown: with compiled policies in Queue
// mode and every clipjob process stopped, a bare agent Job is still
// admitted — completed by its compiled policy, stored suspended — and
// waits; nobody else can start it, nor pass a Job off as another user's.
// A Job dressed as complete and queued is stored too (it cannot run
// while suspended), and is refused when clipjob's start check judges it.
// Back up, clipjob starts the waiting run. A Job the policy leaves to the
// webhook fails closed meanwhile.
func TestQueuedRunsWaitWhileClipjobIsDown(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stopSyncer, completed := in.CompiledQueueMode(ctx, t)
	review, err := suite.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	me := review.Status.UserInfo.Username

	// Every clipjob process stops (the syncer stands in for the elected
	// webhook replica's).
	stopSyncer()
	in.Webhook.Stop()

	queued := in.BareJob(t, "e2e-down-queued")
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, queued, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a bare agent Job was refused while clipjob was down: %v", err)
	}
	if !harness.Suspended(stored) || stored.Annotations[contract.AnnotationQueued] != "true" || stored.Annotations[contract.AnnotationCreatedBy] != me ||
		stored.Annotations[contract.AnnotationTemplateHash] != completed.Annotations[contract.AnnotationTemplateHash] {
		t.Fatalf("the Job admitted while clipjob was down is not completed and queued: suspend %v, annotations %v", stored.Spec.Suspend, stored.Annotations)
	}

	// Nobody but clipjob starts it.
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, queued.Name, types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "a queued run is started by clipjob") {
		t.Errorf("a client started a queued run itself: want 403 from the agent-runs policy, got %v", err)
	}
	// Nobody passes a Job off as another user's.
	other := harness.DressedAsComplete(completed, "e2e-down-other")
	other.Annotations[contract.AnnotationCreatedBy] = "system:serviceaccount:paperclip:paperclip"
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, other, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "clipjob.paperclip.io/created-by") {
		t.Errorf("a Job recording another creator: want 403 naming created-by, got %v", err)
	}
	// A Job dressed as complete and queued, with a container of its own
	// choosing: stored, suspended, until clipjob judges it.
	forged := harness.DressedAsComplete(completed, "e2e-down-forged")
	forged.Annotations[contract.AnnotationCreatedBy] = me
	forged.Spec.Template.Spec.Containers[0].Image = "evil.example.com/miner:1"
	forged.Spec.Template.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
	forged.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Job dressed as queued, stored suspended, is not what this test expects of the API server alone: %v", err)
	}
	// A Job the policy leaves to the webhook (its own container) fails
	// closed.
	own := in.BareJob(t, "e2e-down-own")
	own.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	own.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Command: []string{"claude"}}}
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, own, metav1.CreateOptions{}); err == nil {
		t.Error("a Job with its own container was admitted with clipjob down: only the compiled policy's bare Jobs may be")
	}
	if j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, queued.Name, metav1.GetOptions{}); err != nil || !harness.Suspended(j) {
		t.Fatalf("the queued run did not wait for clipjob: %v", err)
	}

	// clipjob is back: the waiting run starts; the forged one is refused
	// by the start check, marked with why, and never gets a pod.
	if err := in.Webhook.Start(ctx); err != nil {
		t.Fatal(err)
	}
	in.WaitStarted(ctx, t, queued.Name)
	in.WaitPod(ctx, t, queued.Name, harness.Running)
	var marked string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, forged.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		marked = j.Annotations[contract.AnnotationQueueError]
		return marked != "", nil
	})
	if err != nil || !strings.Contains(marked, "this run cannot start") || !strings.Contains(marked, "evil.example.com/miner:1") {
		t.Fatalf("the forged queued run was not refused at its start naming its image: %v, marked %q", err, marked)
	}
	if j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, forged.Name, metav1.GetOptions{}); err != nil || !harness.Suspended(j) {
		t.Errorf("the forged run was started: %v", err)
	}
	if pods, err := suite.cs.CoreV1().Pods(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + forged.Name}); err != nil || len(pods.Items) != 0 {
		t.Errorf("the forged run has pods: %v", err)
	}
	in.FinishRun(ctx, t, queued.Name, "0")
}

// activeRuns lists the agent's Jobs that are started and not finished.
func activeRuns(in *harness.Install, ctx context.Context, t *testing.T, agent string) []string {
	t.Helper()
	list, err := suite.cs.BatchV1().Jobs(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range list.Items {
		if !harness.Suspended(&j) && !claim.Finished(&j) {
			out = append(out, j.Name)
		}
	}
	return out
}

// TestQueuedRunsStartOneAtATime: design (b) keeps one active run per
// agent with the claim off the create. Twenty runs of one agent created
// at once over three webhook replicas are all admitted, queued; while the claim controller starts one, twenty concurrent
// starts under clipjob's own account (a second controller leader, as a
// split brain would make one) start none beside it: each start takes the
// claim in the validating webhook. When the run ends, exactly one more
// starts.
func TestQueuedRunsStartOneAtATime(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const agent = "agent-queued-race"
	in.CompiledQueueMode(ctx, t)
	in.StartReplicas(ctx, t, 3, harness.CompiledPoliciesQueueValues)
	t.Cleanup(func() {
		_ = suite.cs.BatchV1().Jobs(in.Namespace).DeleteCollection(context.Background(), metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)},
			metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent})
	})
	// (That these creates need no webhook is TestQueuedRunsWaitWhileClipjobIsDown's
	// to show: here the claim controller starts the first run meanwhile,
	// through the validating webhook.)
	admitted, conflicts, other := createConcurrently(ctx, t, in, 20, "e2e-queued-race", func(name string) *batchv1.Job {
		j := in.BareJob(t, name)
		j.Labels[contract.LabelAgentID] = agent
		return j
	})
	if len(admitted) != 20 || conflicts != 0 || len(other) > 0 {
		t.Fatalf("20 concurrent creates in Queue mode: admitted %d, %d conflicts, other errors %v", len(admitted), conflicts, other)
	}

	// A second leader: clipjob's own account starting every run at once.
	kubeconfig, err := harness.ChartServiceAccountKubeconfig(ctx, suite.cluster, "clipjob-webhook")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 1000, 1000
	rogue := kubernetes.NewForConfigOrDie(rc)
	var wg sync.WaitGroup
	var mu sync.Mutex
	started, busy := 0, 0
	var unexpected []error
	for _, name := range admitted {
		wg.Go(func() {
			_, err := rogue.BatchV1().Jobs(in.Namespace).Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				started++
			case apierrors.IsConflict(err):
				busy++
			default:
				unexpected = append(unexpected, err)
			}
		})
	}
	// Meanwhile, and after: never two runs of the agent going.
	seen := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		active := activeRuns(in, ctx, t, agent)
		if len(active) > 1 {
			t.Fatalf("two runs of one agent going: %v", active)
		}
		for _, a := range active {
			seen[a] = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	if started > 1 || len(unexpected) > 0 {
		t.Fatalf("concurrent starts: %d started, %d busy (409), unexpected %v", started, busy, unexpected)
	}
	t.Logf("concurrent starts beside the claim controller: %d started, %d refused with 409", started, busy)
	first := activeRuns(in, ctx, t, agent)
	if len(first) != 1 {
		t.Fatalf("after the race the agent has %v going, want one", first)
	}
	in.FinishRun(ctx, t, first[0], "0")
	var second []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		second = activeRuns(in, ctx, t, agent)
		if len(second) > 1 {
			return false, fmt.Errorf("two runs of one agent going: %v", second)
		}
		return len(second) == 1, nil
	})
	if err != nil || second[0] == first[0] {
		t.Fatalf("the next run did not start alone after the first ended: %v (%v)", second, err)
	}
	for range 20 { // a little while longer: still one
		if active := activeRuns(in, ctx, t, agent); len(active) > 1 {
			t.Fatalf("two runs of one agent going: %v", active)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
