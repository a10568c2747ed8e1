package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
)

// An Install is clipjob installed for namespaces of its own, so tests in
// parallel on one control plane never judge, claim or start each other's
// runs: the example Paperclip (examples/paperclip.yaml) in Namespace, a
// webhook replica running examples/config.yaml with that Paperclip as its
// source and --namespace for each of its namespaces, the chart's Roles
// there, and the chart's webhook configurations and claim Lease policy
// under names of its own, narrowed to its namespaces. Narrowing is the
// one change to what the chart registers: two releases of the chart each
// admit agent Jobs only in their own namespaces and refuse the other's.
type Install struct {
	// Namespace holds the example Paperclip; agents run there.
	Namespace string
	// Namespaces are Namespace and the further ones it serves
	// (InstallOptions.Also).
	Namespaces []string
	// Webhook is the first replica.
	Webhook *Webhook
	// WebhookBin starts more replicas (StartReplica).
	WebhookBin string

	c     *cluster.Cluster
	wide  bool
	flags []string
	// extra are the replicas StartReplicas added.
	extra []*Webhook

	// sharedDir is where its relay mirrors runs (SharedDir).
	sharedDir string
	// volumeDir, on a real node, is the host directory the example
	// Paperclip's volume is (its NFS server does not exist).
	volumeDir string

	mu sync.Mutex
	// paperclip is what PaperclipServer set up, once.
	paperclip *AdapterSpec
	// relay is what Relay started, once.
	relay *installRelay
	// configFile is the config every replica starts with.
	configFile string
}

// InstallOptions say what an Install needs beyond the defaults.
type InstallOptions struct {
	// Namespace is where the example Paperclip goes (required).
	Namespace string
	// Also names further namespaces the install serves, each
	// <Namespace>-<suffix> (Namespaces[1:] in order): tenant namespaces,
	// if the config lists them so, or a neighbour a test acts from.
	Also []string
	// Config is YAML appended to examples/config.yaml (its source moved
	// to Namespace), e.g. "policy:\n  concurrency: {mode: Queue}\n".
	Config string
	// WebhookFlags go to every replica.
	WebhookFlags []string
	// NoWebhook installs everything but starts and registers no webhook,
	// for tests that register their own (Register*).
	NoWebhook bool
	// VolumeDir, on a real node, is the host directory the example
	// Paperclip's shared volume is (its NFS server does not exist).
	VolumeDir string
	// AsTheRelease registers the webhook configurations and the claim
	// Lease policy under the chart's own names for Release, for every
	// namespace, as an operator's install is (clipjob doctor checks those
	// names). A test with such an install must run alone.
	AsTheRelease bool
}

// NewInstall installs clipjob for o.Namespace with the webhook binary at
// bin (Build) and waits until the API server calls it.
func NewInstall(ctx context.Context, c *cluster.Cluster, bin string, o InstallOptions) (_ *Install, err error) {
	if o.Namespace == "" {
		return nil, errors.New("an install needs a namespace")
	}
	in := &Install{Namespace: o.Namespace, Namespaces: []string{o.Namespace}, WebhookBin: bin, c: c, wide: o.AsTheRelease}
	for _, suffix := range o.Also {
		in.Namespaces = append(in.Namespaces, o.Namespace+"-"+suffix)
	}
	for _, ns := range in.Namespaces {
		in.flags = append(in.flags, "--namespace", ns)
	}
	// The test's flags last: a flag given twice takes the last value.
	in.flags = append(append(in.flags, "--leader-election-namespace", o.Namespace), o.WebhookFlags...)
	defer func() {
		if err != nil {
			in.Stop(context.Background())
		}
	}()
	if o.VolumeDir != "" {
		if err := makeSharedDir(o.VolumeDir); err != nil {
			return nil, err
		}
		in.volumeDir, in.sharedDir = o.VolumeDir, o.VolumeDir
	}
	if err := in.applyPaperclip(ctx); err != nil {
		return nil, err
	}
	if err := applyChartRoles(ctx, c, o.Namespace, in.Namespaces); err != nil {
		return nil, err
	}
	if err := in.ApplyClaimLeasePolicy(ctx); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(Root(), "examples", "config.yaml"))
	if err != nil {
		return nil, err
	}
	config := strings.Replace(string(data), "  namespace: paperclip\n", "  namespace: "+o.Namespace+"\n", 1) + o.Config
	in.configFile = filepath.Join(c.Dir, in.name("config.yaml"))
	if err := os.WriteFile(in.configFile, []byte(config), 0o644); err != nil {
		return nil, err
	}
	if o.NoWebhook {
		return in, nil
	}
	if in.Webhook, err = in.StartReplica(ctx, in.name("webhook-0")); err != nil {
		return nil, err
	}
	if err := in.Register(ctx, RegisterOptions{}); err != nil {
		return nil, err
	}
	if err := in.waitCalled(ctx); err != nil {
		return nil, err
	}
	return in, nil
}

