package charts

import (
	"encoding/base64"
	"maps"
	"slices"
	"strings"
	"testing"

	cmv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
)

var rel = Release{Name: "clipjob", Namespace: "clipjob-system"}

func render(t *testing.T, values map[string]any) *Rendered {
	t.Helper()
	r, err := Render(rel, values)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func into(t *testing.T, r *Rendered, kind, name string, out runtime.Object) {
	t.Helper()
	if err := r.Into(kind, name, out); err != nil {
		t.Fatal(err)
	}
}

// TestLint runs Helm's own linter, as `helm lint --strict` does, over the
// chart with each value set the tests render.
func TestLint(t *testing.T) {
	lintChart := chartLinter(t)
	for name, values := range valueSets {
		lintChart(t, name, values)
	}
}

// chartLinter saves the chart in a directory of the test's and returns a
// function that lints it with values, failing the test it is given on
// every message worse than information.
func chartLinter(t *testing.T) func(t *testing.T, name string, values map[string]any) {
	t.Helper()
	dir := t.TempDir()
	ch, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := chartutil.SaveDir(ch, dir); err != nil {
		t.Fatal(err)
	}
	return func(t *testing.T, name string, values map[string]any) {
		t.Helper()
		linter := lint.AllWithKubeVersion(dir+"/"+Name, values, rel.Namespace, nil)
		for _, m := range linter.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("%s: lint: %s", name, m)
			}
		}
	}
}

// valueSets are the installs the chart promises to render.
var valueSets = map[string]map[string]any{
	"defaults":     nil,
	"cert-manager": {"certificates": map[string]any{"mode": "certManager"}},
	"cert-manager with an issuer": {"certificates": map[string]any{"mode": "certManager",
		"certManager": map[string]any{"issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
	"external certificates": {"certificates": map[string]any{"mode": "external", "caBundle": base64.StdEncoding.EncodeToString([]byte("ca"))}},
	"standard egress":       {"networkPolicy": map[string]any{"mode": "standard"}},
	"cilium egress":         {"networkPolicy": map[string]any{"mode": "cilium"}},
	"replicas 3":            {"webhook": map[string]any{"replicas": 3}},
	"relay mirror":          {"relay": map[string]any{"mirror": map[string]any{"enabled": true}, "redactValuesSecret": "agent-keys"}},
	"no relay":              {"relay": map[string]any{"enabled": false}},
	"managed namespace":     {"agentNamespace": map[string]any{"create": true}},
	"service monitor":       {"serviceMonitor": map[string]any{"enabled": true}},
	"compiled policies":     {"compiledPolicies": map[string]any{"enabled": true}},
}

// Every value set renders objects that decode into their typed API
// objects without an unknown field.
func TestEveryValueSetDecodes(t *testing.T) {
	typed := map[string]func() runtime.Object{
		"Deployment": func() runtime.Object { return &appsv1.Deployment{} }, "Service": func() runtime.Object { return &corev1.Service{} },
		"ServiceAccount": func() runtime.Object { return &corev1.ServiceAccount{} }, "ConfigMap": func() runtime.Object { return &corev1.ConfigMap{} },
		"PersistentVolumeClaim": func() runtime.Object { return &corev1.PersistentVolumeClaim{} }, "Namespace": func() runtime.Object { return &corev1.Namespace{} },
		"ClusterRole": func() runtime.Object { return &rbacv1.ClusterRole{} }, "ClusterRoleBinding": func() runtime.Object { return &rbacv1.ClusterRoleBinding{} },
		"Role": func() runtime.Object { return &rbacv1.Role{} }, "RoleBinding": func() runtime.Object { return &rbacv1.RoleBinding{} },
		"PodDisruptionBudget": func() runtime.Object { return &policyv1.PodDisruptionBudget{} }, "NetworkPolicy": func() runtime.Object { return &networkingv1.NetworkPolicy{} },
		"MutatingWebhookConfiguration":     func() runtime.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} },
		"ValidatingWebhookConfiguration":   func() runtime.Object { return &admissionregistrationv1.ValidatingWebhookConfiguration{} },
		"ValidatingAdmissionPolicy":        func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicy{} },
		"ValidatingAdmissionPolicyBinding": func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{} },
		"Certificate":                      func() runtime.Object { return &cmv1.Certificate{} },
		"Issuer":                           func() runtime.Object { return &cmv1.Issuer{} },
	}
	// Custom resources whose Go types are not worth their dependencies,
	// checked by shape in their own tests.
	foreign := []string{"CiliumNetworkPolicy", "ServiceMonitor"}
	for name, values := range valueSets {
		r := render(t, values)
		for _, o := range r.Objects {
			mk, ok := typed[o.GetKind()]
			if !ok {
				if !slices.Contains(foreign, o.GetKind()) {
					t.Errorf("%s: %s %s has no typed check", name, o.GetKind(), o.GetName())
				}
				continue
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, mk(), true); err != nil {
				t.Errorf("%s: %s %s: %v", name, o.GetKind(), o.GetName(), err)
			}
			if o.GetLabels()["app.kubernetes.io/instance"] != rel.Name || o.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
				t.Errorf("%s: %s %s lacks the app.kubernetes.io labels: %v", name, o.GetKind(), o.GetName(), o.GetLabels())
			}
		}
	}
}

