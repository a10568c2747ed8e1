package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

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
	original := restoreConfigAfter(t)
	writeConfig(ctx, t, string(original)+"policy:\n  concurrency:\n    mode: Queue\n", true)
	stopSyncer := startSyncer(t)
	syncing := true
	t.Cleanup(func() {
		cctx := context.Background()
		if syncing {
			stopSyncer()
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
	if err := harness.RegisterForCompiledPolicies(ctx, env.cs, env.webhookAddr, env.cluster.CA.CertPEM); err != nil {
		t.Fatal(err)
	}
	review, err := env.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	me := review.Status.UserInfo.Username

	// Until the API server has loaded the Queue-mode policy, the new
	// registration and the agent-runs policy, a dry run tells: completed
	// and queued without a call to the mutating webhook, and a Job
	// recording another creator refused.
	var completed *batchv1.Job
	probe := bareJob(t, "e2e-down-probe")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		before, _ := env.webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		got, err := dryRun(ctx, probe)
		after, _ := env.webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		if err != nil || after != before || got.Annotations[contract.AnnotationQueued] != "true" || got.Annotations[contract.AnnotationProfile] == "" {
			return false, nil
		}
		completed = got
		forged := dressedAsComplete(got, "e2e-down-forged-probe")
		forged.Annotations[contract.AnnotationCreatedBy] = "system:serviceaccount:paperclip:paperclip"
		_, err = dryRun(ctx, forged)
		return apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the Queue-mode policy and the agent-runs policy were not in force within 2 minutes: %v", err)
	}

	// Every clipjob process stops (the syncer stands in for the elected
	// webhook replica's).
	stopSyncer()
	syncing = false
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
	if err != nil || !strings.Contains(marked, "this queued run cannot start") || !strings.Contains(marked, "evil.example.com/miner:1") {
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
