// Package doctor checks a live clipjob install the way an operator would by
// hand, and says how to fix each thing that is wrong: the webhook
// configurations and the CA bundle that must trust the served certificate,
// the certificate's days left, the source Deployment and its shared PVC,
// the RBAC each binary needs (read from the chart itself), the relay, and a
// server-side dry run of a bare Job that must come back mutated. `clipjob
// doctor` prints the result; the chart's NOTES point there.
package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/templates"
)

// Result is one check: what was checked, whether it passed, what was seen,
// and for a failure how to fix it.
type Result struct {
	Check string `json:"check"`
	OK    bool   `json:"ok"`
	// Warning: passed, but with a risk the detail names.
	Warning bool   `json:"warning,omitempty"`
	Detail  string `json:"detail"`
	Fix     string `json:"fix,omitempty"`
}

// Options say which install to check.
type Options struct {
	Release charts.Release
	// Values the release was installed with (nil: the chart's defaults);
	// the expected RBAC and names are rendered from them.
	Values map[string]any
	// Config, when set, is the clipjob config in force; nil reads it from
	// the release's ConfigMap.
	Config *config.Config
	// RelayURL reaches the relay's API directly; empty goes through the
	// API server's service proxy to the release's relay Service.
	RelayURL string
	// Now is the time certificates are judged at. Default time.Now.
	Now func() time.Time
}

// Run checks the install and returns every result, failures included; it
// stops early only where a later check needs what failed.
func Run(ctx context.Context, cs kubernetes.Interface, o Options) []Result {
	if o.Now == nil {
		o.Now = time.Now
	}
	d := &doctor{cs: cs, o: o}
	rendered, err := charts.Render(o.Release, o.Values)
	if err != nil {
		return []Result{fail("chart", "cannot render the chart for these values: "+err.Error(), "pass the values the release was installed with")}
	}
	d.rendered = rendered
	d.webhooks(ctx)
	cfg := d.config(ctx)
	if cfg != nil {
		d.compiledPolicies(ctx, cfg, d.source(ctx, cfg))
		d.sharedClaimDeployments(ctx, cfg)
	}
	d.rbac(ctx)
	d.relay(ctx)
	d.publishedCA(ctx)
	if cfg != nil {
		d.dryRun(ctx, cfg)
	}
	return d.results
}

type doctor struct {
	cs       kubernetes.Interface
	o        Options
	rendered *charts.Rendered
	// fullname prefixes the release's objects, as the chart names them.
	fullname string
	results  []Result
}

func pass(check, detail string) Result { return Result{Check: check, OK: true, Detail: detail} }
func fail(check, detail, fix string) Result {
	return Result{Check: check, Detail: detail, Fix: fix}
}

func (d *doctor) add(r Result) { d.results = append(d.results, r) }