// A typo in values is an error, not a silent default.
func TestSchemaRefusesUnknownValues(t *testing.T) {
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"webhok": map[string]any{}}, "webhok"},
		{map[string]any{"webhook": map[string]any{"replica": 3}}, "replica"},
		{map[string]any{"webhook": map[string]any{"failurePolicy": "Open"}}, "failurePolicy"},
		// Each is a --namespace of the webhook, which refuses to start on
		// a name no namespace can have (and then no agent Job is admitted).
		{map[string]any{"webhook": map[string]any{"namespaces": []any{"Team_A"}}}, "namespaces"},
		{map[string]any{"certificates": map[string]any{"mode": "manual"}}, "mode"},
		{map[string]any{"networkPolicy": map[string]any{"mode": "calico"}}, "mode"},
		{map[string]any{"relay": map[string]any{"mirror": map[string]any{"enabld": true}}}, "enabld"},
	} {
		_, err := Render(rel, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want an error naming %q, got %v", tc.values, tc.want, err)
		}
	}
	if _, err := Render(rel, map[string]any{"certificates": map[string]any{"mode": "external"}}); err == nil || !strings.Contains(err.Error(), "caBundle") {
		t.Errorf("external certificates without a caBundle: %v", err)
	}
	// Values that render, but into an install that cannot work or is not
	// safe, are refused naming the value.
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"webhook": map[string]any{"url": "https://10.0.0.1:9443"}}, "webhook.url with certificates.mode selfManaged"},
		{map[string]any{"agentNamespaces": []any{"clipjob-system"}}, "the release namespace clipjob-system may not be an agent namespace"},
		{map[string]any{"relay": map[string]any{"tokenAudience": ""}}, "tokenAudience"},
		{map[string]any{"relay": map[string]any{"retentionMaxAge": "forever"}}, "retentionMaxAge"},
		{map[string]any{"certificates": map[string]any{"certManager": map[string]any{"duration": "-5h"}}}, "duration"},
		{map[string]any{"networkPolicy": map[string]any{"excludedCIDRs": []any{}}}, "excludedCIDRs"},
	} {
		_, err := Render(rel, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want an error naming %q, got %v", tc.values, tc.want, err)
		}
	}
}

