package harness

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/e2e/cluster"
)

// The suite installs clipjob from its chart: the binaries run with the
// chart's RBAC, and the API server calls them through the chart's webhook
// configurations, pointed at the host (webhook.url, the chart's switch for
// development). What the suite passes, the chart ships.

// Release is the chart release the suite installs.
var Release = charts.Release{Name: "clipjob", Namespace: SystemNamespace}

// Names of the chart's webhook configurations for Release.
const (
	MutatingWebhookName   = "clipjob-mutating"
	ValidatingWebhookName = "clipjob-validating"
)

// AgentNamespaces are where the suite runs agents: the example Paperclip's
// namespace, and a tenant namespace apart from it.
var AgentNamespaces = []any{"paperclip", "paperclip-acme"}

// TenantNamespaces are where the suite runs the Kubernetes plugin's Jobs:
// listed in the config only, so the chart alone gives the webhook its
// rights there.
var TenantNamespaces = []any{"paperclip-co-1"}

// ChartValues are the values the suite installs the chart with: the
// webhooks called at addr, certificates signed by the CA caBundle (PEM).
func ChartValues(addr string, caBundle []byte) map[string]any {
	return map[string]any{
		"agentNamespaces": AgentNamespaces,
		"config":          map[string]any{"tenantNamespaces": TenantNamespaces},
		"webhook":         map[string]any{"url": "https://" + addr},
		"certificates":    map[string]any{"mode": "external", "caBundle": base64.StdEncoding.EncodeToString(caBundle)},
	}
}

// RenderChart renders the chart for Release with ChartValues and values
// over them.
func RenderChart(addr string, caBundle []byte, values map[string]any) (*charts.Rendered, error) {
	v := ChartValues(addr, caBundle)
	for k, val := range values {
		v[k] = val
	}
	return charts.Render(Release, v)
}

// ApplyChartRBAC creates the release namespace and the chart's
// ServiceAccounts, Roles, ClusterRoles and their bindings, as rendered for
// self-managed certificates (the chart's default, whose RBAC is the
// widest). What exists already is left alone.
func ApplyChartRBAC(ctx context.Context, cs kubernetes.Interface) error {
	return applyChartRBAC(ctx, cs, AgentNamespaces, TenantNamespaces, "", false)
}

// applyChartRoles is ApplyChartRBAC for a further release with its source
// in source and agents in namespaces: its Roles and RoleBindings there,
// for the suite's ServiceAccounts (the cluster-wide part is the suite's
// already).
func applyChartRoles(ctx context.Context, c *cluster.Cluster, source string, namespaces []string) error {
	if err := applyChartRBACOnce(ctx, c); err != nil {
		return err
	}
	return applyChartRBAC(ctx, c.Clientset(), toAny(namespaces), nil, source, true)
}

// chartRBACApplied holds the clusters ApplyChartRBAC has been applied to
// by applyChartRBACOnce: every install and relay start asks for it, and
// nothing deletes it, so asking again only met conflicts (3,700 refused
// creates in a run of the integration tier).
var chartRBACApplied struct {
	sync.Mutex
	done map[*cluster.Cluster]bool
}

func applyChartRBACOnce(ctx context.Context, c *cluster.Cluster) error {
	chartRBACApplied.Lock()
	defer chartRBACApplied.Unlock()
	if chartRBACApplied.done[c] {
		return nil
	}
	if err := ApplyChartRBAC(ctx, c.Clientset()); err != nil {
		return err
	}
	if chartRBACApplied.done == nil {
		chartRBACApplied.done = map[*cluster.Cluster]bool{}
	}
	chartRBACApplied.done[c] = true
	return nil
}

