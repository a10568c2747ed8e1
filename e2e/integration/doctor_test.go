package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/doctor"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// doctorOptions check the suite's install: the chart's values as the
// suite installs it, the webhook's config, the relay on the host.
func doctorOptions(in *harness.Install, t *testing.T) doctor.Options {
	r, _, _ := in.Relay(t)
	values := harness.ChartValues(in.Webhook.Addr, suite.cluster.CA.CertPEM)
	values["agentNamespaces"] = []any{in.Namespace}
	values["config"] = map[string]any{"source": map[string]any{"namespace": in.Namespace}}
	return doctor.Options{Release: harness.Release, Values: values,
		Config: in.LoadConfig(t), RelayURL: "https://" + r.APIAddr}
}

func runDoctor(ctx context.Context, t *testing.T, o doctor.Options) map[string][]doctor.Result {
	t.Helper()
	byCheck := map[string][]doctor.Result{}
	for _, r := range doctor.Run(ctx, suite.cs, o) {
		byCheck[r.Check] = append(byCheck[r.Check], r)
		t.Logf("%v %s: %s %s", r.OK, r.Check, r.Detail, r.Fix)
	}
	return byCheck
}

// failed returns the failure of check, asserting it names a fix.
func failed(t *testing.T, results map[string][]doctor.Result, check, want string) {
	t.Helper()
	for _, r := range results[check] {
		if !r.OK {
			if !strings.Contains(r.Detail, want) || r.Fix == "" {
				t.Errorf("%s failed with %q (fix %q); want it to say %q and name a fix", check, r.Detail, r.Fix, want)
			}
			return
		}
	}
	t.Errorf("check %s passed; want a failure saying %q", check, want)
}

// TestDoctor: on the suite's install every check passes; each broken
// part (the CA bundle, the source Deployment, its PVC missing or RWO, a
// permission) fails its own check with the fix named.
func TestDoctor(t *testing.T) {
	// Alone: the install is registered under the chart's own names, for
	// every namespace, which is what the doctor checks.
	in := addInstall(t, harness.InstallOptions{AsTheRelease: true})
	ctx := ctxT(t)
	o := doctorOptions(in, t)
	all := runDoctor(ctx, t, o)
	for _, check := range []string{"webhook-configurations", "ca-bundle", "certificate", "source-deployment", "shared-volume", "rbac", "relay", "dry-run"} {
		if len(all[check]) == 0 {
			t.Errorf("check %s did not run", check)
		}
		for _, r := range all[check] {
			if !r.OK {
				t.Errorf("on a sound install %s failed: %s (fix: %s)", check, r.Detail, r.Fix)
			}
		}
	}

	t.Run("the source Deployment missing, its PVC missing or ReadWriteOnce", func(t *testing.T) {
		missing := *o.Config
		missing.Source.Deployment = "no-such-server"
		mo := o
		mo.Config = &missing
		failed(t, runDoctor(ctx, t, mo), "source-deployment", "no-such-server")

		for _, tc := range []struct {
			name, claim string
			modes       []corev1.PersistentVolumeAccessMode
			want        string
		}{
			{"paperclip-rwo", "rwo-data", []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, "not ReadWriteMany"},
			{"paperclip-nopvc", "missing-data", nil, `"missing-data" not found`},
		} {
			if tc.modes != nil {
				pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: tc.claim, Namespace: in.Namespace},
					Spec: corev1.PersistentVolumeClaimSpec{AccessModes: tc.modes, Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
				if _, err := suite.cs.CoreV1().PersistentVolumeClaims(in.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			server := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: in.Namespace},
				Spec: appsv1.DeploymentSpec{Replicas: new(int32), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": tc.name}},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": tc.name}},
						Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "paperclip", Image: "ghcr.io/paperclipai/paperclip:1",
							VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/paperclip"}}}},
							Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
								PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: tc.claim}}}}}}}}
			if _, err := suite.cs.AppsV1().Deployments(in.Namespace).Create(ctx, server, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cfg := *o.Config
			cfg.Source.Deployment = tc.name
			co := o
			co.Config = &cfg
			failed(t, runDoctor(ctx, t, co), "shared-volume", tc.want)
		}
	})

	t.Run("a webhook switched to Ignore, the claim Lease policy unbound", func(t *testing.T) {
		vwcs := suite.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
		vwc, err := vwcs.Get(ctx, in.ValidatingWebhookName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vwc.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		if _, err := vwcs.Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		bindings := suite.cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
		if err := bindings.Delete(ctx, in.ClaimLeasePolicyName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := in.Register(context.Background(), harness.RegisterOptions{}); err != nil {
				t.Error(err)
			}
			if err := in.ApplyClaimLeasePolicy(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		results := runDoctor(ctx, t, o)
		failed(t, results, "webhook-configurations", `FailurePolicy "Ignore", the chart's "Fail"`)
		failed(t, results, "claim-lease-policy", "clipjob-claim-leases")
	})

	t.Run("a permission missing", func(t *testing.T) {
		roles := suite.cs.RbacV1().ClusterRoles()
		role, err := roles.Get(ctx, "clipjob-relay", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		original := role.DeepCopy()
		var kept []rbacv1.PolicyRule
		for _, r := range role.Rules {
			if fmt.Sprint(r.Resources) != "[tokenreviews]" {
				kept = append(kept, r)
			}
		}
		role.Rules = kept
		if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cur, err := roles.Get(context.Background(), "clipjob-relay", metav1.GetOptions{})
			if err == nil {
				cur.Rules = original.Rules
				_, err = roles.Update(context.Background(), cur, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Error(err)
			}
		}()
		failed(t, runDoctor(ctx, t, o), "rbac", "create tokenreviews.authentication.k8s.io")
	})
}
