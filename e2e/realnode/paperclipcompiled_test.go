package realnode

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestPaperclipRunsQueueUnderCompiledPolicies: design (b) with the real
// Paperclip server and the adapter. With compiled admission policies and
// the config in Queue mode, a run of a busy agent is completed and queued
// by the API server alone (its CREATE skips the validating webhook); the
// adapter waits on it while it is suspended; clipjob judges it and starts
// it when the agent's run before it ends; Paperclip records each run
// succeeded with its own cost. A queued run that clipjob refuses when it
// starts (the config changed while it waited: digests required) ends the
// adapter's wait: Paperclip records it failed as a refused create
// (k8s_job_create_failed), its Job is deleted, and the run before it is
// unharmed.
func TestPaperclipRunsQueueUnderCompiledPolicies(t *testing.T) {
	requireRealNode(t)
	t.Parallel() // an install, a namespace and a server of its own
	in, pc := ownInstallAndServer(t, "compiled-agents")
	ctx, company := paperclipOnTheRealNode(t, pc, 12*time.Minute, "Compiled Queue Co")
	in.CompiledQueueMode(ctx, t)
	agent := newAgent(ctx, t, pc, company.ID, "Queued", "claude_k8s", map[string]any{"promptTemplate": "lines=2 sleep=8"}, nil)

	first := wake(ctx, t, pc, agent.ID, "e2e: first")
	waitRunJob(ctx, t, in, first.ID, func(j *batchv1.Job) bool { return !harness.Suspended(j) })
	second := wake(ctx, t, pc, agent.ID, "e2e: second, queued behind the first")
	queued := waitRunJob(ctx, t, in, second.ID, func(j *batchv1.Job) bool {
		return harness.Suspended(j) && j.Annotations[contract.AnnotationQueued] == "true"
	})
	if got := queued.Annotations[contract.AnnotationCreatedBy]; got == "" {
		t.Errorf("the queued run's Job records no creator (the compiled policy writes %s)", contract.AnnotationCreatedBy)
	}
	for _, r := range []pcRun{first, second} {
		if done := waitRunEnds(ctx, t, pc, r.ID); done.Status != "succeeded" || costOf(done) != 0.0123 {
			t.Errorf("run %s: %+v\n%s", r.ID, done, runLogText(ctx, pc, r.ID))
		}
	}

	third := wake(ctx, t, pc, agent.ID, "e2e: third")
	waitRunJob(ctx, t, in, third.ID, func(j *batchv1.Job) bool { return !harness.Suspended(j) })
	fourth := wake(ctx, t, pc, agent.ID, "e2e: fourth, refused when it starts")
	refusedJob := waitRunJob(ctx, t, in, fourth.ID, func(j *batchv1.Job) bool { return harness.Suspended(j) })
	// The policy section is the config's last (compiledQueueMode appended
	// it): digests are required from now on, and the fake agent's image
	// is referenced by tag.
	now, err := os.ReadFile(in.Webhook.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	in.WriteConfig(ctx, t, string(now)+"  images:\n    requireDigest: true\n", true)

	refused := waitRunEnds(ctx, t, pc, fourth.ID)
	if refused.Status != "failed" || refused.ErrorCode != "k8s_job_create_failed" || costOf(refused) != 0 {
		t.Errorf("the run refused at its start: %+v, want failed with k8s_job_create_failed and no cost\n%s", refused, runLogText(ctx, pc, fourth.ID))
	}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, refusedJob.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("the refused run's Job %s was not deleted", refusedJob.Name)
	}
	if done := waitRunEnds(ctx, t, pc, third.ID); done.Status != "succeeded" || costOf(done) != 0.0123 {
		t.Errorf("the run before the refused one: %+v\n%s", done, runLogText(ctx, pc, third.ID))
	}
}

// waitRunJob waits for the Job of Paperclip run id (its run-id label) in
// in's namespace to satisfy ok, and returns it.
func waitRunJob(ctx context.Context, t *testing.T, in *harness.Install, id string, ok func(*batchv1.Job) bool) *batchv1.Job {
	t.Helper()
	var found *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := suite.cs.BatchV1().Jobs(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + id})
		if err != nil || len(list.Items) != 1 {
			return false, nil
		}
		found = &list.Items[0]
		return ok(found), nil
	})
	if err != nil {
		t.Fatalf("run %s's Job never reached the state waited for: %+v", id, found)
	}
	return found
}

// ownInstallAndServer is clipjob installed for namespace ns alone on the
// real node (harness.NewInstall: its own webhook, the profiles placing
// agents on the real node, the example Paperclip's
// volume a host directory), taken out of the suite's install, with a
// relay and a Paperclip server of its own pointed at it: a test that
// changes the config runs beside the others.
func ownInstallAndServer(t *testing.T, ns string) (*harness.Install, *harness.Paperclip) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := suite.in.ExcludeNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	in, err := harness.NewInstall(ctx, suite.cluster, suite.in.WebhookBin, harness.InstallOptions{
		Namespace: ns, Config: harness.RealNodeProfiles(), VolumeDir: filepath.Join(suite.cluster.Dir, ns+"-shared")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Stop(context.Background()) })
	r, _, _, err := in.SharedRelay()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := in.PaperclipServerSpec(r, "", "")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := startPaperclip(spec, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(t.Failed()) })
	return in, pc
}