func applyChartRBAC(ctx context.Context, cs kubernetes.Interface, agentNamespaces, tenantNamespaces []any, source string, rolesOnly bool) error {
	for _, ns := range append(append([]any{Release.Namespace}, agentNamespaces...), tenantNamespaces...) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.(string)}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	values := map[string]any{"agentNamespaces": agentNamespaces}
	config := map[string]any{}
	if tenantNamespaces != nil {
		config["tenantNamespaces"] = tenantNamespaces
	}
	if source != "" {
		config["source"] = map[string]any{"namespace": source}
	}
	values["config"] = config
	r, err := charts.Render(Release, values)
	if err != nil {
		return err
	}
	for _, o := range r.Objects {
		if rolesOnly && o.GetKind() != "Role" && o.GetKind() != "RoleBinding" {
			continue
		}
		if rolesOnly && o.GetNamespace() == Release.Namespace {
			continue
		}
		var create func() error
		switch o.GetKind() {
		case "ServiceAccount":
			var v corev1.ServiceAccount
			create = func() error {
				_, err := cs.CoreV1().ServiceAccounts(v.Namespace).Create(ctx, &v, metav1.CreateOptions{})
				return err
			}
			err = charts.Decode(o, &v)
		case "ClusterRole":
			var v rbacv1.ClusterRole
			create = func() error { _, err := cs.RbacV1().ClusterRoles().Create(ctx, &v, metav1.CreateOptions{}); return err }
			err = charts.Decode(o, &v)
		case "ClusterRoleBinding":
			var v rbacv1.ClusterRoleBinding
			create = func() error {
				_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &v, metav1.CreateOptions{})
				return err
			}
			err = charts.Decode(o, &v)
		case "Role":
			var v rbacv1.Role
			create = func() error {
				_, err := cs.RbacV1().Roles(v.Namespace).Create(ctx, &v, metav1.CreateOptions{})
				return err
			}
			err = charts.Decode(o, &v)
		case "RoleBinding":
			var v rbacv1.RoleBinding
			create = func() error {
				_, err := cs.RbacV1().RoleBindings(v.Namespace).Create(ctx, &v, metav1.CreateOptions{})
				return err
			}
			err = charts.Decode(o, &v)
		default:
			continue
		}
		if err != nil {
			return err
		}
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the chart's %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// Register registers the chart's webhook configurations with the webhooks
// at addr, failing closed. Existing configurations are replaced in place,
// so tests can re-point them.
func Register(ctx context.Context, cs kubernetes.Interface, addr string, caBundle []byte) error {
	return register(ctx, cs, addr, addr, caBundle, admissionregistrationv1.Fail, nil)
}

// CompiledPoliciesValues are the chart values of compiledPolicies.enabled;
// CompiledPoliciesQueueValues add a config in Queue mode, whose queued
// runs' CREATE the validating webhook is not called for.
var (
	CompiledPoliciesValues      = map[string]any{"compiledPolicies": map[string]any{"enabled": true}}
	CompiledPoliciesQueueValues = map[string]any{"compiledPolicies": map[string]any{"enabled": true},
		"config": map[string]any{"policy": map[string]any{"concurrency": map[string]any{"mode": "Queue"}}}}
)

// RegisterForCompiledPolicies is Register as the chart registers the
// webhooks with compiledPolicies.enabled: the mutating webhook is not
// called for a Job a compiled policy completed.
func RegisterForCompiledPolicies(ctx context.Context, cs kubernetes.Interface, addr string, caBundle []byte) error {
	return register(ctx, cs, addr, addr, caBundle, admissionregistrationv1.Fail, map[string]any{"compiledPolicies": map[string]any{"enabled": true}})
}

// RegisterForCompiledPoliciesInQueueMode is RegisterForCompiledPolicies
// for a release whose config is in Queue mode: the validating webhook is
// not called for the CREATE of a queued run clipjob completed (design
// (b): it judges the run when it starts).
func RegisterForCompiledPoliciesInQueueMode(ctx context.Context, cs kubernetes.Interface, addr string, caBundle []byte) error {
	return register(ctx, cs, addr, addr, caBundle, admissionregistrationv1.Fail, map[string]any{"compiledPolicies": map[string]any{"enabled": true},
		"config": map[string]any{"tenantNamespaces": TenantNamespaces, "policy": map[string]any{"concurrency": map[string]any{"mode": "Queue"}}}})
}

// registration is what register writes: the chart's webhook
// configurations rendered with values, under their names or others, with
// edit applied last.
type registration struct {
	mutatingAddr, addr           string
	caBundle                     []byte
	mutatingFailure              admissionregistrationv1.FailurePolicyType
	values                       map[string]any
	mutatingName, validatingName string
	edit                         func(*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration)
}

func register(ctx context.Context, cs kubernetes.Interface, mutatingAddr, addr string, caBundle []byte, mutatingFailure admissionregistrationv1.FailurePolicyType, values map[string]any) error {
	return registerAs(ctx, cs, registration{mutatingAddr: mutatingAddr, addr: addr, caBundle: caBundle, mutatingFailure: mutatingFailure, values: values})
}

