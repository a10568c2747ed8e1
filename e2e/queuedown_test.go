package e2e

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
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// dressedAsComplete is a Job a client writes itself to look like one
// clipjob completed and queued: a stored Job's spec and metadata without
// what the API server makes anew for each create.
func dressedAsComplete(j *batchv1.Job, name string) *batchv1.Job {
	j = j.DeepCopy()
	j.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: j.Namespace, Labels: j.Labels, Annotations: j.Annotations}
	j.Labels[contract.LabelAgentID] = "agent-" + name
	j.Labels[contract.LabelRunID] = name
	j.Spec.Selector = nil
	for _, k := range []string{batchv1.ControllerUidLabel, batchv1.JobNameLabel, "controller-uid", "job-name"} {
		delete(j.Spec.Template.Labels, k)
	}
	j.Spec.Template.Labels[contract.LabelAgentID] = j.Labels[contract.LabelAgentID]
	j.Spec.Template.Labels[contract.LabelRunID] = name
	j.Status = batchv1.JobStatus{}
	return j
}

// TestQueuedRunsWaitWhileClipjobIsDown: with compiled policies in Queue
// mode and every clipjob process stopped, a bare agent Job is still
// admitted — completed by its compiled policy, stored suspended — and
// waits; nobody else can start it, nor pass a Job off as another user's.
// A Job dressed as complete and queued is stored too (it cannot run
// while suspended), and is refused when clipjob's start check judges it.
// Back up, clipjob starts the waiting run. A Job the policy leaves to the
// webhook fails closed meanwhile.
func TestQueuedRunsWaitWhileClipjobIsDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stopSyncer, completed := compiledQueueMode(ctx, t)
	review, err := env.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	me := review.Status.UserInfo.Username

	// Every clipjob process stops (the syncer stands in for the elected
	// webhook replica's).
	stopSyncer()
	env.webhook.Stop()

	queued := bareJob(t, "e2e-down-queued")
	stored, err := env.cs.BatchV1().Jobs(ns).Create(ctx, queued, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a bare agent Job was refused while clipjob was down: %v", err)
	}
	if !suspended(stored) || stored.Annotations[contract.AnnotationQueued] != "true" || stored.Annotations[contract.AnnotationCreatedBy] != me ||
		stored.Annotations[contract.AnnotationTemplateHash] != completed.Annotations[contract.AnnotationTemplateHash] {
		t.Fatalf("the Job admitted while clipjob was down is not completed and queued: suspend %v, annotations %v", stored.Spec.Suspend, stored.Annotations)
	}

	// Nobody but clipjob starts it.
	_, err = env.cs.BatchV1().Jobs(ns).Patch(ctx, queued.Name, types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "a queued run is started by clipjob") {
		t.Errorf("a client started a queued run itself: want 403 from the agent-runs policy, got %v", err)
	}
	// Nobody passes a Job off as another user's.
	other := dressedAsComplete(completed, "e2e-down-other")
	other.Annotations[contract.AnnotationCreatedBy] = "system:serviceaccount:paperclip:paperclip"
	_, err = env.cs.BatchV1().Jobs(ns).Create(ctx, other, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "clipjob.paperclip.io/created-by") {
		t.Errorf("a Job recording another creator: want 403 naming created-by, got %v", err)
	}
	// A Job dressed as complete and queued, with a container of its own
	// choosing: stored, suspended, until clipjob judges it.
	forged := dressedAsComplete(completed, "e2e-down-forged")
	forged.Annotations[contract.AnnotationCreatedBy] = me
	forged.Spec.Template.Spec.Containers[0].Image = "evil.example.com/miner:1"
	forged.Spec.Template.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
	forged.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	if _, err := env.cs.BatchV1().Jobs(ns).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Job dressed as queued, stored suspended, is not what this test expects of the API server alone: %v", err)
	}
	// A Job the policy leaves to the webhook (its own container) fails
	// closed.
	own := bareJob(t, "e2e-down-own")
	own.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	own.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Command: []string{"claude"}}}
	if _, err := env.cs.BatchV1().Jobs(ns).Create(ctx, own, metav1.CreateOptions{}); err == nil {
		t.Error("a Job with its own container was admitted with clipjob down: only the compiled policy's bare Jobs may be")
	}
	if j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, queued.Name, metav1.GetOptions{}); err != nil || !suspended(j) {
		t.Fatalf("the queued run did not wait for clipjob: %v", err)
	}

	// clipjob is back: the waiting run starts; the forged one is refused
	// by the start check, marked with why, and never gets a pod.
	if err := env.webhook.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitStarted(ctx, t, queued.Name)
	waitPod(ctx, t, queued.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	var marked string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, forged.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		marked = j.Annotations[contract.AnnotationQueueError]
		return marked != "", nil
	})
	if err != nil || !strings.Contains(marked, "this run cannot start") || !strings.Contains(marked, "evil.example.com/miner:1") {
		t.Fatalf("the forged queued run was not refused at its start naming its image: %v, marked %q", err, marked)
	}
	if j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, forged.Name, metav1.GetOptions{}); err != nil || !suspended(j) {
		t.Errorf("the forged run was started: %v", err)
	}
	if pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + forged.Name}); err != nil || len(pods.Items) != 0 {
		t.Errorf("the forged run has pods: %v", err)
	}
	finishRun(ctx, t, queued.Name, "0")
}

