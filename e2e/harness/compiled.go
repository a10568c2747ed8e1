package harness

// Compiled admission policies: clipjob's MutatingAdmissionPolicies kept by
// the syncer, standing in for the mutating webhook.

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/go-logr/logr"
	"github.com/paperclipai/clipjob/admissionpolicies"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/webhook"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// DryRun creates j in the install's namespace as a server-side dry run.
func (in *Install) DryRun(ctx context.Context, j *batchv1.Job) (*batchv1.Job, error) {
	return in.CS().BatchV1().Jobs(in.Namespace).Create(ctx, j.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

// DressedAsComplete is a Job a client writes itself to look like one
// clipjob completed and queued: a stored Job's spec and metadata without
// what the API server makes anew for each create.
func DressedAsComplete(j *batchv1.Job, name string) *batchv1.Job {
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

// CompiledQueueMode switches the suite to Queue mode with compiled
// policies until t ends (CompiledMode).
func (in *Install) CompiledQueueMode(ctx context.Context, t *testing.T) (stopSyncer func(), completed *batchv1.Job) {
	t.Helper()
	return in.CompiledMode(ctx, t, "policy:\n  concurrency:\n    mode: Queue\n")
}

// CompiledMode switches the suite to compiled policies until t ends: the
// config's policy section given appended (none: the suite's, Reject
// mode), the syncer running, the agent-runs policy applied, the webhooks
// registered as the chart does with compiledPolicies.enabled in that
// mode. It waits until the API server completes a bare Job without the
// mutating webhook (queued in Queue mode) and refuses a Job recording
// another creator, and returns the syncer's stop and the completed Job.
func (in *Install) CompiledMode(ctx context.Context, t *testing.T, policy string) (stopSyncer func(), completed *batchv1.Job) {
	t.Helper()
	if in.LoadConfig(t).Policy.Concurrency.Mode != config.ModeQueue {
		// Registered first, so it runs last: once the config is back and
		// the policies are deleted, the API server's admission caches may
		// still apply a deleted policy for a moment, queueing the next
		// test's Job where nothing will start it.
		t.Cleanup(func() { in.waitNotQueued(t) })
	}
	if policy != "" {
		original := in.RestoreConfigAfter(t)
		in.WriteConfig(ctx, t, string(original)+policy, true)
	}
	queue := in.LoadConfig(t).Policy.Concurrency.Mode == config.ModeQueue
	stop := in.StartSyncer(t)
	stopped := false
	t.Cleanup(func() {
		cctx := context.Background()
		if !stopped {
			stop()
		}
		if !in.Webhook.Running() {
			if err := in.Webhook.Start(cctx); err != nil {
				t.Error(err)
			}
		}
		for _, err := range []error{in.DeleteCompiledPolicies(cctx), in.DeleteAgentRunsPolicy(cctx),
			in.Register(cctx, RegisterOptions{Addr: in.Webhook.Addr})} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	if err := in.ApplyAgentRunsPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	values := CompiledPoliciesValues
	if queue {
		values = CompiledPoliciesQueueValues
	}
	if err := in.Register(ctx, RegisterOptions{Values: values}); err != nil {
		t.Fatal(err)
	}
	probe := in.BareJob(t, "e2e-compiled-probe")
	// The API server compiles and loads each policy in the background: on
	// a machine busy with the other tiers that took over two minutes once.
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		before, _ := in.Webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		got, err := in.DryRun(ctx, probe)
		after, _ := in.Webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		switch {
		case err != nil:
			last = "the bare Job's dry run: " + err.Error()
			return false, nil
		case after != before:
			last = "the mutating webhook still judged the bare Job"
			return false, nil
		case got.Annotations[contract.AnnotationProfile] == "" || got.Annotations[contract.AnnotationTemplateHash] == "":
			last = "the bare Job was not completed by the compiled policy"
			return false, nil
		case queue != (got.Annotations[contract.AnnotationQueued] == "true"):
			last = fmt.Sprintf("the bare Job's queued mark is %q in this mode", got.Annotations[contract.AnnotationQueued])
			return false, nil
		}
		completed = got
		forged := DressedAsComplete(got, "e2e-compiled-forged-probe")
		forged.Annotations[contract.AnnotationCreatedBy] = "system:serviceaccount:paperclip:paperclip"
		_, err = in.DryRun(ctx, forged)
		last = fmt.Sprintf("a Job recording another creator: want 403 from the agent-runs policy, got %v", err)
		return apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the compiled policy and the agent-runs policy were not in force within 4 minutes: %v (last: %s)", err, last)
	}
	return func() { stop(); stopped = true }, completed
}

// fixedConfig serves one config, read once.
type fixedConfig struct{ cfg *config.Config }

func (f fixedConfig) Current() *config.Config { return f.cfg }

// StartSyncer runs the compiled policies' syncer against the cluster, as
// the elected webhook replica does with --compiled-policies; the returned
// function stops it.
func (in *Install) StartSyncer(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &admissionpolicies.Syncer{Client: in.CS().AdmissionregistrationV1(), Configs: fixedConfig{in.LoadConfig(t)},
		Sources: webhook.NewSourceCache(ctx, in.CS()), Interval: 200 * time.Millisecond, Owner: in.Namespace, Log: logr.Discard()}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Start(ctx) }()
	return func() { cancel(); <-done }
}

// waitNotQueued waits until a bare Job is admitted unqueued and not
// suspended again (a dry run through the API server).
func (in *Install) waitNotQueued(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := in.DryRun(ctx, in.BareJob(t, "e2e-settled"))
		if err != nil {
			return false, nil
		}
		last = j
		// The webhook, back in Reject mode, drops the queued mark a stale
		// policy wrote but keeps its suspend: a Job nothing will start.
		_, queued := j.Annotations[contract.AnnotationQueued]
		return !queued && !Suspended(j), nil
	})
	if err != nil {
		t.Errorf("after compiled Queue mode, bare Jobs are still admitted queued or suspended: %+v", last)
	}
}