// webhooks checks both configurations against the chart's (a webhook
// switched to Ignore, or matching nothing, is as good as none), that every
// webhook's CA bundle trusts the certificate actually served, and how long
// that has left; and that the claim Lease policy is in force.
func (d *doctor) webhooks(ctx context.Context) {
	var want struct {
		m admissionregistrationv1.MutatingWebhookConfiguration
		v admissionregistrationv1.ValidatingWebhookConfiguration
	}
	for _, o := range d.rendered.Objects {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			_ = d.rendered.Into(o.GetKind(), o.GetName(), &want.m)
		case "ValidatingWebhookConfiguration":
			_ = d.rendered.Into(o.GetKind(), o.GetName(), &want.v)
		}
	}
	d.fullname = strings.TrimSuffix(want.m.Name, "-mutating")
	reinstall := "helm upgrade --install " + d.o.Release.Name + " charts/clipjob -n " + d.o.Release.Namespace + " (with the values it was installed with)"
	type hook struct {
		name   string
		client admissionregistrationv1.WebhookClientConfig
	}
	var hooks []hook
	var drift []string
	m, err := d.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, want.m.Name, metav1.GetOptions{})
	if err != nil {
		d.add(fail("webhook-configurations", fmt.Sprintf("MutatingWebhookConfiguration %s: %v", want.m.Name, err), reinstall))
		return
	}
	for i, w := range m.Webhooks {
		hooks = append(hooks, hook{w.Name, w.ClientConfig})
		if i < len(want.m.Webhooks) {
			drift = append(drift, differs(w.Name, mutatingRules(want.m.Webhooks[i]), mutatingRules(w))...)
		}
	}
	v, err := d.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, want.v.Name, metav1.GetOptions{})
	if err != nil {
		d.add(fail("webhook-configurations", fmt.Sprintf("ValidatingWebhookConfiguration %s: %v", want.v.Name, err), reinstall))
		return
	}
	for i, w := range v.Webhooks {
		hooks = append(hooks, hook{w.Name, w.ClientConfig})
		if i < len(want.v.Webhooks) {
			drift = append(drift, differs(w.Name, validatingRules(want.v.Webhooks[i]), validatingRules(w))...)
		}
	}
	switch {
	case len(hooks) != len(want.m.Webhooks)+len(want.v.Webhooks):
		d.add(fail("webhook-configurations", fmt.Sprintf("%d webhooks registered, the chart has %d", len(hooks), len(want.m.Webhooks)+len(want.v.Webhooks)), reinstall))
		return
	case len(drift) > 0:
		d.add(fail("webhook-configurations", "they differ from the chart's: "+strings.Join(drift, "; "), reinstall))
	default:
		d.add(pass("webhook-configurations", fmt.Sprintf("%s and %s: %d webhooks, as the chart has them", want.m.Name, want.v.Name, len(hooks))))
	}
	d.leasePolicy(ctx, reinstall)

	now := d.o.Now()
	var bad []string
	var served *x509.Certificate
	for _, h := range hooks {
		if len(h.client.CABundle) == 0 {
			bad = append(bad, h.name+": no CA bundle")
			continue
		}
		cert, host, err := d.servedCertificate(ctx, h.client)
		if err != nil {
			bad = append(bad, h.name+": "+err.Error())
			continue
		}
		if err := certs.Verify(h.client.CABundle, cert, host, now); err != nil {
			bad = append(bad, h.name+": "+err.Error())
			continue
		}
		served = cert
	}
	if len(bad) > 0 {
		d.add(fail("ca-bundle", strings.Join(bad, "; "), d.caFix()))
		return
	}
	d.add(pass("ca-bundle", "every webhook's CA bundle trusts the served certificate"))
	left := served.NotAfter.Sub(now)
	// Renewal happens with a third of the life left; an hour left means it
	// did not happen.
	switch {
	case left < time.Hour:
		d.add(fail("certificate", fmt.Sprintf("the serving certificate expires %s (in %s)", served.NotAfter.Format(time.RFC3339), left.Round(time.Minute)), d.caFix()))
	case left < 48*time.Hour:
		d.add(pass("certificate", fmt.Sprintf("expires %s, in %d hours", served.NotAfter.Format(time.RFC3339), int(left.Hours()))))
	default:
		d.add(pass("certificate", fmt.Sprintf("expires %s, in %d days", served.NotAfter.Format("2006-01-02"), int(left.Hours()/24))))
	}
}

// enforced is what makes a webhook apply: which requests reach it and what
// happens when it cannot answer.
type enforced struct {
	FailurePolicy     any
	Rules             any
	MatchConditions   any
	NamespaceSelector any
	ObjectSelector    any
	SideEffects       any
}

func mutatingRules(w admissionregistrationv1.MutatingWebhook) enforced {
	return enforced{failurePolicy(w.FailurePolicy), w.Rules, w.MatchConditions, selector(w.NamespaceSelector), selector(w.ObjectSelector), w.SideEffects}
}

func validatingRules(w admissionregistrationv1.ValidatingWebhook) enforced {
	return enforced{failurePolicy(w.FailurePolicy), w.Rules, w.MatchConditions, selector(w.NamespaceSelector), selector(w.ObjectSelector), w.SideEffects}
}

