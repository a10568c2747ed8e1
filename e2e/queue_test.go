package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

func suspended(j *batchv1.Job) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }

// waitStarted waits until the claim controller has unsuspended the Job.
func waitStarted(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && !suspended(j), nil
	})
	if err != nil {
		t.Fatalf("queued run %s was not started", name)
	}
}

func assertWaiting(ctx context.Context, t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, n, metav1.GetOptions{})
		if err != nil || !suspended(j) {
			t.Errorf("run %s should still wait (suspended); err %v", n, err)
		}
	}
}

// TestQueueMode: with policy.concurrency.mode Queue, three runs of one
// agent are all admitted, start one at a time in creation order as each
// previous run ends, and nobody can start one out of turn.
func TestQueueMode(t *testing.T) {
	ctx := ctxT(t)
	original := restoreConfigAfter(t)
	writeConfig(ctx, t, string(original)+"policy:\n  concurrency:\n    mode: Queue\n    maxQueued: 2\n", true)

	var names []string
	for i := 0; i < 3; i++ {
		job := bareJob(t, fmt.Sprintf("e2e-queue-%d", i))
		job.Labels[contract.LabelAgentID] = "agent-queue"
		stored, err := env.cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("run %d refused in Queue mode: %v", i, err)
		}
		if stored.Annotations[contract.AnnotationQueued] != "true" || !suspended(stored) {
			t.Fatalf("run %d not admitted as queued: suspend %v", i, stored.Spec.Suspend)
		}
		names = append(names, job.Name)
		time.Sleep(1100 * time.Millisecond) // creation order is by the second
	}
	waitStarted(ctx, t, names[0])
	assertWaiting(ctx, t, names[1], names[2])

	// Each waiting run says where it stands and behind whom.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for i, n := range names[1:] {
			j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil || j.Annotations[contract.AnnotationQueuePosition] != fmt.Sprint(i+1) || j.Annotations[contract.AnnotationQueueHolder] != ns+"/"+names[0] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Error("the waiting runs were not marked with their position and holder")
	}
	// Two wait already: a third is refused, with a cause a program reads.
	extra := bareJob(t, "e2e-queue-extra")
	extra.Labels[contract.LabelAgentID] = "agent-queue"
	_, err = env.cs.BatchV1().Jobs(ns).Create(ctx, extra, metav1.CreateOptions{})
	if waiting, _ := cause(err, contract.CauseQueueFull); !apierrors.IsConflict(err) || waiting != "2" {
		t.Errorf("a run beyond maxQueued: want 409 with cause queue-full, got %v", err)
	}

	// Starting a waiting run by hand takes the claim, which is held: 409.
	_, err = env.cs.BatchV1().Jobs(ns).Patch(ctx, names[2], types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("unsuspending a queued run out of turn: want 409, got %v", err)
	}

	finishRun(ctx, t, names[0], "0")
	waitStarted(ctx, t, names[1])
	assertWaiting(ctx, t, names[2])

	finishRun(ctx, t, names[1], "1")
	waitStarted(ctx, t, names[2])
}

// leads reports whether the replica holds the claim controller's election.
func leads(t *testing.T, w *harness.Webhook) bool {
	t.Helper()
	v, err := w.Counter("leader_election_master_status", "clipjob-claim-controller")
	return err == nil && v > 0
}

func waitLeader(ctx context.Context, t *testing.T, w *harness.Webhook, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return leads(t, w), nil
	})
	if err != nil {
		t.Fatalf("replica %s did not become the claim controller's leader within %s; see %s", w.Addr, timeout, w.Log)
	}
}

// TestClaimControllerFailsOver: the claim controller runs on one elected
// replica. When that replica dies without a word (SIGKILL: its election
// Lease is left to expire), another takes over and starts the agent's
// queued run once the running one ends.
func TestClaimControllerFailsOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	original := restoreConfigAfter(t)
	queueConfig := string(original) + "policy:\n  concurrency:\n    mode: Queue\n"
	writeConfig(ctx, t, queueConfig, true)
	configFile := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(configFile, []byte(queueConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	leader, err := harness.StartWebhook(ctx, env.cluster, env.webhookBin, "webhook-failover", configFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leader.Stop)
	// The suite's replica gives up leadership on SIGTERM and rejoins as a
	// follower, so the one killed below is the leader and the suite's
	// replica, which the API server calls, is the one that takes over.
	if leads(t, env.webhook) {
		env.webhook.Stop()
		waitLeader(ctx, t, leader, 2*time.Minute)
		if err := env.webhook.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitLeader(ctx, t, leader, 2*time.Minute)

	var names []string
	for i := range 2 {
		job := bareJob(t, fmt.Sprintf("e2e-failover-%d", i))
		job.Labels[contract.LabelAgentID] = "agent-failover"
		if _, err := env.cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, job.Name)
		time.Sleep(1100 * time.Millisecond) // creation order is by the second
	}
	waitStarted(ctx, t, names[0])
	assertWaiting(ctx, t, names[1])

	leader.Kill()
	finishRun(ctx, t, names[0], "0")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, names[1], metav1.GetOptions{})
		return err == nil && !suspended(j), nil
	})
	if err != nil {
		t.Fatalf("the queued run was not started after the leader died (the suite's replica leads: %v); see %s", leads(t, env.webhook), env.webhook.Log)
	}
	if !leads(t, env.webhook) {
		t.Error("the queued run started, but the surviving replica does not lead")
	}
}
