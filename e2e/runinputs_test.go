package e2e

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/contract"
)

// TestRunEnvSecret: a run's own env comes from a Secret made for it and
// named on the Job; the agent container gets every key of it. A Secret
// that is not labeled for the run — the server's own, another run's — or
// one that does not exist is refused, naming the annotation.
func TestRunEnvSecret(t *testing.T) {
	ctx := ctxT(t)
	job := bareJob(t, "e2e-env-secret")
	run := job.Labels[contract.LabelRunID]
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: run + "-env", Namespace: ns, Labels: map[string]string{contract.LabelRunID: run}},
		StringData: map[string]string{"PAPERCLIP_API_KEY": "run-scoped-token", "PAPERCLIP_WAKE_REASON": "issue_assigned"}}
	if _, err := env.cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job.Annotations = map[string]string{contract.AnnotationEnvSecret: secret.Name}
	stored, err := env.cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a Job with its run's env Secret: %v", err)
	}
	agent := stored.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(agent.EnvFrom, func(e corev1.EnvFromSource) bool { return e.SecretRef != nil && e.SecretRef.Name == secret.Name }) {
		t.Errorf("agent container envFrom %+v lacks the run's Secret", agent.EnvFrom)
	}

	for _, tc := range []struct{ secret, want string }{
		{"llm-keys", `Secret llm-keys is labeled paperclip.io/run-id=""`},
		{"no-such-secret", `metadata.annotations[paperclip.io/env-secret]: Not found`},
	} {
		other := bareJob(t, "e2e-env-secret-"+tc.secret)
		other.Annotations = map[string]string{contract.AnnotationEnvSecret: tc.secret}
		_, err := env.cs.BatchV1().Jobs(ns).Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env Secret %s: want a refusal saying %q, got %v", tc.secret, tc.want, err)
		}
	}
}