// name is a name of this install's own: its namespace's, suffixed.
func (in *Install) name(suffix string) string { return in.Namespace + "-" + suffix }

// MutatingWebhookName and ValidatingWebhookName are the install's webhook
// configurations.
func (in *Install) MutatingWebhookName() string   { return in.chartName(MutatingWebhookName) }
func (in *Install) ValidatingWebhookName() string { return in.chartName(ValidatingWebhookName) }

// chartName is what the chart names name for Release, prefixed by the
// namespace unless the install is AsTheRelease.
func (in *Install) chartName(name string) string {
	if in.wide {
		return name
	}
	return in.name(name)
}

// ApplyClaimLeasePolicy creates the install's copy of the chart's claim
// Lease policy, bound to its namespaces as the chart binds it to a
// release's agent namespaces.
func (in *Install) ApplyClaimLeasePolicy(ctx context.Context) error {
	return applyAdmissionPolicyAs(ctx, in.c.Clientset(), Release.Name+"-claim-leases", in.ClaimLeasePolicyName(),
		map[string]any{"agentNamespaces": toAny(in.Namespaces)}, nil)
}

// CABundlePolicyName names the install's copy of the chart's CA bundle
// policy (certificates.publishCAConfigMap) and its binding.
func (in *Install) CABundlePolicyName() string { return in.chartName(Release.Name + "-ca-bundle") }

// ApplyCABundlePolicy creates the install's copy of the chart's CA bundle
// policy, for the chart's ConfigMap in the install's namespace (its
// source's), as the chart binds it for self-managed certificates.
func (in *Install) ApplyCABundlePolicy(ctx context.Context) error {
	return applyAdmissionPolicyAs(ctx, in.c.Clientset(), Release.Name+"-ca-bundle", in.CABundlePolicyName(),
		map[string]any{"certificates": map[string]any{"mode": "selfManaged"}, "webhook": map[string]any{}, "config": map[string]any{"source": map[string]any{"namespace": in.Namespace}}}, nil)
}

// AgentRunsPolicyName names the install's copy of the chart's agent-runs
// policy (compiledPolicies.enabled) and its binding.
func (in *Install) AgentRunsPolicyName() string { return in.chartName(AgentRunsPolicy) }

// ApplyAgentRunsPolicy creates the install's copy of the chart's
// agent-runs policy, bound to its namespaces (unless AsTheRelease).
func (in *Install) ApplyAgentRunsPolicy(ctx context.Context) error {
	return applyAdmissionPolicyAs(ctx, in.c.Clientset(), AgentRunsPolicy, in.AgentRunsPolicyName(), CompiledPoliciesValues,
		func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			if in.wide {
				return
			}
			if b.Spec.MatchResources == nil {
				b.Spec.MatchResources = &admissionregistrationv1.MatchResources{}
			}
			in.narrow(&b.Spec.MatchResources.NamespaceSelector)
		})
}

// DeleteAgentRunsPolicy deletes the install's agent-runs policy.
func (in *Install) DeleteAgentRunsPolicy(ctx context.Context) error {
	return deleteAdmissionPolicy(ctx, in.c.Clientset(), in.AgentRunsPolicyName())
}

