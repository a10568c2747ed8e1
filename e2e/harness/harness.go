// Package harness installs clipjob into a local cluster (package cluster)
// the way the Helm chart would into a real one: it builds and runs the
// webhook binary with a serving certificate from the cluster's CA, applies
// the example Paperclip install, and registers the webhook configuration.
// The e2e suite and the demo both use it.
package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/webhook"
)

// Root is the repository root.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Build compiles a command of this module (e.g. "clipjob-webhook") into dir.
func Build(dir, command string) (string, error) {
	out := filepath.Join(dir, command)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+command)
	cmd.Dir = Root()
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w", command, err)
	}
	return out, nil
}

// Install is the whole local installation: the example Paperclip
// (examples/paperclip.yaml), the clipjob-webhook binary built from this
// checkout, one replica named name running examples/config.yaml, and both
// webhook configurations pointing at it. It returns the replica and the
// binary (to start more replicas).
func Install(ctx context.Context, c *cluster.Cluster, name string) (*Webhook, string, error) {
	if err := Apply(ctx, c, "examples/paperclip.yaml"); err != nil {
		return nil, "", fmt.Errorf("installing the example Paperclip: %w", err)
	}
	bin, err := Build(c.Dir, "clipjob-webhook")
	if err != nil {
		return nil, "", err
	}
	wh, err := StartWebhook(ctx, c, bin, name, filepath.Join(Root(), "examples", "config.yaml"))
	if err != nil {
		return nil, "", err
	}
	if err := Register(ctx, c.Clientset(), wh.Addr, c.CA.CertPEM); err != nil {
		wh.Stop()
		return nil, "", fmt.Errorf("registering the webhooks: %w", err)
	}
	return wh, bin, nil
}

// SystemNamespace is where clipjob's own ServiceAccounts and its
// leader-election Lease live, as the chart's release namespace would be.
const SystemNamespace = "clipjob-system"

// Webhook is a running clipjob-webhook process.
type Webhook struct {
	*Process
	// Addr is host:port of the TLS admission endpoint.
	Addr string
	// MetricsAddr serves /metrics and /configz.
	MetricsAddr string
	// ConfigFile is the config it watches; rewrite it to reconfigure.
	ConfigFile string
	// CertDir holds tls.crt and tls.key; replace them to rotate.
	CertDir string
}