// selector and failurePolicy read an unset field as the API server
// defaults it.
func selector(s *metav1.LabelSelector) *metav1.LabelSelector {
	if s == nil {
		return &metav1.LabelSelector{}
	}
	return s
}

func failurePolicy(p *admissionregistrationv1.FailurePolicyType) admissionregistrationv1.FailurePolicyType {
	if p == nil {
		return admissionregistrationv1.Fail
	}
	return *p
}

// differs names what of a webhook's enforcement differs from the chart's.
func differs(name string, want, got enforced) []string {
	var out []string
	wv, gv := reflect.ValueOf(want), reflect.ValueOf(got)
	for i := range wv.NumField() {
		if !equality.Semantic.DeepEqual(wv.Field(i).Interface(), gv.Field(i).Interface()) {
			out = append(out, fmt.Sprintf("%s: %s %s, the chart's %s", name, wv.Type().Field(i).Name, brief(gv.Field(i).Interface()), brief(wv.Field(i).Interface())))
		}
	}
	return out
}

func brief(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

// policyGuards are the chart's admission policies, by the end of their
// names: the failure that names one missing, and what is open without it.
var policyGuards = []struct {
	suffix, without string
	fail            func(detail, fix string) Result
}{
	{"-claim-leases", "anyone with Lease rights can delete or squat claims",
		func(detail, fix string) Result { return fail("claim-lease-policy", detail, fix) }},
	{"-agent-runs", "a queued run's creator may start it or change its queued mark, and a Job dressed as complete may claim another's created-by",
		func(detail, fix string) Result { return fail("agent-runs-policy", detail, fix) }},
	{"-ca-bundle", "anyone who may write ConfigMaps beside the Paperclip server can have it trust a CA of theirs for the relay",
		func(detail, fix string) Result { return fail("ca-bundle-policy", detail, fix) }},
}

// leasePolicy checks that the chart's admission policies and their
// bindings are there, when the chart has them: one result for each
// policy that is missing a part.
func (d *doctor) leasePolicy(ctx context.Context, fix string) {
	failed := map[string]bool{}
	for _, o := range d.rendered.Objects {
		var err error
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			_, err = d.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, o.GetName(), metav1.GetOptions{})
		case "ValidatingAdmissionPolicyBinding":
			_, err = d.cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, o.GetName(), metav1.GetOptions{})
		default:
			continue
		}
		if err == nil {
			continue
		}
		suffix, without, failure := "", "the rules it holds are not enforced", func(detail, fix string) Result { return fail("admission-policy", detail, fix) }
		for _, g := range policyGuards {
			if strings.HasSuffix(o.GetName(), g.suffix) {
				suffix, without, failure = g.suffix, g.without, g.fail
			}
		}
		if !failed[suffix] {
			failed[suffix] = true
			d.add(failure(fmt.Sprintf("%s %s: %v; without it %s", o.GetKind(), o.GetName(), err, without), fix))
		}
	}
}

func (d *doctor) caFix() string {
	ns, full := d.o.Release.Namespace, d.fullname
	return fmt.Sprintf("selfManaged: the webhook re-injects its CA at once — check its log (kubectl -n %s logs deploy/%s-webhook); certManager: check the Certificate %s-webhook and the cainjector; external: set certificates.caBundle to the CA of the Secret %s-webhook-tls", ns, full, full, full)
}

// servedCertificate is what the webhook serves: dialled where the API
// server dials it for a URL, else read from the serving Secret the
// Service's pods serve.
func (d *doctor) servedCertificate(ctx context.Context, c admissionregistrationv1.WebhookClientConfig) (*x509.Certificate, string, error) {
	if c.URL != nil {
		u, err := url.Parse(*c.URL)
		if err != nil {
			return nil, "", err
		}
		dialer := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // verified against the bundle below
		conn, err := dialer.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			return nil, "", fmt.Errorf("cannot reach %s: %w", u.Host, err)
		}
		defer conn.Close()
		return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], u.Hostname(), nil
	}
	if c.Service == nil {
		return nil, "", errors.New("neither a URL nor a Service")
	}
	secret := d.fullname + "-webhook-tls"
	s, err := d.cs.CoreV1().Secrets(d.o.Release.Namespace).Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("serving Secret %s/%s: %w", d.o.Release.Namespace, secret, err)
	}
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil {
		return nil, "", fmt.Errorf("serving Secret %s/%s holds no certificate", d.o.Release.Namespace, secret)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	return cert, c.Service.Name + "." + c.Service.Namespace + ".svc", err
}