// narrow limits a namespace selector to the install's namespaces.
func (in *Install) narrow(sel **metav1.LabelSelector) {
	if *sel == nil {
		*sel = &metav1.LabelSelector{}
	}
	(*sel).MatchExpressions = append((*sel).MatchExpressions, metav1.LabelSelectorRequirement{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: in.Namespaces})
}

// WaitElection waits until a replica of the install holds the claim
// controller's election Lease in namespace.
func (in *Install) WaitElection(ctx context.Context, t testing.TB, namespace string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := in.CS().CoordinationV1().Leases(namespace).Get(ctx, "clipjob-claim-controller", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	})
	if err != nil {
		t.Fatalf("no replica of %s took the election Lease in %s", in.Namespace, namespace)
	}
}

// ClaimLeasePolicyName names the install's copy of the chart's claim
// Lease policy and its binding.
func (in *Install) ClaimLeasePolicyName() string { return in.chartName(Release.Name + "-claim-leases") }

// StartReplica starts another webhook replica of the install with its
// flags (plus extra) and the config the first replica serves now, as
// replicas of a Deployment share one ConfigMap.
func (in *Install) StartReplica(ctx context.Context, name string, extra ...string) (*Webhook, error) {
	config := in.configFile
	if in.Webhook != nil {
		config = in.Webhook.ConfigFile
	}
	return StartWebhook(ctx, in.c, in.WebhookBin, name, config, append(append([]string{}, in.flags...), extra...)...)
}

// RegisterOptions change what Register points the API server at.
type RegisterOptions struct {
	// Addr serves both webhooks; default the first replica's.
	Addr string
	// MutatingAddr serves the mutating webhook alone (e.g. a dead port);
	// default Addr.
	MutatingAddr string
	// MutatingFailure is the mutating webhook's failure policy; default
	// Fail, as the chart's.
	MutatingFailure admissionregistrationv1.FailurePolicyType
	// Values are chart values over the suite's (e.g. compiledPolicies).
	Values map[string]any
	// CABundle the API server trusts the webhooks with; default the
	// cluster's CA, which signed them.
	CABundle []byte
}

// Register (re)registers the install's webhook configurations, as the
// chart renders them with o.Values, narrowed to its namespaces. The API
// server's webhook cache follows within moments.
func (in *Install) Register(ctx context.Context, o RegisterOptions) error {
	if o.Addr == "" {
		if in.Webhook == nil {
			return errors.New("register: no address and no replica")
		}
		o.Addr = in.Webhook.Addr
	}
	if o.MutatingAddr == "" {
		o.MutatingAddr = o.Addr
	}
	if o.CABundle == nil {
		o.CABundle = in.c.CA.CertPEM
	}
	if o.MutatingFailure == "" {
		o.MutatingFailure = admissionregistrationv1.Fail
	}
	values := map[string]any{"agentNamespaces": toAny(in.Namespaces)}
	for k, v := range o.Values {
		values[k] = v
	}
	err := registerAs(ctx, in.c.Clientset(), registration{mutatingAddr: o.MutatingAddr, addr: o.Addr, caBundle: o.CABundle,
		mutatingFailure: o.MutatingFailure, values: values,
		mutatingName: in.MutatingWebhookName(), validatingName: in.ValidatingWebhookName(),
		edit: func(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration) {
			if in.wide {
				return
			}
			for i := range m.Webhooks {
				in.narrow(&m.Webhooks[i].NamespaceSelector)
			}
			for i := range v.Webhooks {
				in.narrow(&v.Webhooks[i].NamespaceSelector)
			}
		}})
	if err != nil {
		return fmt.Errorf("registering the webhooks of %s: %w", in.Namespace, err)
	}
	return nil
}

// waitCalled waits until the API server's webhook cache holds the
// install's webhooks: examples/bare-job.yaml, created as a dry run, comes
// back completed (the mutating webhook's template hash set) and admitted.
func (in *Install) waitCalled(ctx context.Context) error {
	set, err := readExample("examples/bare-job.yaml")
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		job := set.Jobs[0].DeepCopy()
		job.Namespace = in.Namespace
		var got *batchv1.Job
		got, last = in.c.Clientset().BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if last != nil {
			return false, nil
		}
		_, done := got.Annotations[contract.AnnotationTemplateHash]
		return done, nil
	})
	if err != nil {
		return fmt.Errorf("the API server never called the webhooks of %s (last answer: %v)", in.Namespace, last)
	}
	return nil
}