// compiledQueueMode switches the suite to Queue mode with compiled
// policies until t ends (compiledMode).
func compiledQueueMode(ctx context.Context, t *testing.T) (stopSyncer func(), completed *batchv1.Job) {
	t.Helper()
	return compiledMode(ctx, t, "policy:\n  concurrency:\n    mode: Queue\n")
}

// compiledMode switches the suite to compiled policies until t ends: the
// config's policy section given appended (none: the suite's, Reject
// mode), the syncer running, the agent-runs policy applied, the webhooks
// registered as the chart does with compiledPolicies.enabled in that
// mode. It waits until the API server completes a bare Job without the
// mutating webhook (queued in Queue mode) and refuses a Job recording
// another creator, and returns the syncer's stop and the completed Job.
func compiledMode(ctx context.Context, t *testing.T, policy string) (stopSyncer func(), completed *batchv1.Job) {
	t.Helper()
	if policy != "" {
		original := restoreConfigAfter(t)
		writeConfig(ctx, t, string(original)+policy, true)
	}
	queue := env.configNow().Policy.Concurrency.Mode == config.ModeQueue
	stop := startSyncer(t)
	stopped := false
	t.Cleanup(func() {
		cctx := context.Background()
		if !stopped {
			stop()
		}
		if !env.webhook.Running() {
			if err := env.webhook.Start(cctx); err != nil {
				t.Error(err)
			}
		}
		for _, err := range []error{harness.DeleteCompiledPolicies(cctx, env.cs), harness.DeleteAgentRunsPolicy(cctx, env.cs),
			harness.Register(cctx, env.cs, env.webhookAddr, env.cluster.CA.CertPEM)} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	if err := harness.ApplyAgentRunsPolicy(ctx, env.cs); err != nil {
		t.Fatal(err)
	}
	register := harness.RegisterForCompiledPolicies
	if queue {
		register = harness.RegisterForCompiledPoliciesInQueueMode
	}
	if err := register(ctx, env.cs, env.webhookAddr, env.cluster.CA.CertPEM); err != nil {
		t.Fatal(err)
	}
	probe := bareJob(t, "e2e-compiled-probe")
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		before, _ := env.webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		got, err := dryRun(ctx, probe)
		after, _ := env.webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		if err != nil || after != before || got.Annotations[contract.AnnotationProfile] == "" || got.Annotations[contract.AnnotationTemplateHash] == "" ||
			queue != (got.Annotations[contract.AnnotationQueued] == "true") {
			return false, nil
		}
		completed = got
		forged := dressedAsComplete(got, "e2e-compiled-forged-probe")
		forged.Annotations[contract.AnnotationCreatedBy] = "system:serviceaccount:paperclip:paperclip"
		_, err = dryRun(ctx, forged)
		return apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the compiled policy and the agent-runs policy were not in force within 2 minutes: %v", err)
	}
	return func() { stop(); stopped = true }, completed
}

// activeRuns lists the agent's Jobs that are started and not finished.
func activeRuns(ctx context.Context, t *testing.T, agent string) []string {
	t.Helper()
	list, err := env.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range list.Items {
		if !suspended(&j) && !claim.Finished(&j) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const agent = "agent-queued-race"
	compiledQueueMode(ctx, t)
	startReplicasRegistered(ctx, t, 3, harness.RegisterForCompiledPoliciesInQueueMode)
	t.Cleanup(func() {
		_ = env.cs.BatchV1().Jobs(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)},
			metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent})
	})
	// (That these creates need no webhook is TestQueuedRunsWaitWhileClipjobIsDown's
	// to show: here the claim controller starts the first run meanwhile,
	// through the validating webhook.)
	admitted, conflicts, other := createConcurrently(ctx, t, 20, "e2e-queued-race", func(name string) *batchv1.Job {
		j := bareJob(t, name)
		j.Labels[contract.LabelAgentID] = agent
		return j
	})
	if len(admitted) != 20 || conflicts != 0 || len(other) > 0 {
		t.Fatalf("20 concurrent creates in Queue mode: admitted %d, %d conflicts, other errors %v", len(admitted), conflicts, other)
	}

	// A second leader: clipjob's own account starting every run at once.
	kubeconfig, err := harness.ChartServiceAccountKubeconfig(ctx, env.cluster, "clipjob-webhook")
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
			_, err := rogue.BatchV1().Jobs(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{})
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
		active := activeRuns(ctx, t, agent)
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
	first := activeRuns(ctx, t, agent)
	if len(first) != 1 {
		t.Fatalf("after the race the agent has %v going, want one", first)
	}
	finishRun(ctx, t, first[0], "0")
	var second []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		second = activeRuns(ctx, t, agent)
		if len(second) > 1 {
			return false, fmt.Errorf("two runs of one agent going: %v", second)
		}
		return len(second) == 1, nil
	})
	if err != nil || second[0] == first[0] {
		t.Fatalf("the next run did not start alone after the first ended: %v (%v)", second, err)
	}
	for range 20 { // a little while longer: still one
		if active := activeRuns(ctx, t, agent); len(active) > 1 {
			t.Fatalf("two runs of one agent going: %v", active)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