// config is the clipjob config in force: given, or the release's
// ConfigMap.
func (d *doctor) config(ctx context.Context) *config.Config {
	if d.o.Config != nil {
		return d.o.Config
	}
	name := d.fullname + "-config"
	cm, err := d.cs.CoreV1().ConfigMaps(d.o.Release.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		d.add(fail("config", fmt.Sprintf("ConfigMap %s/%s: %v", d.o.Release.Namespace, name, err), "set config in the chart's values and helm upgrade"))
		return nil
	}
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		d.add(fail("config", err.Error(), "fix config in the chart's values; the webhook keeps serving the previous config meanwhile"))
		return nil
	}
	d.add(pass("config", "ConfigMap "+d.o.Release.Namespace+"/"+name+" holds a valid config"))
	return cfg
}

// sharedClaimDeployments warns of each Deployment policy.sharedClaim lists
// that does not exist: its name is anyone's who may create a Deployment
// in its namespace, and that one's pods would mount Paperclip's home.
func (d *doctor) sharedClaimDeployments(ctx context.Context, cfg *config.Config) {
	if cfg.Policy.SharedClaim.Mode == config.SharedClaimDisabled {
		return
	}
	for _, ref := range cfg.Policy.SharedClaim.Deployments {
		ns, name, _ := strings.Cut(ref, "/")
		_, err := d.cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			d.add(Result{Check: "shared-claim", OK: true, Warning: true,
				Detail: fmt.Sprintf("Deployment %s, listed in policy.sharedClaim.deployments, does not exist: whoever may create a Deployment of that name in %s gets Paperclip's home mounted", ref, ns),
				Fix:    "create it, or remove it from policy.sharedClaim.deployments"})
		case err != nil:
			d.add(fail("shared-claim", fmt.Sprintf("Deployment %s (policy.sharedClaim.deployments): %v", ref, err), "run doctor as a user who may get Deployments there"))
		default:
			d.add(pass("shared-claim", fmt.Sprintf("Deployment %s, listed in policy.sharedClaim.deployments, exists", ref)))
		}
	}
}

// source checks the Deployment agents inherit from and its shared PVC,
// and returns what agents inherit from it (nil when it cannot be read).
func (d *doctor) source(ctx context.Context, cfg *config.Config) *templates.Inherited {
	src := cfg.Source
	ref := src.Namespace + "/" + src.Deployment
	dep, err := d.cs.AppsV1().Deployments(src.Namespace).Get(ctx, src.Deployment, metav1.GetOptions{})
	if err != nil {
		d.add(fail("source-deployment", fmt.Sprintf("Deployment %s: %v", ref, err),
			"set config.source.namespace and config.source.deployment to the Paperclip server's Deployment"))
		return nil
	}
	inh, err := templates.InheritFromDeployment(dep, src)
	if err != nil {
		d.add(fail("source-deployment", err.Error(), "set config.source.container and config.source.dataMountPath to match the Deployment"))
		return nil
	}
	d.add(pass("source-deployment", fmt.Sprintf("Deployment %s, container %s, image %s", ref, src.Container, inh.Image)))
	claim := inh.DataVolume.PersistentVolumeClaim.ClaimName
	pvc, err := d.cs.CoreV1().PersistentVolumeClaims(src.Namespace).Get(ctx, claim, metav1.GetOptions{})
	switch {
	case err != nil:
		d.add(fail("shared-volume", fmt.Sprintf("PersistentVolumeClaim %s/%s (mounted at %s): %v", src.Namespace, claim, src.DataMountPath, err),
			"create the PVC the Paperclip Deployment mounts, with accessModes [ReadWriteMany]"))
	case !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany):
		d.add(fail("shared-volume", fmt.Sprintf("PersistentVolumeClaim %s/%s is %v, not ReadWriteMany: agent pods on other nodes cannot mount it", src.Namespace, claim, pvc.Spec.AccessModes),
			"recreate it with accessModes [ReadWriteMany] on a StorageClass that supports it (NFS, CephFS, EFS, Filestore)"))
	default:
		d.add(pass("shared-volume", fmt.Sprintf("PersistentVolumeClaim %s/%s is ReadWriteMany (%s)", src.Namespace, claim, pvc.Status.Phase)))
	}
	return inh
}