// applyPaperclip creates the namespaces and the example Paperclip in
// Namespace.
func (in *Install) applyPaperclip(ctx context.Context) error {
	cs := in.c.Clientset()
	for _, ns := range in.Namespaces {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	set, err := readExample("examples/paperclip.yaml")
	if err != nil {
		return err
	}
	cl, err := client.New(in.c.Config, client.Options{})
	if err != nil {
		return err
	}
	// The example's volume is named for the install, so its claim binds
	// (the scheduler waits for a bound claim; on kwok nothing mounts it).
	volume := in.name("data")
	var objs []client.Object
	for _, o := range set.Others {
		switch obj := o.(type) {
		case *corev1.Namespace:
			continue
		case *corev1.PersistentVolume:
			obj.Name, obj.Spec.ClaimRef.Namespace = volume, in.Namespace
			if in.volumeDir != "" {
				obj.Spec.PersistentVolumeSource = HostPathVolume(volume, in.volumeDir, corev1.ReadWriteMany, in.Namespace, obj.Spec.ClaimRef.Name).Spec.PersistentVolumeSource
			}
		case *corev1.PersistentVolumeClaim:
			obj.Namespace, obj.Spec.VolumeName = in.Namespace, volume
		case client.Object:
			obj.SetNamespace(in.Namespace)
		}
		objs = append(objs, o.(client.Object))
	}
	for _, d := range set.Deployments {
		d.Namespace = in.Namespace
		objs = append(objs, d)
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return waitDefaultServiceAccount(ctx, cs, in.Namespace)
}

// waitDefaultServiceAccount waits for namespace's default ServiceAccount:
// pods are refused until the controller manager has made it, and a test
// must not race it.
func waitDefaultServiceAccount(ctx context.Context, cs kubernetes.Interface, namespace string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("namespace %s never got its default ServiceAccount", namespace)
	}
	return nil
}

// Stop stops the install's replicas and deletes its cluster-scoped
// objects (webhook configurations, claim Lease policy), so the API server
// calls nobody for its namespaces any more.
func (in *Install) Stop(ctx context.Context) {
	for _, w := range append([]*Webhook{in.Webhook}, in.extra...) {
		if w != nil {
			w.Stop()
		}
	}
	if in.relay != nil {
		in.relay.r.Stop()
	}
	ar := in.c.Clientset().AdmissionregistrationV1()
	_ = ar.MutatingWebhookConfigurations().Delete(ctx, in.MutatingWebhookName(), metav1.DeleteOptions{})
	_ = ar.ValidatingWebhookConfigurations().Delete(ctx, in.ValidatingWebhookName(), metav1.DeleteOptions{})
	_ = deleteAdmissionPolicy(ctx, in.c.Clientset(), in.ClaimLeasePolicyName())
	_ = deleteAdmissionPolicy(ctx, in.c.Clientset(), in.CABundlePolicyName())
	_ = in.DeleteAgentRunsPolicy(ctx)
	_ = in.c.Clientset().CoreV1().PersistentVolumes().Delete(ctx, in.name("data"), metav1.DeleteOptions{})
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// DeleteCompiledPolicies deletes the compiled MutatingAdmissionPolicy of
// the install's namespace and its binding, whoever wrote them.
func (in *Install) DeleteCompiledPolicies(ctx context.Context) error {
	ar := in.c.Clientset().AdmissionregistrationV1()
	name := compile.PolicyName(in.Namespace)
	if err := ar.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := ar.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// SharedDir is where the install's relays mirror runs to: the agents'
// volume, on kwok a directory of the install's own.
func (in *Install) SharedDir() string {
	if in.sharedDir != "" {
		return in.sharedDir
	}
	return filepath.Join(in.Dir(), "shared")
}