// The webhook writes only where agents run: cluster-wide it reads (and
// makes events); its writes are Roles in the agent namespaces, the source
// namespace and its own, and its certificate Secrets by name.
func TestWebhookRBACIsLeastPrivilege(t *testing.T) {
	r := render(t, map[string]any{"agentNamespaces": []any{"paperclip", "paperclip-acme"}})
	var cluster rbacv1.ClusterRole
	into(t, r, "ClusterRole", "clipjob-webhook", &cluster)
	for _, rule := range cluster.Rules {
		for _, v := range rule.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) && !slices.Contains(rule.Resources, "events") {
				t.Errorf("cluster-wide %s on %v: writes belong in the agent namespaces' Roles", v, rule.Resources)
			}
		}
	}
	roles := map[string][]rbacv1.PolicyRule{}
	for _, o := range r.Objects {
		if o.GetKind() == "Role" {
			var role rbacv1.Role
			if err := Decode(o, &role); err != nil {
				t.Fatal(err)
			}
			if o.GetNamespace() != "" {
				roles[o.GetNamespace()+"/"+o.GetName()] = role.Rules
			}
		}
	}
	for _, want := range []string{"paperclip/clipjob-webhook-agents", "paperclip-acme/clipjob-webhook-agents",
		"paperclip/clipjob-webhook-source", "clipjob-system/clipjob-webhook-election", "clipjob-system/clipjob-webhook-certs"} {
		if _, ok := roles[want]; !ok {
			t.Errorf("no Role %s (have %v)", want, slices.Sorted(maps.Keys(roles)))
		}
	}
	for _, rule := range roles["clipjob-system/clipjob-webhook-certs"] {
		if slices.Contains(rule.Verbs, "get") && len(rule.ResourceNames) != 3 {
			t.Errorf("the certificate Role reads Secrets %v: want its own three by name", rule.ResourceNames)
		}
	}
	var cm corev1.ConfigMap
	into(t, r, "ConfigMap", "clipjob-config", &cm)
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"paperclip", "paperclip-acme"}, cfg.Policy.Namespaces); d != "" {
		t.Errorf("agent Jobs are admitted outside the namespaces the chart gave clipjob rights in (-want +got):\n%s", d)
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	into(t, r, "ValidatingAdmissionPolicyBinding", "clipjob-claim-leases", &binding)
	if sel := binding.Spec.MatchResources.NamespaceSelector; sel == nil || len(sel.MatchExpressions) != 1 || len(sel.MatchExpressions[0].Values) != 2 {
		t.Errorf("the claim Lease policy must cover this release's agent namespaces only: %+v", binding.Spec.MatchResources)
	}
}

// The config ConfigMap holds exactly the values' config, a Config the
// webhook loads.
func TestConfigMapIsAConfig(t *testing.T) {
	r := render(t, map[string]any{"config": map[string]any{
		"source": map[string]any{"namespace": "pc", "deployment": "server", "container": "app"},
		"policy": map[string]any{"concurrency": map[string]any{"mode": "Queue"}},
	}})
	var cm corev1.ConfigMap
	into(t, r, "ConfigMap", "clipjob-config", &cm)
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("the rendered config does not load: %v\n%s", err, cm.Data["config.yaml"])
	}
	if cfg.Source.Namespace != "pc" || cfg.Source.Deployment != "server" || cfg.Policy.Concurrency.Mode != config.ModeQueue {
		t.Errorf("config %+v %+v", cfg.Source, cfg.Policy.Concurrency)
	}
}

func TestWebhookDeployment(t *testing.T) {
	for _, replicas := range []int{1, 2, 3} {
		r := render(t, map[string]any{"webhook": map[string]any{"replicas": replicas}})
		var d appsv1.Deployment
		into(t, r, "Deployment", "clipjob-webhook", &d)
		if *d.Spec.Replicas != int32(replicas) || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
			t.Errorf("replicas %d: %d, maxUnavailable %v", replicas, *d.Spec.Replicas, d.Spec.Strategy.RollingUpdate.MaxUnavailable)
		}
		var pdb policyv1.PodDisruptionBudget
		into(t, r, "PodDisruptionBudget", "clipjob-webhook", &pdb)
		if replicas > 1 && (pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1) {
			t.Errorf("replicas %d: PDB %+v, want minAvailable 1", replicas, pdb.Spec)
		}
		if replicas == 1 && pdb.Spec.MinAvailable != nil {
			t.Error("one replica with minAvailable 1 would block every node drain")
		}
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		if !ptr.Deref(spec.SecurityContext.RunAsNonRoot, false) || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
			!ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false) || ptr.Deref(c.SecurityContext.AllowPrivilegeEscalation, true) {
			t.Errorf("webhook pod is not restricted: %+v %+v", spec.SecurityContext, c.SecurityContext)
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil || c.Resources.Requests.Cpu().IsZero() {
			t.Error("webhook container lacks probes or requests")
		}
		if !slices.Contains(c.Args, "--shutdown-delay=10s") || *spec.TerminationGracePeriodSeconds != 30 {
			t.Errorf("shutdown delay: args %v, grace %d", c.Args, *spec.TerminationGracePeriodSeconds)
		}
		if len(spec.TopologySpreadConstraints) != 2 {
			t.Errorf("replicas are not spread: %+v", spec.TopologySpreadConstraints)
		}
		if d.Spec.Template.Labels["app.kubernetes.io/component"] != "webhook" {
			t.Error("pod template lacks the component label its Service selects")
		}
	}
}