// rbac checks, with SubjectAccessReviews, that each of the chart's
// ServiceAccounts holds every rule the chart grants it.
func (d *doctor) rbac(ctx context.Context) {
	for _, o := range d.rendered.Objects {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" {
			continue
		}
		var subjects []rbacv1.Subject
		var roleRef rbacv1.RoleRef
		if o.GetKind() == "ClusterRoleBinding" {
			var b rbacv1.ClusterRoleBinding
			if charts.Decode(o, &b) != nil {
				continue
			}
			subjects, roleRef = b.Subjects, b.RoleRef
		} else {
			var b rbacv1.RoleBinding
			if charts.Decode(o, &b) != nil {
				continue
			}
			subjects, roleRef = b.Subjects, b.RoleRef
		}
		var rules []rbacv1.PolicyRule
		if roleRef.Kind == "ClusterRole" {
			var r rbacv1.ClusterRole
			if d.rendered.Into("ClusterRole", roleRef.Name, &r) != nil {
				continue
			}
			rules = r.Rules
		} else {
			role := d.rendered.FindIn("Role", o.GetNamespace(), roleRef.Name)
			var r rbacv1.Role
			if role == nil || charts.Decode(role, &r) != nil {
				continue
			}
			rules = r.Rules
		}
		scope := "" // cluster-wide
		if o.GetKind() == "RoleBinding" {
			scope = o.GetNamespace()
		}
		for _, s := range subjects {
			user := "system:serviceaccount:" + s.Namespace + ":" + s.Name
			where := ""
			if scope != "" {
				where = " in namespace " + scope
			}
			missing, err := d.missing(ctx, user, scope, rules)
			switch {
			case err != nil:
				d.add(fail("rbac", fmt.Sprintf("could not ask whether %s holds %s %s%s: %v", user, roleRef.Kind, roleRef.Name, where, err),
					"run doctor as a user who may create subjectaccessreviews, against a reachable API server"))
			case len(missing) > 0:
				d.add(fail("rbac", fmt.Sprintf("%s lacks %s%s", user, strings.Join(missing, ", "), where),
					fmt.Sprintf("restore the %s %s from the chart (helm upgrade)", roleRef.Kind, roleRef.Name)))
			default:
				d.add(pass("rbac", fmt.Sprintf("%s holds %s %s%s", user, roleRef.Kind, roleRef.Name, where)))
			}
		}
	}
}

// missing lists the rules user does not hold in namespace. A review the
// API server does not answer is an error, not a missing rule: a doctor
// without the right to ask would otherwise report every rule lost.
func (d *doctor) missing(ctx context.Context, user, namespace string, rules []rbacv1.PolicyRule) ([]string, error) {
	var missing []string
	for _, r := range rules {
		for _, group := range r.APIGroups {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, verb := range r.Verbs {
					names := r.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}
					for _, name := range names {
						sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
							Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + d.o.Release.Namespace, "system:authenticated"},
							ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Group: group,
								Resource: resource, Subresource: sub, Name: name}}}
						got, err := d.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
						if err != nil {
							return nil, err
						}
						if !got.Status.Allowed {
							what := verb + " " + res
							if group != "" {
								what += "." + group
							}
							if name != "" {
								what += " " + name
							}
							missing = append(missing, what)
						}
					}
				}
			}
		}
	}
	return missing, nil
}

