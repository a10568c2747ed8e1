package e2e

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
)

type configz struct {
	Hash    string `json:"hash"`
	Refused string `json:"refused"`
}

func readConfigz(t *testing.T) configz {
	t.Helper()
	body, err := env.webhook.Get("/configz")
	if err != nil {
		t.Fatal(err)
	}
	var z configz
	if err := json.Unmarshal([]byte(body), &z); err != nil {
		t.Fatalf("/configz: %v: %s", err, body)
	}
	return z
}

// writeConfig replaces the webhook's config file and waits until the
// webhook has looked at it (applied or refused).
func writeConfig(ctx context.Context, t *testing.T, content string, applied bool) configz {
	t.Helper()
	before := readConfigz(t)
	if err := os.WriteFile(env.webhook.ConfigFile, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	var z configz
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		z = readConfigz(t)
		if applied {
			return z.Hash != before.Hash && z.Refused == "", nil
		}
		return z.Refused != "" && z.Refused != before.Refused, nil
	})
	if err != nil {
		t.Fatalf("webhook did not pick up the config (applied=%v): %+v", applied, z)
	}
	return z
}

// restoreConfigAfter returns the webhook's config file content and puts
// it back, waiting until it is served, when t ends.
func restoreConfigAfter(t *testing.T) []byte {
	t.Helper()
	original, err := os.ReadFile(env.webhook.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if now, err := os.ReadFile(env.webhook.ConfigFile); err == nil && string(now) == string(original) {
			return
		}
		writeConfig(context.Background(), t, string(original), true)
	})
	return original
}

// TestConfigReload: a refused config keeps the previous one serving; an
// applied one takes effect on the next Job, including a source that is
// missing, which is a clear denial rather than a half-built Job.
func TestConfigReload(t *testing.T) {
	ctx := ctxT(t)
	original := restoreConfigAfter(t)

	z := writeConfig(ctx, t, string(original)+"profiles:\n  claude_local:\n    imagee: typo\n", false)
	if !strings.Contains(z.Refused, `unknown field "profiles.claude_local.imagee"`) {
		t.Errorf("refusal does not name the field: %q", z.Refused)
	}
	stored, err := env.cs.BatchV1().Jobs(ns).Create(ctx, bareJob(t, "e2e-after-refused"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("previous config stopped serving: %v", err)
	}
	if stored.Annotations[contract.AnnotationProfile] != "claude_local" {
		t.Error("Job not completed under the previous config")
	}
	metrics, _ := env.webhook.Get("/metrics")
	if !strings.Contains(metrics, `clipjob_config_reloads_total{result="refused"}`) ||
		!strings.Contains(metrics, "clipjob_config_last_reload_successful 0") {
		t.Error("refusal not visible in metrics")
	}

	writeConfig(ctx, t, string(original)+"defaultProfile: codex_local\n", true)
	job := bareJob(t, "e2e-reloaded")
	delete(job.Labels, contract.LabelAdapterType)
	stored, err = env.cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := stored.Annotations[contract.AnnotationProfile]; got != "codex_local" {
		t.Errorf("reloaded default profile not applied: %q", got)
	}

	writeConfig(ctx, t, strings.Replace(string(original), "deployment: paperclip", "deployment: paperclip-missing", 1), true)
	_, err = env.cs.BatchV1().Jobs(ns).Create(ctx, bareJob(t, "e2e-no-source"), metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "source Deployment paperclip/paperclip-missing: not found") {
		t.Errorf("want a 503 naming the missing source, got %v", err)
	}
	if _, gerr := env.cs.BatchV1().Jobs(ns).Get(ctx, "e2e-no-source", metav1.GetOptions{}); !apierrors.IsNotFound(gerr) {
		t.Error("a Job was stored although its source is missing")
	}
}
