package integration

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/contract"
)

// TestConfigReload: a refused config keeps the previous one serving; an
// applied one takes effect on the next Job, including a source that is
// missing, which is a clear denial rather than a half-built Job.
func TestConfigReload(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	original := in.Config(t)

	z := in.WriteConfig(ctx, t, string(original)+"profiles:\n  claude_local:\n    imagee: typo\n", false)
	if !strings.Contains(z.Refused, `unknown field "profiles.claude_local.imagee"`) {
		t.Errorf("refusal does not name the field: %q", z.Refused)
	}
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-after-refused"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("previous config stopped serving: %v", err)
	}
	if stored.Annotations[contract.AnnotationProfile] != "claude_local" {
		t.Error("Job not completed under the previous config")
	}
	metrics, _ := in.Webhook.Get("/metrics")
	if !strings.Contains(metrics, `clipjob_config_reloads_total{result="refused"}`) ||
		!strings.Contains(metrics, "clipjob_config_last_reload_successful 0") {
		t.Error("refusal not visible in metrics")
	}

	in.WriteConfig(ctx, t, string(original)+"defaultProfile: codex_local\n", true)
	job := in.BareJob(t, "e2e-reloaded")
	delete(job.Labels, contract.LabelAdapterType)
	stored, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := stored.Annotations[contract.AnnotationProfile]; got != "codex_local" {
		t.Errorf("reloaded default profile not applied: %q", got)
	}

	in.WriteConfig(ctx, t, strings.Replace(string(original), "deployment: paperclip", "deployment: paperclip-missing", 1), true)
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-no-source"), metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "source Deployment "+in.Namespace+"/paperclip-missing: not found") {
		t.Errorf("want a 503 naming the missing source, got %v", err)
	}
	if _, gerr := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, "e2e-no-source", metav1.GetOptions{}); !apierrors.IsNotFound(gerr) {
		t.Error("a Job was stored although its source is missing")
	}
}