// relay checks that the relay's API answers (a request without a token
// must get its 401).
func (d *doctor) relay(ctx context.Context) {
	if d.rendered.Find("Deployment", d.fullname+"-relay") == nil {
		return // not installed
	}
	fix := fmt.Sprintf("kubectl -n %s rollout status deploy/%s-relay; kubectl -n %s logs deploy/%s-relay",
		d.o.Release.Namespace, d.fullname, d.o.Release.Namespace, d.fullname)
	var code int
	if d.o.RelayURL != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(d.o.RelayURL, "/")+"/v1/runs", nil)
		if err != nil {
			d.add(fail("relay", err.Error(), fix))
			return
		}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // reachability only
		resp, err := client.Do(req)
		if err != nil {
			d.add(fail("relay", "cannot reach "+d.o.RelayURL+": "+err.Error(), fix))
			return
		}
		resp.Body.Close()
		code = resp.StatusCode
	} else {
		_, err := d.cs.CoreV1().Services(d.o.Release.Namespace).ProxyGet("https", d.fullname+"-relay", "api", "/v1/runs", nil).DoRaw(ctx)
		var status apierrors.APIStatus
		switch {
		case err == nil:
			code = http.StatusOK
		case errors.As(err, &status):
			code = int(status.Status().Code)
		default:
			d.add(fail("relay", "cannot reach the relay through the API server: "+err.Error(), fix))
			return
		}
	}
	if code != http.StatusUnauthorized {
		d.add(fail("relay", fmt.Sprintf("GET /v1/runs without a token answered %d, want 401", code), fix))
		return
	}
	d.add(pass("relay", "the relay's API answers, and asks for a token"))
}

// publishedCA checks each ConfigMap the webhook publishes the CA bundle
// in (certificates.publishCAConfigMap) is there and trusts the relay's
// serving certificate, as the Paperclip server that mounts it will check
// it.
func (d *doctor) publishedCA(ctx context.Context) {
	webhook := d.rendered.Find("Deployment", d.fullname+"-webhook")
	relay := d.rendered.Find("Deployment", d.fullname+"-relay")
	if webhook == nil || relay == nil {
		return
	}
	var dep appsv1.Deployment
	if charts.Decode(webhook, &dep) != nil || len(dep.Spec.Template.Spec.Containers) == 0 {
		return
	}
	for _, arg := range dep.Spec.Template.Spec.Containers[0].Args {
		v, ok := strings.CutPrefix(arg, "--publish-ca-configmap=")
		if !ok {
			continue
		}
		ref, err := certs.ParseObjectRef(v)
		if err != nil {
			continue
		}
		fix := fmt.Sprintf("the webhook writes it within a check (30s) of namespace %s existing: kubectl -n %s logs deploy/%s-webhook | grep -i 'CA bundle'",
			ref.Namespace, d.o.Release.Namespace, d.fullname)
		cm, err := d.cs.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			d.add(fail("relay-ca", fmt.Sprintf("ConfigMap %s (the CA bundle for the relay's clients): %v", ref, err), fix))
			continue
		}
		secret := d.fullname + "-relay-tls"
		s, err := d.cs.CoreV1().Secrets(d.o.Release.Namespace).Get(ctx, secret, metav1.GetOptions{})
		if err != nil {
			d.add(fail("relay-ca", fmt.Sprintf("the relay's serving Secret %s/%s: %v", d.o.Release.Namespace, secret, err), fix))
			continue
		}
		block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
		var cert *x509.Certificate
		if block != nil {
			cert, err = x509.ParseCertificate(block.Bytes)
		}
		if block == nil || err != nil {
			d.add(fail("relay-ca", fmt.Sprintf("the relay's serving Secret %s/%s holds no certificate", d.o.Release.Namespace, secret), fix))
			continue
		}
		host := d.fullname + "-relay." + d.o.Release.Namespace + ".svc"
		if err := certs.Verify([]byte(cm.Data[certs.BundleKey]), cert, host, d.o.Now()); err != nil {
			d.add(fail("relay-ca", fmt.Sprintf("ConfigMap %s does not trust the relay's certificate: %v", ref, err), fix))
			continue
		}
		// The server trusts every CA the bundle holds for the relay: one
		// clipjob did not make answers for the relay as well as clipjob's.
		if foreign := d.foreignCAs(ctx, []byte(cm.Data[certs.BundleKey])); len(foreign) > 0 {
			d.add(fail("relay-ca", fmt.Sprintf("ConfigMap %s also trusts %s, which clipjob's webhook configurations do not: whoever holds its key can answer for the relay", ref, strings.Join(foreign, ", ")),
				fmt.Sprintf("the webhook puts its own bundle back within a second (its log: kubectl -n %s logs deploy/%s-webhook | grep -i 'CA bundle'); keep the chart's %s-ca-bundle admission policy, and find who wrote it: kubectl -n %s get configmap %s --show-managed-fields -o yaml",
					d.o.Release.Namespace, d.fullname, d.fullname, ref.Namespace, ref.Name)))
			continue
		}
		d.add(pass("relay-ca", fmt.Sprintf("ConfigMap %s holds the CA bundle, which trusts the relay's certificate for %s", ref, host)))
	}
}

