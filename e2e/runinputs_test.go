package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
)

// TestRunEnvSecret: a run's own env comes from a Secret made for it and
// named on the Job; the agent container gets every key of it, and the Job
// owns the Secret, which is deleted with it. A Secret
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

	// The Job owns its run's Secret, so it goes with the Job.
	secrets := env.cs.CoreV1().Secrets(ns)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		s, err := secrets.Get(ctx, secret.Name, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == stored.UID }), nil
	})
	if err != nil {
		t.Fatal("the run's env Secret was never owned by its Job")
	}
	if err := env.cs.BatchV1().Jobs(ns).Delete(ctx, stored.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
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