// compiledPolicies.enabled starts the webhook's syncer, grants it the
// compiled policies (and nothing else cluster-wide beyond reads), and
// skips the mutating webhook for a Job a policy completed; off, none of
// it is there.
func TestCompiledPoliciesValue(t *testing.T) {
	for _, on := range []bool{false, true} {
		r := render(t, map[string]any{"compiledPolicies": map[string]any{"enabled": on}})
		var d appsv1.Deployment
		into(t, r, "Deployment", "clipjob-webhook", &d)
		if got := slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--compiled-policies"); got != on {
			t.Errorf("enabled %v: --compiled-policies passed %v", on, got)
		}
		var cluster rbacv1.ClusterRole
		into(t, r, "ClusterRole", "clipjob-webhook", &cluster)
		var writes []string
		for _, rule := range cluster.Rules {
			if slices.Contains(rule.Verbs, "create") && !slices.Contains(rule.Resources, "events") {
				writes = append(writes, rule.Resources...)
			}
		}
		want := []string(nil)
		if on {
			want = []string{"mutatingadmissionpolicies", "mutatingadmissionpolicybindings"}
		}
		if d := cmp.Diff(want, writes); d != "" {
			t.Errorf("enabled %v: cluster-wide writes (-want +got):\n%s", on, d)
		}
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		into(t, r, "MutatingWebhookConfiguration", "clipjob-mutating", &mwc)
		conds := mwc.Webhooks[0].MatchConditions
		if on != (len(conds) == 1 && conds[0].Name == "not-completed-by-a-compiled-policy") {
			t.Errorf("enabled %v: mutating matchConditions %+v", on, conds)
		}
		// In Queue mode queued runs are judged when they start: their
		// CREATE skips the validating webhook, and the agent-runs policy
		// holds the rest. In Reject mode every agent CREATE is judged (and
		// a busy agent's run gets its 409) however it looks.
		for _, mode := range []string{"Reject", "Queue"} {
			r := render(t, map[string]any{"compiledPolicies": map[string]any{"enabled": on},
				"config": map[string]any{"policy": map[string]any{"concurrency": map[string]any{"mode": mode}}}})
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			into(t, r, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
			skips := slices.ContainsFunc(vwc.Webhooks[0].MatchConditions, func(c admissionregistrationv1.MatchCondition) bool {
				return c.Name == "queued-runs-are-judged-at-start"
			})
			if want := on && mode == "Queue"; skips != want {
				t.Errorf("enabled %v, mode %s: the validating webhook skips queued runs' creates: %v, want %v", on, mode, skips, want)
			}
		}
		var vap admissionregistrationv1.ValidatingAdmissionPolicy
		found := slices.ContainsFunc(r.Objects, func(o *unstructured.Unstructured) bool {
			return o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "clipjob-agent-runs"
		})
		if found != on {
			t.Fatalf("enabled %v: the agent-runs admission policy rendered: %v", on, found)
		}
		if on {
			into(t, r, "ValidatingAdmissionPolicy", "clipjob-agent-runs", &vap)
			if len(vap.Spec.Validations) != 4 || !strings.Contains(vap.Spec.Validations[1].Expression, "'system:serviceaccount:clipjob-system:clipjob-webhook'") {
				t.Errorf("the agent-runs policy does not let the webhook's account alone start a queued run: %+v", vap.Spec.Validations)
			}
			if *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Error("the agent-runs policy fails open")
			}
		}
	}
}