// foreignCAs names the CAs of bundle that the release's mutating webhook
// configuration is not injected with (self-managed certificates inject
// the CA Secret's whole bundle); none when that cannot be read (another
// check says so).
func (d *doctor) foreignCAs(ctx context.Context, bundle []byte) []string {
	m, err := d.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, d.fullname+"-mutating", metav1.GetOptions{})
	if err != nil || len(m.Webhooks) == 0 {
		return nil
	}
	var out []string
	for _, c := range certs.ParseBundle(bundle) {
		if !slices.ContainsFunc(certs.ParseBundle(m.Webhooks[0].ClientConfig.CABundle), c.Equal) {
			out = append(out, fmt.Sprintf("%q", c.Subject.CommonName))
		}
	}
	return out
}

// dryRun creates a bare Job with dryRun=All in the source namespace: it
// must come back mutated, through both webhooks, and writes nothing.
func (d *doctor) dryRun(ctx context.Context, cfg *config.Config) {
	ns := cfg.Source.Namespace
	labels := map[string]string{contract.LabelAgentID: "clipjob-doctor", contract.LabelCompanyID: "clipjob-doctor",
		contract.LabelRunID: fmt.Sprintf("doctor-%d", d.o.Now().Unix())}
	// A bare Job names an adapter whose profile runs a command; the default
	// profile may run none.
	for _, name := range cfg.ProfileNames() {
		if p, ok := cfg.Profile(name); ok && len(p.Command) > 0 {
			labels[contract.LabelAdapterType] = name
			break
		}
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "clipjob-doctor-", Namespace: ns, Labels: labels},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
			Annotations: map[string]string{contract.AnnotationPrompt: "clipjob doctor: a dry run, never stored"}}}},
	}
	got, err := d.cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		d.add(fail("dry-run", "a bare Job in "+ns+" was refused: "+err.Error(),
			"read the message: it names the field and the fix; a webhook call error means the Service or its pods are not serving"))
		return
	}
	profile := got.Annotations[contract.AnnotationProfile]
	if profile == "" || len(got.Spec.Template.Spec.Containers) == 0 {
		d.add(fail("dry-run", "a bare Job came back without clipjob's mutation (no "+contract.AnnotationProfile+" annotation, no container)",
			"check that the mutating webhook matches Jobs labeled "+contract.LabelAgentID+" in namespace "+ns+" (namespaceSelector, objectSelector)"))
		return
	}
	d.add(pass("dry-run", fmt.Sprintf("a bare Job in %s came back mutated: profile %s, image %s", ns, profile, got.Spec.Template.Spec.Containers[0].Image)))
}
