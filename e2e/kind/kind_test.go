//go:build kind

package kind

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/doctor"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// The cluster and image hack/e2e-kind.sh made.
var (
	kubeconfig = os.Getenv("KIND_KUBECONFIG")
	image      = os.Getenv("CLIPJOB_IMAGE") // repository:tag, loaded into the kind nodes
	release    = charts.Release{Name: "clipjob", Namespace: "clipjob-system"}
)

// clientset reaches the kind cluster, with the example Paperclip (the
// source Deployment and its PVC) applied.
func clientset(ctx context.Context, t *testing.T) kubernetes.Interface {
	t.Helper()
	if kubeconfig == "" || image == "" {
		t.Fatal("run through make e2e-kind: KIND_KUBECONFIG and CLIPJOB_IMAGE are required")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.ApplyTo(ctx, rc, "examples/paperclip.yaml"); err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc)
}

func values() map[string]any {
	repo, tag, _ := strings.Cut(image, ":")
	return map[string]any{"image": map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"}}
}

func bareJob(name, agent string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "paperclip", Labels: map[string]string{
		contract.LabelAgentID: agent, contract.LabelCompanyID: "kind", contract.LabelRunID: name, contract.LabelAdapterType: "claude_local"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
			Annotations: map[string]string{contract.AnnotationPrompt: "kind e2e"}}}}}
}

// TestInCluster installs the chart with its defaults (two webhook
// replicas behind their Service, self-managed certificates, the relay),
// waits for it, has clipjob doctor find nothing wrong, and tries the
// promises a client meets: a bare Job comes back mutated, a second run of
// the agent gets 409, a bare agent pod is refused. Uninstalling leaves no
// webhook configuration.
func TestInCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cs := clientset(ctx, t)
	h, err := harness.NewHelm(kubeconfig, release, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Install(values()); err != nil {
		t.Fatalf("helm install: %v", err)
	}
	defer func() {
		if err := h.Uninstall(); err != nil {
			t.Errorf("helm uninstall: %v", err)
		}
		l, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(context.Background(),
			metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release.Name})
		if err != nil || len(l.Items) != 0 {
			t.Errorf("after helm uninstall: %d validating configurations (%v)", len(l.Items), err)
		}
	}()
	for _, d := range []string{"clipjob-webhook", "clipjob-relay"} {
		err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			dep, err := cs.AppsV1().Deployments(release.Namespace).Get(ctx, d, metav1.GetOptions{})
			return err == nil && available(dep), nil
		})
		if err != nil {
			t.Fatalf("Deployment %s never became available", d)
		}
	}
	var results []doctor.Result
	err = wait.PollUntilContextTimeout(ctx, 5*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		results = doctor.Run(ctx, cs, doctor.Options{Release: release})
		for _, r := range results {
			if !r.OK {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, r := range results {
			t.Logf("%v %s: %s %s", r.OK, r.Check, r.Detail, r.Fix)
		}
		t.Fatal("clipjob doctor never reported all green")
	}

	first, err := cs.BatchV1().Jobs("paperclip").Create(ctx, bareJob("kind-run-1", "kind-agent"), metav1.CreateOptions{})
	if err != nil || first.Annotations[contract.AnnotationProfile] != "claude_local" {
		t.Fatalf("a bare Job: %v", err)
	}
	if _, err := cs.BatchV1().Jobs("paperclip").Create(ctx, bareJob("kind-run-2", "kind-agent"), metav1.CreateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("a second run of the agent: want 409, got %v", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kind-smuggled", Namespace: "paperclip",
		Labels: map[string]string{contract.LabelAgentID: "x", contract.LabelRunID: "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}}}
	if _, err := cs.CoreV1().Pods("paperclip").Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a bare agent pod: want 403, got %v", err)
	}
	// With its pod: an orphaned agent pod keeps its CPU request, and on a
	// 2-core kind node the next run's webhook pods no longer fit.
	_ = cs.BatchV1().Jobs("paperclip").Delete(ctx, first.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
}

func available(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			return d.Status.UpdatedReplicas == *d.Spec.Replicas
		}
	}
	return false
}