// The webhook configurations are what the e2e suite registers: checked
// here for what no e2e test can see (service mode, namespaces excluded,
// CA injection per mode).
func TestWebhookConfigurations(t *testing.T) {
	r := render(t, nil)
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	into(t, r, "MutatingWebhookConfiguration", "clipjob-mutating", &mwc)
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	into(t, r, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
	if len(mwc.Webhooks) != 1 || len(vwc.Webhooks) != 3 {
		t.Fatalf("%d mutating, %d validating webhooks", len(mwc.Webhooks), len(vwc.Webhooks))
	}
	wantNS := &admissionregistrationv1.ValidatingWebhook{NamespaceSelector: vwc.Webhooks[0].NamespaceSelector}
	excluded := wantNS.NamespaceSelector.MatchExpressions[0].Values
	if d := cmp.Diff([]string{"clipjob-system", "kube-system"}, excluded); d != "" {
		t.Errorf("excluded namespaces (-want +got):\n%s", d)
	}
	svc := mwc.Webhooks[0].ClientConfig.Service
	if svc == nil || svc.Name != "clipjob-webhook" || svc.Namespace != "clipjob-system" || *svc.Path != "/mutate-batch-v1-job" || *svc.Port != 443 {
		t.Errorf("mutating client config %+v", mwc.Webhooks[0].ClientConfig)
	}
	paths := map[string]string{}
	for _, w := range vwc.Webhooks {
		paths[w.Name] = *w.ClientConfig.Service.Path
		if *w.SideEffects == admissionregistrationv1.SideEffectClassSome || *w.FailurePolicy != admissionregistrationv1.Fail || len(w.MatchConditions) == 0 {
			t.Errorf("%s: sideEffects %s failurePolicy %s matchConditions %d", w.Name, *w.SideEffects, *w.FailurePolicy, len(w.MatchConditions))
		}
	}
	if paths["validate.jobs.clipjob.paperclip.io"] != "/validate-batch-v1-job" || paths["validate.pods.clipjob.paperclip.io"] != "/validate-v1-pod" ||
		paths["validate.persistentvolumeclaims.clipjob.paperclip.io"] != "/validate-v1-persistentvolumeclaim" {
		t.Errorf("validating paths %v", paths)
	}
	if *vwc.Webhooks[0].SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		t.Error("the Job webhook writes the claim: sideEffects must be NoneOnDryRun")
	}

	cm := render(t, valueSets["cert-manager"])
	into(t, cm, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
	if got := vwc.Annotations["cert-manager.io/inject-ca-from"]; got != "clipjob-system/clipjob-webhook" {
		t.Errorf("cert-manager mode: inject-ca-from %q", got)
	}
	if cm.Find("Certificate", "clipjob-webhook") == nil || cm.Find("Certificate", "clipjob-relay") == nil || cm.Find("Issuer", "clipjob-ca") == nil {
		t.Error("cert-manager mode without its own issuer renders no CA and certificates")
	}
	issuer := render(t, valueSets["cert-manager with an issuer"])
	if issuer.Find("Issuer", "clipjob-ca") != nil {
		t.Error("an issuerRef given, the chart still made its own CA")
	}
	var cert cmv1.Certificate
	into(t, issuer, "Certificate", "clipjob-webhook", &cert)
	if cert.Spec.IssuerRef.Name != "corp-ca" || cert.Spec.IssuerRef.Kind != "ClusterIssuer" || cert.Spec.SecretName != "clipjob-webhook-tls" ||
		!slices.Contains(cert.Spec.DNSNames, "clipjob-webhook.clipjob-system.svc") {
		t.Errorf("webhook Certificate %+v", cert.Spec)
	}
}

// TestWebhookNamespacesNarrowEveryWebhook: webhook.namespaces, for a
// cluster with several releases, narrows every webhook to those
// namespaces, each still excluding the release's own and the excluded.
func TestWebhookNamespacesNarrowEveryWebhook(t *testing.T) {
	r := render(t, map[string]any{"webhook": map[string]any{"namespaces": []any{"team-a", "team-a-agents", "team-a"}}})
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	into(t, r, "MutatingWebhookConfiguration", "clipjob-mutating", &mwc)
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	into(t, r, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
	selectors := map[string]*metav1.LabelSelector{mwc.Webhooks[0].Name: mwc.Webhooks[0].NamespaceSelector}
	for _, w := range vwc.Webhooks {
		selectors[w.Name] = w.NamespaceSelector
	}
	want := []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"clipjob-system", "kube-system"}},
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{"team-a", "team-a-agents"}},
	}
	for name, sel := range selectors {
		if d := cmp.Diff(want, sel.MatchExpressions); d != "" {
			t.Errorf("%s: namespace selector (-want +got):\n%s", name, d)
		}
	}
	if len(selectors) != 4 {
		t.Errorf("%d webhooks, want 4", len(selectors))
	}
	// The webhook's controllers (claims, run Secrets) act in those
	// namespaces alone: another release's Jobs are not theirs to release.
	var dep appsv1.Deployment
	into(t, r, "Deployment", "clipjob-webhook", &dep)
	var flags []string
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--namespace=") {
			flags = append(flags, a)
		}
	}
	if d := cmp.Diff([]string{"--namespace=team-a", "--namespace=team-a-agents"}, flags); d != "" {
		t.Errorf("the webhook's --namespace flags (-want +got):\n%s", d)
	}
	// Without it, every namespace but the excluded.
	into(t, render(t, nil), "Deployment", "clipjob-webhook", &dep)
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--namespace=") {
			t.Errorf("without webhook.namespaces the webhook is narrowed: %s", a)
		}
	}
	into(t, render(t, nil), "MutatingWebhookConfiguration", "clipjob-mutating", &mwc)
	if n := len(mwc.Webhooks[0].NamespaceSelector.MatchExpressions); n != 1 {
		t.Errorf("the default selector has %d expressions, want the exclusion alone", n)
	}
}

