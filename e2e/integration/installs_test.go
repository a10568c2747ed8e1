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
	mine, theirs := stuck(strict), stuck(patient)
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return harness.JobFailed(strict.Job(ctx, t, mine.Name)), nil
	})
	if err != nil {
		t.Fatalf("the strict install did not end its own stuck run: %v", err)
	}
	// The other run was there all along (created before the first ended).
	other := patient.Job(ctx, t, theirs.Name)
	if harness.JobFailed(other) || other.Annotations[contract.AnnotationStartTimeout] != "" {
		t.Errorf("the strict install ended another install's run: conditions %+v, annotations %v", other.Status.Conditions, other.Annotations)
	}
	if other.CreationTimestamp.After(time.Now().Add(-3 * time.Second)) {
		t.Fatalf("the other run is younger than the timeout (%s): the test proves nothing", other.CreationTimestamp)
	}
}
