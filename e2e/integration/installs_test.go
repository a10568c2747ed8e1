package integration

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestAnInstallActsOnlyOnItsOwnNamespaces: two installations of clipjob in
// one cluster, each with --namespace for its own (as the suite runs every
// test), and one of them ending runs that cannot start after 3 seconds.
// Its claim controller ends its own stuck run and never touches the other
// installation's, which waits under a config with no such timeout.
func TestAnInstallActsOnlyOnItsOwnNamespaces(t *testing.T) {
	strict := newInstall(t, harness.InstallOptions{Config: "profiles:\n  claude_local:\n    startTimeoutSeconds: 3\n"})
	patient := addInstall(t)
	ctx := ctxT(t)
	stuck := func(in *harness.Install) *batchv1.Job {
		job := in.BareJob(t, "e2e-never-starts")
		job.Spec.Template.Spec.NodeSelector = map[string]string{"clipjob.e2e/pool": "nowhere"}
		return in.CreateJob(ctx, t, job)
	}
	// The other installation's run first: it has waited longer than the
	// strict one's own whenever that one ends, so a strict controller
	// acting on every namespace would have ended it by then.
	theirs := stuck(patient)
	theirsSince := time.Now()
	mine := stuck(strict)
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return harness.JobFailed(strict.Job(ctx, t, mine.Name)), nil
	})
	if err != nil {
		t.Fatalf("the strict install did not end its own stuck run: %v", err)
	}
	if time.Since(theirsSince) < 3*time.Second {
		t.Fatalf("the strict install's run ended %s after the other's was created, before its timeout: the test proves nothing", time.Since(theirsSince))
	}
	// And a moment more, for a controller that took the other second.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		other := patient.Job(ctx, t, theirs.Name)
		if harness.JobFailed(other) || other.Annotations[contract.AnnotationStartTimeout] != "" {
			t.Fatalf("the strict install ended another install's run: conditions %+v, annotations %v", other.Status.Conditions, other.Annotations)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