// StartWebhook runs the binary at bin against c with the config at
// configFile copied into a directory of its own, and waits until ready.
func StartWebhook(ctx context.Context, c *cluster.Cluster, bin, name, configFile string) (*Webhook, error) {
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	kp, err := c.CA.Serving("clipjob-webhook", "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	if err := kp.WriteTLS(certDir); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(configFile)
	if err != nil {
		return nil, err
	}
	w := &Webhook{ConfigFile: filepath.Join(dir, "config.yaml"), CertDir: certDir}
	if err := os.WriteFile(w.ConfigFile, data, 0o644); err != nil {
		return nil, err
	}
	ports, err := cluster.FreePorts(3)
	if err != nil {
		return nil, err
	}
	w.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	probe := fmt.Sprintf("127.0.0.1:%d", ports[1])
	w.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
	kubeconfig, err := ServiceAccountKubeconfig(ctx, c, SystemNamespace, "clipjob-webhook", WebhookRules)
	if err != nil {
		return nil, err
	}
	w.Process, err = StartProcess(ctx, filepath.Join(dir, "webhook.log"), probe, bin,
		"--config", w.ConfigFile, "--config-poll-interval", "200ms",
		"--cert-dir", certDir, "--host", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--health-probe-bind-address", probe, "--metrics-bind-address", w.MetricsAddr,
		"--kubeconfig", kubeconfig, "--leader-election-namespace", SystemNamespace)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Get fetches a path from the webhook's metrics server (/metrics, /configz).
func (w *Webhook) Get(path string) (string, error) { return httpGet(w.MetricsAddr, path) }

// Counter sums the samples of a Prometheus counter whose line starts with
// prefix and contains every one of match.
func (w *Webhook) Counter(prefix string, match ...string) (float64, error) {
	return scrapeCounter(w.MetricsAddr, prefix, match...)
}

func httpGet(addr, path string) (string, error) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func scrapeCounter(addr, prefix string, match ...string) (float64, error) {
	body, err := httpGet(addr, "/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
lines:
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue lines
			}
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// Apply creates every object of a manifest file under examples/ (or an
// absolute path), leaving existing ones alone.
func Apply(ctx context.Context, c *cluster.Cluster, file string) error {
	if !filepath.IsAbs(file) {
		file = filepath.Join(Root(), file)
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	set, err := manifest.Read(f)
	if err != nil {
		return err
	}
	cl, err := client.New(c.Config, client.Options{})
	if err != nil {
		return err
	}
	var objs []client.Object
	for _, o := range set.Others {
		objs = append(objs, o.(client.Object))
	}
	for _, d := range set.Deployments {
		objs = append(objs, d)
	}
	for _, j := range set.Jobs {
		objs = append(objs, j)
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// Names of the registered configurations.
const (
	MutatingWebhookName   = "clipjob-mutating"
	ValidatingWebhookName = "clipjob-validating"
)

// Register registers the webhooks at addr as the chart does, outside
// kube-system, failing closed. Mutation of Jobs labeled as agent runs on
// CREATE, reinvoked if another webhook changes the Job. Validation of every
// Job and Pod that carries a paperclip.io/ label, on itself or its pods,
// selected by matchConditions (CEL evaluated in the API server, so other
// Jobs and Pods cost nothing and never wait on clipjob); on UPDATE only
// when something clipjob checks changes, so a Job's deletion never does.
// Side effects (the claim) are skipped on dry run. Existing configurations
// are replaced, so tests can re-point them.
func Register(ctx context.Context, cs kubernetes.Interface, addr string, caBundle []byte) error {
	return RegisterWithMutatingAt(ctx, cs, addr, addr, caBundle, admissionregistrationv1.Fail)
}

// paperclipLabel is true when the labels map at path has a paperclip.io/
// key (CEL; has() guards a map the object may not have).
func paperclipLabel(path string) string {
	return "(has(" + path + ") && " + path + ".exists(k, k.startsWith('" + contract.Prefix + "')))"
}

// JobMatchConditions select the Jobs clipjob validates: every Job with a
// paperclip.io/ label on itself, its pods, or (on UPDATE) its stored
// version; and on UPDATE only if a field clipjob checks changes, so the
// garbage collector's and other controllers' updates (finalizers, status
// of deletion) never depend on clipjob being up.
var JobMatchConditions = []admissionregistrationv1.MatchCondition{{
	Name: "carries-paperclip-labels",
	Expression: paperclipLabel("object.metadata.labels") + " || " +
		"(has(object.spec.template.metadata) && " + paperclipLabel("object.spec.template.metadata.labels") + ") || " +
		"(oldObject != null && " + paperclipLabel("oldObject.metadata.labels") + ")",
}, {
	Name: "changes-what-clipjob-checks",
	Expression: "request.operation != 'UPDATE'" +
		" || has(object.metadata.labels) != has(oldObject.metadata.labels)" +
		" || (has(object.metadata.labels) && object.metadata.labels != oldObject.metadata.labels)" +
		" || object.spec.template != oldObject.spec.template" +
		optionalChanged("suspend", "false") + optionalChanged("parallelism", "1") + optionalChanged("completions", "1") +
		optionalChanged("podReplacementPolicy", "''") + optionalChanged("manualSelector", "false"),
}}

// optionalChanged is a CEL term true when spec.field differs between the
// object and the stored one, an absent field counting as def.
func optionalChanged(field, def string) string {
	v := func(o string) string {
		return "(has(" + o + ".spec." + field + ") ? " + o + ".spec." + field + " : " + def + ")"
	}
	return " || " + v("object") + " != " + v("oldObject")
}

// PodMatchConditions select the pods clipjob validates: those with a
// paperclip.io/ label.
var PodMatchConditions = []admissionregistrationv1.MatchCondition{{
	Name: "carries-paperclip-labels", Expression: paperclipLabel("object.metadata.labels"),
}}

// RegisterWithMutatingAt is Register with the mutating webhook at its own
// address and failure policy (tests point it at a dead port to see the
// validating webhook hold the line alone).
func RegisterWithMutatingAt(ctx context.Context, cs kubernetes.Interface, mutatingAddr, addr string, caBundle []byte, mutatingFailure admissionregistrationv1.FailurePolicyType) error {
	objectSelector := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: contract.LabelAgentID, Operator: metav1.LabelSelectorOpExists}}}
	nsSelector := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}}
	rule := func(ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"},
				Resources: []string{"jobs"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
		}}
	}
	client := func(addr, path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + addr + path), CABundle: caBundle}
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: MutatingWebhookName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "mutate.jobs.clipjob.paperclip.io",
			ClientConfig:            client(mutatingAddr, webhook.MutatePath),
			Rules:                   rule(admissionregistrationv1.Create),
			ObjectSelector:          objectSelector,
			NamespaceSelector:       nsSelector,
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(mutatingFailure),
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ValidatingWebhookName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "validate.jobs.clipjob.paperclip.io",
			ClientConfig:            client(addr, webhook.ValidatePath),
			Rules:                   rule(admissionregistrationv1.Create, admissionregistrationv1.Update),
			MatchConditions:         JobMatchConditions,
			NamespaceSelector:       nsSelector,
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](10),
			AdmissionReviewVersions: []string{"v1"},
		}, {
			Name:         "validate.pods.clipjob.paperclip.io",
			ClientConfig: client(addr, webhook.PodPath),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
					Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
			}, {
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
					Resources: []string{"pods/ephemeralcontainers"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
			}},
			MatchConditions:         PodMatchConditions,
			NamespaceSelector:       nsSelector,
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	// Update in place: deleting and recreating would leave the API server
	// a moment with no webhook at all, admitting whatever comes then.
	mwcs := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if old, err := mwcs.Get(ctx, mwc.Name, metav1.GetOptions{}); err == nil {
		mwc.ResourceVersion = old.ResourceVersion
		_, err = mwcs.Update(ctx, mwc, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
	} else if _, err := mwcs.Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		return err
	}
	vwcs := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if old, err := vwcs.Get(ctx, vwc.Name, metav1.GetOptions{}); err == nil {
		vwc.ResourceVersion = old.ResourceVersion
		_, err = vwcs.Update(ctx, vwc, metav1.UpdateOptions{})
		return err
	}
	_, err := vwcs.Create(ctx, vwc, metav1.CreateOptions{})
	return err
}