// The claim Lease policy lets only the webhook's ServiceAccount write.
func TestClaimLeasePolicyNamesTheWebhook(t *testing.T) {
	r := render(t, nil)
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	into(t, r, "ValidatingAdmissionPolicy", "clipjob-claim-leases", &vap)
	if !strings.Contains(vap.Spec.Validations[0].Expression, "'system:serviceaccount:clipjob-system:clipjob-webhook'") {
		t.Errorf("validation %q does not name the webhook's ServiceAccount", vap.Spec.Validations[0].Expression)
	}
	if r := render(t, map[string]any{"claimLeasePolicy": map[string]any{"enabled": false}}); r.Find("ValidatingAdmissionPolicy", "clipjob-claim-leases") != nil {
		t.Error("claimLeasePolicy.enabled false still renders it")
	}
}

func TestRelay(t *testing.T) {
	r := render(t, valueSets["relay mirror"])
	var d appsv1.Deployment
	into(t, r, "Deployment", "clipjob-relay", &d)
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("relay: %d replicas, strategy %s; the store takes one writer", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	c := d.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--mirror-dir=/paperclip", "--token-audience=clipjob-relay", "--redact-values-file=/etc/clipjob-relay/redact", "--cert-dir=/tls"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("relay args %v lack %s", c.Args, want)
		}
	}
	sc := d.Spec.Template.Spec.SecurityContext
	if ptr.Deref(sc.RunAsUser, 0) != 1000 || ptr.Deref(sc.FSGroup, 0) != 1000 {
		t.Errorf("mirror on: runAsUser %v fsGroup %v, want Paperclip's 1000", sc.RunAsUser, sc.FSGroup)
	}
	claims := map[string]bool{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims[v.PersistentVolumeClaim.ClaimName] = true
		}
	}
	if !claims["clipjob-relay"] || !claims["paperclip-data"] {
		t.Errorf("relay volumes %v: want its store and Paperclip's volume", claims)
	}
	off := render(t, nil)
	into(t, off, "Deployment", "clipjob-relay", &d)
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "paperclip-data" {
			t.Error("mirror off, the relay still mounts Paperclip's volume")
		}
	}
	none := render(t, valueSets["no relay"])
	for _, o := range none.Objects {
		if strings.Contains(o.GetName(), "relay") {
			t.Errorf("relay disabled, still rendered %s %s", o.GetKind(), o.GetName())
		}
	}
}