func registerAs(ctx context.Context, cs kubernetes.Interface, reg registration) error {
	r, err := RenderChart(reg.addr, reg.caBundle, reg.values)
	if err != nil {
		return err
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := r.Into("MutatingWebhookConfiguration", MutatingWebhookName, &mwc); err != nil {
		return err
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := r.Into("ValidatingWebhookConfiguration", ValidatingWebhookName, &vwc); err != nil {
		return err
	}
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		w.ClientConfig.URL = ptr.To("https://" + reg.mutatingAddr + "/mutate-batch-v1-job")
		w.FailurePolicy = ptr.To(reg.mutatingFailure)
	}
	if reg.mutatingName != "" {
		mwc.Name = reg.mutatingName
	}
	if reg.validatingName != "" {
		vwc.Name = reg.validatingName
	}
	if reg.edit != nil {
		reg.edit(&mwc, &vwc)
	}
	// Update in place: deleting and recreating would leave the API server
	// a moment with no webhook at all, admitting whatever comes then.
	mwcs := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if old, err := mwcs.Get(ctx, mwc.Name, metav1.GetOptions{}); err == nil {
		mwc.ResourceVersion = old.ResourceVersion
		if _, err := mwcs.Update(ctx, &mwc, metav1.UpdateOptions{}); err != nil {
			return err
		}
	} else if _, err := mwcs.Create(ctx, &mwc, metav1.CreateOptions{}); err != nil {
		return err
	}
	vwcs := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if old, err := vwcs.Get(ctx, vwc.Name, metav1.GetOptions{}); err == nil {
		vwc.ResourceVersion = old.ResourceVersion
		_, err = vwcs.Update(ctx, &vwc, metav1.UpdateOptions{})
		return err
	}
	_, err = vwcs.Create(ctx, &vwc, metav1.CreateOptions{})
	return err
}

// DeleteCompiledPolicies deletes clipjob's compiled MutatingAdmissionPolicies
// and their bindings (by their managed-by label), whoever wrote them.
func DeleteCompiledPolicies(ctx context.Context, cs kubernetes.Interface) error {
	ar := cs.AdmissionregistrationV1()
	by := metav1.DeleteOptions{}
	sel := metav1.ListOptions{LabelSelector: compile.ManagedByLabel + "=" + compile.ManagedBy}
	if err := ar.MutatingAdmissionPolicyBindings().DeleteCollection(ctx, by, sel); err != nil {
		return err
	}
	return ar.MutatingAdmissionPolicies().DeleteCollection(ctx, by, sel)
}

// ApplyClaimLeasePolicy creates the chart's ValidatingAdmissionPolicy and
// its binding, which let only clipjob's webhook write claim Leases.
func ApplyClaimLeasePolicy(ctx context.Context, cs kubernetes.Interface) error {
	return applyAdmissionPolicy(ctx, cs, Release.Name+"-claim-leases", nil)
}

// AgentRunsPolicy is the chart's ValidatingAdmissionPolicy (and binding)
// of compiledPolicies.enabled: created-by is the creating user's, and only
// clipjob's webhook account starts a queued run.
var AgentRunsPolicy = Release.Name + "-agent-runs"

// ApplyAgentRunsPolicy creates AgentRunsPolicy as the chart renders it.
func ApplyAgentRunsPolicy(ctx context.Context, cs kubernetes.Interface) error {
	return applyAdmissionPolicy(ctx, cs, AgentRunsPolicy, map[string]any{"compiledPolicies": map[string]any{"enabled": true}})
}

// DeleteAgentRunsPolicy deletes AgentRunsPolicy and its binding.
func DeleteAgentRunsPolicy(ctx context.Context, cs kubernetes.Interface) error {
	return deleteAdmissionPolicy(ctx, cs, AgentRunsPolicy)
}

func deleteAdmissionPolicy(ctx context.Context, cs kubernetes.Interface, name string) error {
	ar := cs.AdmissionregistrationV1()
	if err := ar.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := ar.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// applyAdmissionPolicy creates the chart's ValidatingAdmissionPolicy name
// and its binding of that name, as rendered with values.
func applyAdmissionPolicy(ctx context.Context, cs kubernetes.Interface, name string, values map[string]any) error {
	return applyAdmissionPolicyAs(ctx, cs, name, name, values, nil)
}

// applyAdmissionPolicyAs is applyAdmissionPolicy under another name (the
// binding naming the policy by it), for a second release's copy.
func applyAdmissionPolicyAs(ctx context.Context, cs kubernetes.Interface, name, as string, values map[string]any, edit func(*admissionregistrationv1.ValidatingAdmissionPolicyBinding)) error {
	r, err := RenderChart("localhost", []byte("only the webhook configurations use it"), values)
	if err != nil {
		return err
	}
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	if err := r.Into("ValidatingAdmissionPolicy", name, &vap); err != nil {
		return err
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := r.Into("ValidatingAdmissionPolicyBinding", name, &binding); err != nil {
		return err
	}
	vap.Name, binding.Name, binding.Spec.PolicyName = as, as, as
	if edit != nil {
		edit(&binding)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &vap, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("admission policy %s: %w", as, err)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("admission policy binding %s: %w", as, err)
	}
	return nil
}
