package app

import (
	"context"
	"fmt"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/doctor"
)

var doctorRelease = charts.Release{Name: "clipjob", Namespace: "clipjob-system"}

// offline are doctor's options for a fake clientset: the relay at an
// address nothing answers (the fake has no service proxy).
var offline = doctor.Options{Release: doctorRelease, RelayURL: "https://127.0.0.1:1"}

// relayDeployment is the relay Deployment the chart renders for values.
func relayDeployment(t *testing.T, values map[string]any) *appsv1.Deployment {
	t.Helper()
	r, err := charts.Render(doctorRelease, values)
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := r.Into("Deployment", "clipjob-relay", &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// checked is the results of doctor's rbac check that name the Role or
// ClusterRole role.
func checked(results []doctor.Result, role string) []doctor.Result {
	var out []doctor.Result
	for _, r := range results {
		if r.Check == "rbac" && (strings.Contains(r.Detail, role) || strings.Contains(r.Fix, role)) {
			out = append(out, r)
		}
	}
	return out
}

// Without --values, doctor checks the install the cluster has: one
// rendered on PostgreSQL (no Helm record) with the store, replicas,
// Secret and schema its relay Deployment runs with; neither grants the
// relay any Lease Role to check, since its replicas divide the runs
// through the store.
func TestDoctorChecksTheRelayStoreTheInstallRuns(t *testing.T) {
	ctx := context.Background()
	onPostgres := map[string]any{"relay": map[string]any{"store": "postgres", "replicas": 2,
		"postgres": map[string]any{"url": "postgres://relay:pw@db:5432/paperclip", "schema": "relays"}}}
	cs := fake.NewClientset(relayDeployment(t, onPostgres))
	results := doctorResults(ctx, cs, offline, "")
	if got := checked(results, "clipjob-relay-leases"); len(got) != 0 {
		t.Errorf("on PostgreSQL doctor checked a relay Lease Role the chart no longer grants: %+v", got)
	}
	if results[0].Check != "values" || !strings.Contains(results[0].Detail, "PostgreSQL (2 replicas, Secret clipjob-relay-postgres, schema relays)") {
		t.Errorf("doctor does not say which values it rendered: %+v", results[0])
	}

	cs = fake.NewClientset(relayDeployment(t, nil))
	results = doctorResults(ctx, cs, offline, "")
	if got := checked(results, "clipjob-relay-leases"); len(got) != 0 {
		t.Errorf("on bbolt doctor checked a Lease Role the install does not have: %+v", got)
	}
	if !strings.Contains(results[0].Detail, "bbolt") {
		t.Errorf("values: %+v", results[0])
	}
}

// A release installed with Helm is checked with the values of Helm's record
// of its deployed revision (read as Helm writes it), not an older one's.
func TestDoctorReadsHelmsRecordOfTheRelease(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	helm := driver.NewSecrets(cs.CoreV1().Secrets(doctorRelease.Namespace))
	for _, r := range []*release.Release{
		{Version: 1, Info: &release.Info{Status: release.StatusSuperseded}, Config: map[string]any{"agentNamespaces": []any{"old"}}},
		{Version: 2, Info: &release.Info{Status: release.StatusDeployed}, Config: map[string]any{
			"agentNamespaces": []any{"agents"},
			"relay":           map[string]any{"store": "postgres", "replicas": 3, "postgres": map[string]any{"existingSecret": "relay-db"}}}},
	} {
		r.Name, r.Namespace = doctorRelease.Name, doctorRelease.Namespace
		if err := helm.Create(fmt.Sprintf("sh.helm.release.v1.%s.v%d", r.Name, r.Version), r); err != nil {
			t.Fatal(err)
		}
	}
	values, from := installedValues(ctx, cs, doctorRelease)
	if !strings.Contains(from, "Helm's record of release clipjob (revision 2)") {
		t.Errorf("values %s", from)
	}
	rendered, err := charts.Render(doctorRelease, values)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct{ kind, ns, name string }{
		{"PodDisruptionBudget", doctorRelease.Namespace, "clipjob-relay"},
		{"RoleBinding", "agents", "clipjob-webhook-agents"},
	} {
		if rendered.FindIn(want.kind, want.ns, want.name) == nil {
			t.Errorf("the values read from Helm's record render no %s %s/%s", want.kind, want.ns, want.name)
		}
	}
	if rendered.FindIn("RoleBinding", "old", "clipjob-webhook-agents") != nil {
		t.Error("rendered with the superseded revision's values")
	}
	var d appsv1.Deployment
	if err := rendered.Into("Deployment", "clipjob-relay", &d); err != nil || *d.Spec.Replicas != 3 {
		t.Errorf("relay Deployment %v: %+v", err, d.Spec.Replicas)
	}
}

// An install applied with `helm template` (no Helm record) on other agent
// namespaces than the chart's default, with tenant namespaces and the
// shared-claim rule's Deployments: doctor reads them from the installed
// config ConfigMap, so the webhook configurations it renders (the pod
// webhook's matchConditions list the namespaces agents run in) are the
// install's, and pass.
func TestDoctorReadsTheAgentNamespacesFromTheInstalledConfig(t *testing.T) {
	ctx := context.Background()
	installed := map[string]any{"agentNamespaces": []any{"paperclip", "agents-b"},
		"config": map[string]any{"tenantNamespaces": []any{"team-a"}}}
	r, err := charts.Render(doctorRelease, installed)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, o := range []struct {
		kind, name string
		into       runtime.Object
	}{
		{"ConfigMap", "clipjob-config", &corev1.ConfigMap{}},
		{"ValidatingWebhookConfiguration", "clipjob-validating", &admissionregistrationv1.ValidatingWebhookConfiguration{}},
		{"MutatingWebhookConfiguration", "clipjob-mutating", &admissionregistrationv1.MutatingWebhookConfiguration{}},
		{"Deployment", "clipjob-relay", &appsv1.Deployment{}},
	} {
		if err := r.Into(o.kind, o.name, o.into); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o.into)
	}
	results := doctorResults(ctx, fake.NewClientset(objs...), offline, "")
	if !strings.Contains(results[0].Detail, "agent namespaces paperclip, agents-b, team-a") {
		t.Errorf("doctor does not say where the agent namespaces came from: %+v", results[0])
	}
	seen := false
	for _, res := range results {
		if res.Check == "webhook-configurations" {
			seen = true
			if !res.OK {
				t.Errorf("doctor on an install without a Helm record, other agent namespaces: %s", res.Detail)
			}
		}
	}
	if !seen {
		t.Errorf("doctor did not compare the webhook configurations: %+v", results)
	}
}
