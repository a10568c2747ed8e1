package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/store"
)

// TestRunEnvSecret: a run's own env comes from a Secret made for it and
// named on the Job; the agent container gets every key of it, and the Job
// owns the Secret, which is deleted with it. A Secret
// that is not labeled for the run — the server's own, another run's — or
// one that does not exist is refused, naming the annotation.
func TestRunEnvSecret(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-env-secret")
	run := job.Labels[contract.LabelRunID]
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: run + "-env", Namespace: in.Namespace,
		Labels: map[string]string{contract.LabelRunID: run, contract.LabelAgentID: job.Labels[contract.LabelAgentID]}},
		StringData: map[string]string{"PAPERCLIP_API_KEY": "run-scoped-token", "PAPERCLIP_WAKE_REASON": "issue_assigned"}}
	if _, err := suite.cs.CoreV1().Secrets(in.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job.Annotations = map[string]string{contract.AnnotationEnvSecret: secret.Name}
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a Job with its run's env Secret: %v", err)
	}
	agent := stored.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(agent.EnvFrom, func(e corev1.EnvFromSource) bool { return e.SecretRef != nil && e.SecretRef.Name == secret.Name }) {
		t.Errorf("agent container envFrom %+v lacks the run's Secret", agent.EnvFrom)
	}

	// The Job owns its run's Secret, so it goes with the Job.
	secrets := suite.cs.CoreV1().Secrets(in.Namespace)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := secrets.Get(ctx, secret.Name, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == stored.UID }), nil
	})
	if err != nil {
		t.Fatal("the run's env Secret was never owned by its Job")
	}
	if err := suite.cs.BatchV1().Jobs(in.Namespace).Delete(ctx, stored.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := secrets.Get(ctx, secret.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Error("the run's env Secret outlived its deleted Job")
	}
	if s, err := secrets.Get(ctx, "llm-keys", metav1.GetOptions{}); err != nil || len(s.OwnerReferences) != 0 {
		t.Errorf("the server's Secret: %v, owners %v", err, s.OwnerReferences)
	}

	// The Job's own containers are held to the same rule: a Secret of the
	// namespace not labeled for the run is refused, by whatever route.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "e2e-team-secret", Namespace: in.Namespace}, StringData: map[string]string{"k": "v"}}
	if _, err := suite.cs.CoreV1().Secrets(in.Namespace).Create(ctx, other, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	own := in.BareJob(t, "e2e-own-secret-ref")
	own.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "ghcr.io/paperclipai/paperclip:v2026.11.3", Command: []string{"true"},
		EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: other.Name}}}}}}
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, own, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "envFrom[0].secretRef") || !strings.Contains(err.Error(), other.Name) {
		t.Errorf("a Job's own envFrom of an unlabeled Secret: want 403 naming it, got %v", err)
	}

	for _, tc := range []struct{ secret, want string }{
		{"llm-keys", `Secret llm-keys is the Paperclip server's`},
		{"no-such-secret", `metadata.annotations[paperclip.io/env-secret]: Not found`},
	} {
		other := in.BareJob(t, "e2e-env-secret-"+tc.secret)
		other.Annotations = map[string]string{contract.AnnotationEnvSecret: tc.secret}
		_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env Secret %s: want a refusal saying %q, got %v", tc.secret, tc.want, err)
		}
	}
}

