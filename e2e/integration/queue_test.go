package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestQueueMode: with policy.concurrency.mode Queue, three runs of one
// agent are all admitted, start one at a time in creation order as each
// previous run ends, and nobody can start one out of turn.
func TestQueueMode(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	original := in.Config(t)
	in.WriteConfig(ctx, t, string(original)+"policy:\n  concurrency:\n    mode: Queue\n    maxQueued: 2\n", true)

	var names []string
	for i := 0; i < 3; i++ {
		job := in.BareJob(t, fmt.Sprintf("e2e-queue-%d", i))
		job.Labels[contract.LabelAgentID] = "agent-queue"
		stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("run %d refused in Queue mode: %v", i, err)
		}
		if stored.Annotations[contract.AnnotationQueued] != "true" || !harness.Suspended(stored) {
			t.Fatalf("run %d not admitted as queued: suspend %v", i, stored.Spec.Suspend)
		}
		names = append(names, job.Name)
		time.Sleep(1100 * time.Millisecond) // creation order is by the second
	}
	in.WaitStarted(ctx, t, names[0])
	in.AssertWaiting(ctx, t, names[1], names[2])

	// Each waiting run says where it stands and behind whom.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for i, n := range names[1:] {
			j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil || j.Annotations[contract.AnnotationQueuePosition] != fmt.Sprint(i+1) || j.Annotations[contract.AnnotationQueueHolder] != in.Namespace+"/"+names[0] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Error("the waiting runs were not marked with their position and holder")
	}
	// Two wait already: a third is refused, with a cause a program reads.
	extra := in.BareJob(t, "e2e-queue-extra")
	extra.Labels[contract.LabelAgentID] = "agent-queue"
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, extra, metav1.CreateOptions{})
	if waiting, _ := cause(err, contract.CauseQueueFull); !apierrors.IsConflict(err) || waiting != "2" {
		t.Errorf("a run beyond maxQueued: want 409 with cause queue-full, got %v", err)
	}

	// Starting a waiting run by hand takes the claim, which is held: 409.
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, names[2], types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("unsuspending a queued run out of turn: want 409, got %v", err)
	}

	in.FinishRun(ctx, t, names[0], "0")
	in.WaitStarted(ctx, t, names[1])
	in.AssertWaiting(ctx, t, names[2])

	in.FinishRun(ctx, t, names[1], "1")
	in.WaitStarted(ctx, t, names[2])
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
	in := newInstall(t, harness.InstallOptions{Config: "policy:\n  concurrency:\n    mode: Queue\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader, err := in.StartReplica(ctx, in.Namespace+"-webhook-failover")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leader.Stop)
	// The suite's replica gives up leadership on SIGTERM and rejoins as a
	// follower, so the one killed below is the leader and the suite's
	// replica, which the API server calls, is the one that takes over.
	if leads(t, in.Webhook) {
		in.Webhook.Stop()
		waitLeader(ctx, t, leader, 2*time.Minute)
		if err := in.Webhook.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitLeader(ctx, t, leader, 2*time.Minute)

	var names []string
	for i := range 2 {
		job := in.BareJob(t, fmt.Sprintf("e2e-failover-%d", i))
		job.Labels[contract.LabelAgentID] = "agent-failover"
		if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, job.Name)
		time.Sleep(1100 * time.Millisecond) // creation order is by the second
	}
	in.WaitStarted(ctx, t, names[0])
	in.AssertWaiting(ctx, t, names[1])

	leader.Kill()
	in.FinishRun(ctx, t, names[0], "0")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, names[1], metav1.GetOptions{})
		return err == nil && !harness.Suspended(j), nil
	})
	if err != nil {
		t.Fatalf("the queued run was not started after the leader died (the suite's replica leads: %v); see %s", leads(t, in.Webhook), in.Webhook.Log)
	}
	if !leads(t, in.Webhook) {
		t.Error("the queued run started, but the surviving replica does not lead")
	}
}
