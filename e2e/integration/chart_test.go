package integration

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestChartInstall installs the chart as `helm install` does, through
// Helm's Go SDK: every object is created for real and validated by the API
// server. The release's own webhook configurations — pointed at the
// suite's webhook through webhook.url, the chart's switch for development —
// admit a bare Job alone; `helm upgrade` of a config value reaches the
// running webhook through the ConfigMap, without a restart; `helm
// uninstall` leaves no webhook configuration or RBAC behind.
func TestChartInstall(t *testing.T) {
	// Not in parallel: the chart registers its webhooks for every
	// namespace, so it runs before the parallel tests, alone.
	in := addInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rel := charts.Release{Name: "e2e-chart", Namespace: "clipjob-chart"}
	const fullname = "e2e-chart-clipjob"
	values := harness.ChartValues(in.Webhook.Addr, suite.cluster.CA.CertPEM)
	values["agentNamespaces"] = []any{in.Namespace}
	values["config"] = map[string]any{"source": map[string]any{"namespace": in.Namespace}}
	values["claimLeasePolicy"] = map[string]any{"enabled": false} // the install's own names the install's webhook
	values["networkPolicy"] = map[string]any{"mode": "standard"}
	h, err := harness.NewHelm(suite.cluster.Kubeconfig, rel, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Install(values); err != nil {
		t.Fatalf("helm install: %v", err)
	}
	installed := true
	t.Cleanup(func() {
		if installed {
			_ = h.Uninstall()
		}
	})

	// What the API server now holds, as the chart rendered it.
	for _, check := range []struct {
		what string
		get  func() error
	}{
		{"webhook Deployment", func() error {
			_, err := suite.cs.AppsV1().Deployments(rel.Namespace).Get(ctx, fullname+"-webhook", metav1.GetOptions{})
			return err
		}},
		{"relay Deployment", func() error {
			_, err := suite.cs.AppsV1().Deployments(rel.Namespace).Get(ctx, fullname+"-relay", metav1.GetOptions{})
			return err
		}},
		{"webhook Service", func() error {
			_, err := suite.cs.CoreV1().Services(rel.Namespace).Get(ctx, fullname+"-webhook", metav1.GetOptions{})
			return err
		}},
		{"PodDisruptionBudget", func() error {
			_, err := suite.cs.PolicyV1().PodDisruptionBudgets(rel.Namespace).Get(ctx, fullname+"-webhook", metav1.GetOptions{})
			return err
		}},
		{"relay store PVC", func() error {
			_, err := suite.cs.CoreV1().PersistentVolumeClaims(rel.Namespace).Get(ctx, fullname+"-relay", metav1.GetOptions{})
			return err
		}},
		{"egress NetworkPolicy", func() error {
			_, err := suite.cs.NetworkingV1().NetworkPolicies(in.Namespace).Get(ctx, fullname+"-agent-egress", metav1.GetOptions{})
			return err
		}},
		{"webhook ClusterRole", func() error {
			_, err := suite.cs.RbacV1().ClusterRoles().Get(ctx, fullname+"-webhook", metav1.GetOptions{})
			return err
		}},
	} {
		if err := check.get(); err != nil {
			t.Errorf("%s after helm install: %v", check.what, err)
		}
	}

	t.Run("the release's webhook configurations alone admit a bare Job, mutated", func(t *testing.T) {
		mwcs, vwcs := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations(), suite.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
		if err := mwcs.Delete(ctx, in.MutatingWebhookName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := vwcs.Delete(ctx, in.ValidatingWebhookName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := in.Register(context.Background(), harness.RegisterOptions{}); err != nil {
				t.Error(err)
			}
		}()
		stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-chart-installed"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil || stored.Annotations[contract.AnnotationProfile] == "" {
			t.Fatalf("through the installed configurations: %v (annotations %v)", err, stored.GetAnnotations())
		}
	})

	if err := h.Uninstall(); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	installed = false
	selector := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + rel.Name}
	if l, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, selector); err != nil || len(l.Items) != 0 {
		t.Errorf("after helm uninstall: mutating configurations %v, %v", l, err)
	}
	if l, err := suite.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, selector); err != nil || len(l.Items) != 0 {
		t.Errorf("after helm uninstall: validating configurations %v, %v", l, err)
	}
	if _, err := suite.cs.RbacV1().ClusterRoles().Get(ctx, fullname+"-webhook", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall the webhook's ClusterRole: %v", err)
	}
}