func TestEgressPolicies(t *testing.T) {
	// The standard policy by default; none only when asked for.
	if r := render(t, map[string]any{"networkPolicy": map[string]any{"mode": "none"}}); r.Find("NetworkPolicy", "clipjob-agent-egress") != nil {
		t.Error("networkPolicy.mode none still renders an egress policy")
	}
	var np networkingv1.NetworkPolicy
	into(t, render(t, nil), "NetworkPolicy", "clipjob-agent-egress", &np)
	if np.Namespace != "paperclip" || np.Spec.PodSelector.MatchLabels["paperclip.io/role"] != "agent" || len(np.Spec.Egress) != 3 {
		t.Fatalf("standard policy %+v", np.Spec)
	}
	public := np.Spec.Egress[2]
	if public.To[0].IPBlock.CIDR != "0.0.0.0/0" || !slices.Contains(public.To[0].IPBlock.Except, "169.254.0.0/16") || public.Ports[0].Port.IntValue() != 443 {
		t.Errorf("public HTTPS rule %+v", public)
	}
	cilium := render(t, valueSets["cilium egress"])
	if cilium.Find("CiliumNetworkPolicy", "clipjob-agent-baseline") == nil {
		t.Fatal("no baseline cilium policy: agent pods of a profile without an FQDN list would have open egress")
	}
	anthropic := cilium.Find("CiliumNetworkPolicy", "clipjob-egress-anthropic")
	if anthropic == nil {
		t.Fatal("no cilium policy for the anthropic egress profile")
	}
	sel, _, _ := unstructured.NestedStringMap(anthropic.Object, "spec", "endpointSelector", "matchLabels")
	if sel["paperclip.io/egress-profile"] != "anthropic" || sel["paperclip.io/role"] != "agent" {
		t.Errorf("selector %v", sel)
	}
	egress, _, _ := unstructured.NestedSlice(anthropic.Object, "spec", "egress")
	fqdns := egress[0].(map[string]any)["toFQDNs"].([]any)
	if len(fqdns) != 5 || fqdns[0].(map[string]any)["matchName"] != "api.anthropic.com" {
		t.Errorf("anthropic FQDNs %v", fqdns)
	}
	// Every egress profile the built-in profiles use with an FQDN list has
	// its policy; the others get the baseline alone.
	cfg := config.Default()
	for _, name := range cfg.ProfileNames() {
		p, _ := cfg.Profile(name)
		if p.EgressProfile != "standard" && cilium.Find("CiliumNetworkPolicy", "clipjob-egress-"+p.EgressProfile) == nil {
			t.Errorf("profile %s: no cilium policy for egress profile %q", name, p.EgressProfile)
		}
	}
	// Several agent namespaces: each gets its policies.
	multi := render(t, map[string]any{"agentNamespaces": []any{"paperclip", "paperclip-acme"}, "networkPolicy": map[string]any{"mode": "standard"}})
	for _, ns := range []string{"paperclip", "paperclip-acme"} {
		found := false
		for _, o := range multi.Objects {
			found = found || (o.GetKind() == "NetworkPolicy" && o.GetNamespace() == ns)
		}
		if !found {
			t.Errorf("no egress NetworkPolicy in agent namespace %s", ns)
		}
	}
}

func TestManagedNamespaceEnforcesRestricted(t *testing.T) {
	var ns corev1.Namespace
	into(t, render(t, valueSets["managed namespace"]), "Namespace", "paperclip", &ns)
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" || ns.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("namespace %v %v", ns.Labels, ns.Annotations)
	}
}

func TestNotesNameTheDoctor(t *testing.T) {
	r := render(t, nil)
	if !strings.Contains(r.Notes, "clipjob doctor --namespace clipjob-system --release clipjob") {
		t.Errorf("NOTES.txt:\n%s", r.Notes)
	}
}

