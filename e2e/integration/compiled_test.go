package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

// TestCompiledPoliciesMatchTheWebhook: the MutatingAdmissionPolicies
// compiled from the webhook's own source and config store, on this API
// server, exactly the Job the mutating webhook stores, for every golden
// fixture's Job and for bare Jobs with each run value; what they leave to
// the webhook is what their domain says. Dry runs: nothing is stored.
func TestCompiledPoliciesMatchTheWebhook(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dep, err := suite.cs.AppsV1().Deployments(in.Namespace).Get(ctx, "paperclip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := in.LoadConfig(t)
	inh, err := templates.InheritFromDeployment(dep, cfg.Source)
	if err != nil {
		t.Fatal(err)
	}
	policies, err := compile.Mutating(compile.Input{Namespace: in.Namespace, Inherited: inh, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	jobs := compiledPolicyJobs(in, t)

	// The webhook's answers, with the mutating webhook alone registered
	// (the validating one would refuse Jobs whose run Secrets are missing).
	t.Cleanup(func() {
		cctx := context.Background()
		if err := in.DeleteCompiledPolicies(cctx); err != nil {
			t.Error(err)
		}
		if err := in.Register(cctx, harness.RegisterOptions{Addr: in.Webhook.Addr}); err != nil {
			t.Error(err)
		}
	})
	ar := suite.cs.AdmissionregistrationV1()
	if err := ar.ValidatingWebhookConfigurations().Delete(ctx, in.ValidatingWebhookName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	byWebhook := map[string]*batchv1.Job{} // nil: refused
	for _, j := range jobs {
		got, err := in.DryRun(ctx, j)
		if err != nil && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			t.Fatalf("%s: %v", j.Name, err)
		}
		byWebhook[j.Name] = got
		if err != nil && j.Labels["e2e-compiled"] == "bare" {
			t.Fatalf("the webhook refuses the bare Job %s: %v", j.Name, err)
		}
	}

	// The policies' answers, with no webhook.
	if err := ar.MutatingWebhookConfigurations().Delete(ctx, in.MutatingWebhookName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range policies {
		if _, err := ar.MutatingAdmissionPolicies().Create(ctx, p.Policy, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the API server refuses policy %s: %v", p.Policy.Name, err)
		}
		if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, p.Binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The API server loads policies from a watch: wait until every profile's
	// policy completes a bare Job.
	for _, profile := range policies[0].Profiles {
		p := struct{ Profile, Name string }{profile, policies[0].Policy.Name}
		probe := in.BareJob(t, "e2e-compiled-probe")
		probe.Labels[contract.LabelAdapterType] = p.Profile
		var last string
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := in.DryRun(ctx, probe)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			last = fmt.Sprintf("stored with annotations %v", got.Annotations)
			return got.Annotations[contract.AnnotationProfile] == p.Profile, nil
		})
		if err != nil {
			t.Fatalf("policy %s never completed a bare Job of profile %s: %v (last: %s)", p.Name, p.Profile, err, last)
		}
	}
	completed := 0
	for _, j := range jobs {
		got, err := in.DryRun(ctx, j)
		if err != nil && !apierrors.IsInvalid(err) {
			t.Errorf("%s: %v", j.Name, err)
			continue
		}
		if err != nil || got.Annotations[contract.AnnotationProfile] == "" {
			// Left to the webhook: with it away, a Job without containers
			// is invalid, one with its own is stored as it came.
			if j.Labels["e2e-compiled"] == "bare" {
				t.Errorf("%s is a bare Job with run values Render accepts, but no policy completed it: %v", j.Name, err)
			}
			continue
		}
		completed++
		if byWebhook[j.Name] == nil {
			t.Errorf("%s: a policy completed a Job the webhook refuses", j.Name)
			continue
		}
		if diff := cmp.Diff(comparable(t, byWebhook[j.Name]), comparable(t, got)); diff != "" {
			t.Errorf("%s: the compiled policy stores another Job than the webhook (-webhook +policy):\n%s", j.Name, diff)
		}
	}
	if completed < 150 {
		t.Errorf("the policies completed %d of %d Jobs; the bare ones alone are more", completed, len(jobs))
	}
}

// compiledPolicyJobs: every golden fixture's Job (in the suite's
// namespace), and bare Jobs carrying each run value, labeled "bare".
func compiledPolicyJobs(in *harness.Install, t *testing.T) []*batchv1.Job {
	var jobs []*batchv1.Job
	for _, fx := range golden.Cases(t) {
		j := fx.Job.DeepCopy()
		j.Name, j.Namespace = "e2e-fx-"+strings.ReplaceAll(fx.Name, "_", "-"), in.Namespace
		jobs = append(jobs, j)
	}
	values := []func(j *batchv1.Job){
		func(j *batchv1.Job) { j.Labels[contract.LabelTaskID] = "task-1" },
		func(j *batchv1.Job) { j.Labels[contract.LabelSessionID] = "sess-1" },
		func(j *batchv1.Job) { j.Annotations[contract.AnnotationModel] = "anthropic/claude-sonnet-4-5" },
		func(j *batchv1.Job) { j.Annotations[contract.AnnotationMaxTurns] = "25" },
		func(j *batchv1.Job) { j.Annotations[contract.AnnotationEnvSecret] = j.Name + "-env" },
		func(j *batchv1.Job) {
			j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/instances/default/workspaces/" + j.Labels[contract.LabelAgentID] + "/worktrees/" + j.Name + "/"
		},
		func(j *batchv1.Job) {
			delete(j.Spec.Template.Annotations, contract.AnnotationPrompt)
			j.Spec.Template.Annotations[contract.AnnotationPromptSecret] = j.Name + "-prompt/text"
		},
		func(j *batchv1.Job) { delete(j.Spec.Template.Annotations, contract.AnnotationPrompt) },
		func(j *batchv1.Job) { j.Annotations[contract.AnnotationProfile] = "forged" },
		func(j *batchv1.Job) {
			j.Spec.Template.Labels = map[string]string{contract.LabelCompanyID: "other", "app": "x"}
		},
	}
	for _, profile := range []string{"claude_local", "opencode_local", "codex_local", "claude", "gemini_local"} {
		for mask := range 1 << len(values) {
			if mask%29 != len(profile)%29 && mask != 0 && mask != 1<<len(values)-1 {
				continue // all, none and a spread of the rest, under each profile
			}
			j := in.BareJob(t, fmt.Sprintf("e2e-compiled-%s-%d", strings.ReplaceAll(profile, "_", "-"), mask))
			j.Labels["e2e-compiled"] = "bare"
			if j.Annotations == nil {
				j.Annotations = map[string]string{}
			}
			if profile == "" {
				delete(j.Labels, contract.LabelAdapterType)
			} else {
				j.Labels[contract.LabelAdapterType] = profile
			}
			for b, set := range values {
				if mask&(1<<b) != 0 {
					set(j)
				}
			}
			jobs = append(jobs, j)
		}
	}
	return jobs
}

// comparable is a stored Job without what the API server makes anew for
// each create: its UID, the labels and selector carrying it, timestamps
// and field managers.
func comparable(t *testing.T, j *batchv1.Job) string {
	j = j.DeepCopy()
	j.UID, j.CreationTimestamp, j.ManagedFields, j.ResourceVersion, j.Generation = "", metav1.Time{}, nil, "", 0
	j.Spec.Selector = nil
	for _, k := range []string{batchv1.ControllerUidLabel, batchv1.JobNameLabel, "controller-uid", "job-name"} {
		delete(j.Spec.Template.Labels, k)
	}
	out, err := yaml.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