// TestAdapterFlow plays a Paperclip adapter's whole run through the real
// API server, as docs/adapters.md ("Writing a client") tells
// it: a small labeled Job with its run's env and prompt Secrets, created;
// a second run of the agent refused with the holder in the causes; the
// run followed through the relay to its result; and after the Job's TTL
// the Secrets are gone with it while the log and result are still served.
func TestAdapterFlow(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	r, token, _ := in.Relay(t)
	job := in.BareJob(t, "e2e-adapter-flow")
	run, agent := job.Labels[contract.LabelRunID], job.Labels[contract.LabelAgentID]
	job.Labels[contract.LabelSessionID] = "sess-e2e"
	job.Annotations = map[string]string{contract.AnnotationEnvSecret: run + "-env", contract.AnnotationModel: "claude-sonnet-4-5"}
	job.Spec.Template.Annotations = map[string]string{contract.AnnotationPromptSecret: run + "-prompt"}
	job.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
	forRun := map[string]string{contract.LabelRunID: run, contract.LabelAgentID: agent}
	for name, data := range map[string]map[string]string{
		run + "-env":    {"PAPERCLIP_API_KEY": "run-scoped-token"},
		run + "-prompt": {"prompt": "Fix the failing test."},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: in.Namespace, Labels: forRun}, StringData: data}
		if _, err := suite.cs.CoreV1().Secrets(in.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the bare Job: %v", err)
	}
	envNames := map[string]string{}
	for _, e := range stored.Spec.Template.Spec.Containers[0].Env {
		envNames[e.Name] = e.Value
	}
	if envNames["PAPERCLIP_SESSION_ID"] != "sess-e2e" || envNames["PAPERCLIP_MODEL"] != "claude-sonnet-4-5" || envNames["PAPERCLIP_PROMPT_FILE"] == "" {
		t.Errorf("run env %v", envNames)
	}

	second := in.BareJob(t, "e2e-adapter-flow-2")
	second.Labels[contract.LabelAgentID] = agent
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{})
	if holder, _ := cause(err, contract.CauseHolderRunID); !apierrors.IsConflict(err) || holder != run {
		t.Errorf("a second run of the agent: want 409 with holder-run-id %s, got %v (holder %q)", run, err, holder)
	}

	pod := in.WaitPod(ctx, t, job.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{harness.ClaudeInit, `{"type":"assistant","message":{"content":[{"type":"text","text":"working"}]}}`, harness.ClaudeResult("fixed it")}
	for _, l := range lines {
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
	}
	// The container exits 0 (kwok's part); with a TTL of a second the Job
	// may be gone before anyone sees it complete, so the relay says when.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"0"}}}`, cluster.AnnotationExitCode)
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	done := r.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.Done })
	if res := done.Result; res == nil || res.SessionID != "sess-e2e" || res.Text != "fixed it" || res.Outcome != "succeeded" || res.CostUSD == nil || len(res.Raw) == 0 {
		t.Errorf("the run's result: %+v", res)
	}
	harness.ExactlyOnce(t, r.Lines(t, token, run), lines)

	// The Job's TTL: it goes, its run's Secrets with it.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, jerr := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
		_, eerr := suite.cs.CoreV1().Secrets(in.Namespace).Get(ctx, run+"-env", metav1.GetOptions{})
		_, perr := suite.cs.CoreV1().Secrets(in.Namespace).Get(ctx, run+"-prompt", metav1.GetOptions{})
		return apierrors.IsNotFound(jerr) && apierrors.IsNotFound(eerr) && apierrors.IsNotFound(perr), nil
	})
	if err != nil {
		t.Fatal("after the Job's TTL its run's Secrets are still there")
	}
	if after, code := r.Run(t, token, run); code != http.StatusOK || after.Result == nil || after.Result.Text != "fixed it" {
		t.Errorf("after the TTL the relay serves %d %+v", code, after)
	}
}

// TestTenantNamespace: in a namespace apart from the server (config
// tenantNamespaces), as Paperclip's Kubernetes plugin runs agents per
// company, a bare Job is completed with nothing of the server's — no PVC,
// pull secrets or env — an emptyDir workspace and its profile's image,
// and the claim holds there as anywhere.
func TestTenantNamespace(t *testing.T) {
	in := newInstall(t, harness.InstallOptions{Also: []string{"acme"}})
	ctx := ctxT(t)
	tenant := in.Namespaces[1]
	original := in.Config(t)
	in.WriteConfig(ctx, t, string(original)+"tenantNamespaces: ["+tenant+"]\nprofiles:\n  claude_local:\n    image: ghcr.io/paperclipai/paperclip:v2026.11.3\n", true)
	job := in.BareJob(t, "e2e-tenant")
	job.Namespace = tenant
	stored, err := suite.cs.BatchV1().Jobs(tenant).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a bare Job in a tenant namespace: %v", err)
	}
	spec := stored.Spec.Template.Spec
	if len(spec.ImagePullSecrets) != 0 {
		t.Errorf("the server's pull secrets reached a tenant namespace: %v", spec.ImagePullSecrets)
	}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("the server's PVC %s referenced in a tenant namespace", v.PersistentVolumeClaim.ClaimName)
		}
	}
	for _, e := range spec.Containers[0].Env {
		if e.Name == "ANTHROPIC_API_KEY" || e.Name == "DATABASE_URL" {
			t.Errorf("the server's %s reached a tenant namespace", e.Name)
		}
	}
	second := in.BareJob(t, "e2e-tenant-2")
	second.Namespace = tenant
	second.Labels[contract.LabelAgentID] = job.Labels[contract.LabelAgentID]
	if _, err := suite.cs.BatchV1().Jobs(tenant).Create(ctx, second, metav1.CreateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("a second run of the agent in the tenant namespace: want 409, got %v", err)
	}
}