// TestTenantNamespacesGetTheirRole: every tenant namespace of the config
// gets the webhook's Role and counts as an agent namespace (admitted,
// covered by the claim Lease policy), with no hand-made Role; a glob,
// which no Role can name, is refused with the fix.
func TestTenantNamespacesGetTheirRole(t *testing.T) {
	r := render(t, map[string]any{"config": map[string]any{
		"source":           map[string]any{"namespace": "paperclip"},
		"tenantNamespaces": []any{"paperclip-co-1", "paperclip-co-2"},
	}})
	for _, ns := range []string{"paperclip", "paperclip-co-1", "paperclip-co-2"} {
		if r.FindIn("Role", ns, "clipjob-webhook-agents") == nil || r.FindIn("RoleBinding", ns, "clipjob-webhook-agents") == nil {
			t.Errorf("no webhook Role and binding in %s", ns)
		}
	}
	var cm corev1.ConfigMap
	into(t, r, "ConfigMap", "clipjob-config", &cm)
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"paperclip", "paperclip-co-1", "paperclip-co-2"}, cfg.Policy.Namespaces); d != "" {
		t.Errorf("tenant namespaces not admitted (-want +got):\n%s", d)
	}
	_, err = Render(rel, map[string]any{"config": map[string]any{"tenantNamespaces": []any{"paperclip-*"}}})
	if err == nil || !strings.Contains(err.Error(), `"paperclip-*" is a glob`) || !strings.Contains(err.Error(), "list each tenant namespace") {
		t.Errorf("a tenant glob: %v", err)
	}
}

// The CA bundle is published beside the Paperclip server (the source's
// namespace) by default, so an operator copies nothing by hand: the
// webhook is told which ConfigMap and may write that one ConfigMap there
// and nothing else of the namespace; turned off, or with certificates it
// does not manage, neither is there.
func TestCABundlePublishedBesideTheServer(t *testing.T) {
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{values: map[string]any{"config": map[string]any{"source": map[string]any{"namespace": "pc"}}}, want: "pc/clipjob-ca"},
		{values: map[string]any{"certificates": map[string]any{"publishCAConfigMap": "relay-ca"}}, want: "paperclip/relay-ca"},
		{values: map[string]any{"certificates": map[string]any{"publishCAConfigMap": ""}}},
		{values: map[string]any{"certificates": map[string]any{"mode": "certManager"}}},
	} {
		r := render(t, tc.values)
		var d appsv1.Deployment
		into(t, r, "Deployment", "clipjob-webhook", &d)
		var got []string
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--publish-ca-configmap="); ok {
				got = append(got, v)
			}
		}
		var roles []rbacv1.Role
		for _, o := range r.Objects {
			if o.GetKind() == "Role" && o.GetName() == "clipjob-webhook-ca-publish" {
				var role rbacv1.Role
				if err := Decode(o, &role); err != nil {
					t.Fatal(err)
				}
				roles = append(roles, role)
			}
		}
		if tc.want == "" {
			if len(got) != 0 || len(roles) != 0 {
				t.Errorf("%v: published %v with Roles %v; want none", tc.values, got, roles)
			}
			continue
		}
		if !slices.Equal(got, []string{tc.want}) {
			t.Errorf("%v: the webhook publishes %v; want %s", tc.values, got, tc.want)
		}
		ns, name, _ := strings.Cut(tc.want, "/")
		if len(roles) != 1 || roles[0].Namespace != ns {
			t.Fatalf("%v: Roles %+v; want one in %s", tc.values, roles, ns)
		}
		for _, rule := range roles[0].Rules {
			if !slices.Equal(rule.Resources, []string{"configmaps"}) {
				t.Errorf("%v: the publishing Role reaches %v", tc.values, rule.Resources)
			}
			// create cannot name what it creates; every other verb (list
			// and watch by a field selector on the name) names the one.
			if !slices.Equal(rule.Verbs, []string{"create"}) && !slices.Equal(rule.ResourceNames, []string{name}) {
				t.Errorf("%v: the publishing Role may %v ConfigMaps %v; want %s by name", tc.values, rule.Verbs, rule.ResourceNames, name)
			}
		}
		var binding rbacv1.RoleBinding
		into(t, r, "RoleBinding", "clipjob-webhook-ca-publish", &binding)
		if binding.Namespace != ns || binding.Subjects[0].Name != "clipjob-webhook" || binding.Subjects[0].Namespace != rel.Namespace {
			t.Errorf("%v: binding %+v", tc.values, binding)
		}
	}
}
