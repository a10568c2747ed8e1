package doctor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

// Each check against a fake API server: what it reports for a healthy
// install, and for each way that check's part can be broken. The e2e
// suite (TestDoctor*) runs the same checks against a real install.

var (
	release = charts.Release{Name: "clipjob", Namespace: "clipjob-system"}
	now     = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
)

// install is a healthy install's objects: the chart's webhook
// configurations and claim Lease policy, CA bundles that trust the
// certificate in the serving Secret (90 days left), and a valid config.
type install struct {
	objects []runtime.Object
	ca      *certs.KeyPair
	// serving is the webhook's serving certificate's validity from now.
	serving time.Duration
}

func healthy(t *testing.T) *install {
	t.Helper()
	ca, err := certs.NewCA("clipjob-test-ca", now.Add(-time.Hour), 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &install{ca: ca, serving: 90 * 24 * time.Hour}
}

// build renders the chart and returns the fake API server's objects:
// the chart's, changed by each edit.
func (in *install) build(t *testing.T, edits ...func(*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration)) []runtime.Object {
	t.Helper()
	rendered, err := charts.Render(release, nil)
	if err != nil {
		t.Fatal(err)
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	var objs []runtime.Object
	for _, o := range rendered.Objects {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			if err := rendered.Into(o.GetKind(), o.GetName(), &m); err != nil {
				t.Fatal(err)
			}
		case "ValidatingWebhookConfiguration":
			if err := rendered.Into(o.GetKind(), o.GetName(), &v); err != nil {
				t.Fatal(err)
			}
		case "ValidatingAdmissionPolicy":
			objs = append(objs, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: o.GetName()}})
		case "ValidatingAdmissionPolicyBinding":
			objs = append(objs, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: o.GetName()}})
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := rendered.Into(o.GetKind(), o.GetName(), &cm); err != nil {
				t.Fatal(err)
			}
			cm.Namespace = release.Namespace
			objs = append(objs, &cm)
		}
	}
	bundle := in.ca.CertPEM
	for i := range m.Webhooks {
		m.Webhooks[i].ClientConfig.CABundle = bundle
	}
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig.CABundle = bundle
	}
	for _, e := range edits {
		e(&m, &v)
	}
	svc := m.Webhooks[0].ClientConfig.Service
	serving, err := in.ca.Issue([]string{svc.Name + "." + svc.Namespace + ".svc"}, now.Add(in.serving-365*24*time.Hour), 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fullname := strings.TrimSuffix(m.Name, "-mutating")
	relay, err := in.ca.Issue([]string{fullname + "-relay." + release.Namespace + ".svc"}, now.Add(-time.Hour), 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, &m, &v, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: fullname + "-webhook-tls", Namespace: release.Namespace},
		Data:       map[string][]byte{corev1.TLSCertKey: serving.CertPEM, corev1.TLSPrivateKeyKey: serving.KeyPEM},
	}, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: fullname + "-relay-tls", Namespace: release.Namespace},
		Data:       map[string][]byte{corev1.TLSCertKey: relay.CertPEM, corev1.TLSPrivateKeyKey: relay.KeyPEM},
	}, &corev1.ConfigMap{ // what the webhook publishes beside the Paperclip server
		ObjectMeta: metav1.ObjectMeta{Name: "clipjob-ca", Namespace: "paperclip"},
		Data:       map[string]string{certs.BundleKey: string(bundle)},
	})
	return objs
}

// run is doctor.Run against cs, the relay at relayURL ("": a relay that
// asks for a token, as a healthy one does; the fake API server has no
// service proxy).
func run(t *testing.T, cs *fake.Clientset, relayURL string) map[string]Result {
	t.Helper()
	if relayURL == "" {
		relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
		defer relay.Close()
		relayURL = relay.URL
	}
	results := map[string]Result{}
	for _, r := range Run(context.Background(), cs, Options{Release: release, RelayURL: relayURL, Now: func() time.Time { return now }}) {
		results[r.Check] = r
	}
	return results
}

// want checks that check passed (ok) or failed with a detail and a fix
// holding the words given.
func want(t *testing.T, results map[string]Result, check string, ok bool, words ...string) {
	t.Helper()
	r, found := results[check]
	if !found {
		t.Fatalf("no %s check in %v", check, results)
	}
	if r.OK != ok {
		t.Errorf("%s: ok=%v (%s; fix %q), want ok=%v", check, r.OK, r.Detail, r.Fix, ok)
	}
	if !ok && r.Fix == "" {
		t.Errorf("%s failed with no fix: %s", check, r.Detail)
	}
	for _, w := range words {
		if !strings.Contains(r.Detail+" "+r.Fix, w) {
			t.Errorf("%s: %q (fix %q) does not say %q", check, r.Detail, r.Fix, w)
		}
	}
}

func TestHealthyWebhooksAndCertificate(t *testing.T) {
	in := healthy(t)
	results := run(t, fake.NewClientset(in.build(t)...), "")
	want(t, results, "webhook-configurations", true, "as the chart has them")
	want(t, results, "ca-bundle", true)
	want(t, results, "certificate", true, "in 90 days")
	want(t, results, "config", true)
	if _, found := results["claim-lease-policy"]; found {
		t.Errorf("the claim Lease policy is there, yet: %+v", results["claim-lease-policy"])
	}
}

func TestWebhookDriftIsNamed(t *testing.T) {
	in := healthy(t)
	ignore := admissionregistrationv1.Ignore
	objs := in.build(t, func(m *admissionregistrationv1.MutatingWebhookConfiguration, _ *admissionregistrationv1.ValidatingWebhookConfiguration) {
		m.Webhooks[0].FailurePolicy = &ignore
	})
	results := run(t, fake.NewClientset(objs...), "")
	m, _ := firstWebhooks(objs)
	want(t, results, "webhook-configurations", false, "differ from the chart's", m, "helm upgrade --install clipjob")
}

// firstWebhooks are the names of the first mutating and the first
// validating webhook in objs.
func firstWebhooks(objs []runtime.Object) (mutating, validating string) {
	for _, o := range objs {
		switch c := o.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			mutating = c.Webhooks[0].Name
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			validating = c.Webhooks[0].Name
		}
	}
	return mutating, validating
}

func TestMissingWebhookConfigurationIsNamed(t *testing.T) {
	in := healthy(t)
	var objs []runtime.Object
	for _, o := range in.build(t) {
		if _, ok := o.(*admissionregistrationv1.ValidatingWebhookConfiguration); !ok {
			objs = append(objs, o)
		}
	}
	results := run(t, fake.NewClientset(objs...), "")
	want(t, results, "webhook-configurations", false, "ValidatingWebhookConfiguration", "not found")
}

func TestDeletedClaimLeasePolicyIsNamed(t *testing.T) {
	in := healthy(t)
	var objs []runtime.Object
	for _, o := range in.build(t) {
		if _, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding); !ok {
			objs = append(objs, o)
		}
	}
	results := run(t, fake.NewClientset(objs...), "")
	want(t, results, "claim-lease-policy", false, "ValidatingAdmissionPolicyBinding", "squat claims")
	want(t, results, "ca-bundle-policy", false, "ValidatingAdmissionPolicyBinding", "trust a CA of theirs")
}

func TestCABundleThatDoesNotTrustTheServedCertificate(t *testing.T) {
	in := healthy(t)
	other, err := certs.NewCA("another-ca", now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	objs := in.build(t, func(_ *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration) {
		v.Webhooks[0].ClientConfig.CABundle = other.CertPEM
	})
	results := run(t, fake.NewClientset(objs...), "")
	_, v := firstWebhooks(objs)
	want(t, results, "ca-bundle", false, v, "certificates.caBundle")
	if _, found := results["certificate"]; found {
		t.Errorf("a certificate nobody trusts was judged for its days left: %+v", results["certificate"])
	}
}

func TestCertificateAboutToExpire(t *testing.T) {
	in := healthy(t)
	in.serving = 30 * time.Minute
	results := run(t, fake.NewClientset(in.build(t)...), "")
	want(t, results, "ca-bundle", true)
	want(t, results, "certificate", false, "expires", "in 30m")
	in.serving = 30 * time.Hour
	want(t, run(t, fake.NewClientset(in.build(t)...), ""), "certificate", true, "in 30 hours")
}

func TestInvalidConfigIsNamedAndTheOldOneKeepsServing(t *testing.T) {
	in := healthy(t)
	objs := in.build(t)
	for _, o := range objs {
		if cm, ok := o.(*corev1.ConfigMap); ok && strings.HasSuffix(cm.Name, "-config") {
			cm.Data["config.yaml"] = "profiles:\n  claude_local:\n    imagee: typo\n"
		}
	}
	results := run(t, fake.NewClientset(objs...), "")
	want(t, results, "config", false, "imagee", "keeps serving the previous config")
	if _, found := results["dry-run"]; found {
		t.Error("a dry run was made with no config to make it from")
	}
}

func TestRelayMustAskForAToken(t *testing.T) {
	for _, c := range []struct {
		code int
		ok   bool
	}{{http.StatusUnauthorized, true}, {http.StatusOK, false}, {http.StatusServiceUnavailable, false}} {
		relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/runs" {
				t.Errorf("the relay was asked %s", r.URL.Path)
			}
			w.WriteHeader(c.code)
		}))
		results := run(t, fake.NewClientset(healthy(t).build(t)...), relay.URL)
		relay.Close()
		if c.ok {
			want(t, results, "relay", true, "asks for a token")
		} else {
			want(t, results, "relay", false, "want 401", "kubectl -n clipjob-system logs deploy/")
		}
	}
	results := run(t, fake.NewClientset(healthy(t).build(t)...), "http://127.0.0.1:1")
	want(t, results, "relay", false, "cannot reach")
}

// The dry run: a bare Job must come back mutated by clipjob.
func TestDryRunMustComeBackMutated(t *testing.T) {
	// The chart's config, as the release's ConfigMap holds it.
	var cfg *config.Config
	for _, o := range healthy(t).build(t) {
		if cm, ok := o.(*corev1.ConfigMap); ok && strings.HasSuffix(cm.Name, "-config") {
			var err error
			if cfg, err = config.Parse([]byte(cm.Data["config.yaml"])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cfg == nil {
		t.Fatal("the chart renders no config")
	}
	for _, c := range []struct {
		name    string
		mutate  bool
		refuse  bool
		ok      bool
		phrases []string
	}{
		{"mutated", true, false, true, []string{"came back mutated", "profile claude_local"}},
		{"not mutated", false, false, false, []string{"without clipjob's mutation", "namespaceSelector"}},
		{"refused", false, true, false, []string{"was refused", "names the field"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := fake.NewClientset(healthy(t).build(t)...)
			var created *batchv1.Job
			var dryRun []string
			cs.PrependReactor("create", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
				ca := a.(k8stesting.CreateActionImpl)
				job := ca.GetObject().(*batchv1.Job).DeepCopy()
				created, dryRun = job, ca.CreateOptions.DryRun
				if c.refuse {
					return true, nil, &statusErr{"admission webhook denied the request: spec.template: image not allowed"}
				}
				if c.mutate {
					job.Annotations = map[string]string{contract.AnnotationProfile: job.Labels[contract.LabelAdapterType]}
					job.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "ghcr.io/paperclipai/paperclip:v1"}}
				}
				return true, job, nil
			})
			d := &doctor{cs: cs, o: Options{Release: release, Now: func() time.Time { return now }}}
			d.dryRun(context.Background(), cfg)
			if len(d.results) != 1 {
				t.Fatalf("results %+v", d.results)
			}
			results := map[string]Result{"dry-run": d.results[0]}
			want(t, results, "dry-run", c.ok, c.phrases...)
			if created == nil || created.Labels[contract.LabelAgentID] != "clipjob-doctor" || created.Spec.Template.Annotations[contract.AnnotationPrompt] == "" {
				t.Errorf("the dry-run Job: %+v", created)
			}
			if len(dryRun) != 1 || dryRun[0] != metav1.DryRunAll {
				t.Errorf("the Job was created with dryRun %v: it would be stored", dryRun)
			}
		})
	}
}

type statusErr struct{ msg string }

func (e *statusErr) Error() string { return e.msg }

// TestRBACIsAskedOfTheAPIServer: each of the chart's ServiceAccounts is
// held to its rules by SubjectAccessReviews; a missing rule is named with
// the Role to restore, and a review the API server does not answer is
// said to be that, not reported as every rule lost.
func TestRBACIsAskedOfTheAPIServer(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func(*authorizationv1.SubjectAccessReview) (bool, error)
		ok     bool
		words  []string
	}{
		{"all held", func(*authorizationv1.SubjectAccessReview) (bool, error) { return true, nil }, true, []string{"holds"}},
		{"a rule lost", func(r *authorizationv1.SubjectAccessReview) (bool, error) {
			return !(r.Spec.ResourceAttributes.Resource == "leases" && r.Spec.ResourceAttributes.Verb == "create"), nil
		}, false, []string{"lacks create leases.coordination.k8s.io", "restore the"}},
		{"cannot ask", func(*authorizationv1.SubjectAccessReview) (bool, error) {
			return false, &statusErr{"subjectaccessreviews.authorization.k8s.io is forbidden"}
		}, false, []string{"could not ask whether", "is forbidden", "may create subjectaccessreviews"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := fake.NewClientset(healthy(t).build(t)...)
			asked := 0
			cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				asked++
				r := a.(k8stesting.CreateActionImpl).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
				allowed, err := c.answer(r)
				r.Status.Allowed = allowed
				return true, r, err
			})
			relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
			defer relay.Close()
			var rbac []Result
			for _, r := range Run(context.Background(), cs, Options{Release: release, RelayURL: relay.URL, Now: func() time.Time { return now }}) {
				if r.Check == "rbac" {
					rbac = append(rbac, r)
				}
			}
			if len(rbac) == 0 || asked == 0 {
				t.Fatalf("%d rbac results after %d reviews", len(rbac), asked)
			}
			failed := slices.IndexFunc(rbac, func(r Result) bool { return !r.OK })
			if c.ok {
				if failed >= 0 {
					t.Fatalf("a healthy install: %+v", rbac[failed])
				}
				want(t, map[string]Result{"rbac": rbac[0]}, "rbac", true, c.words...)
				return
			}
			if failed < 0 {
				t.Fatalf("no rbac check failed: %+v", rbac)
			}
			want(t, map[string]Result{"rbac": rbac[failed]}, "rbac", false, c.words...)
		})
	}
}

// A Deployment policy.sharedClaim.deployments lists that does not exist is
// anyone's who may create one of that name there, with Paperclip's home
// mounted: doctor warns of it (passing), and says a listed one exists.
func TestDoctorWarnsOfAListedDeploymentThatDoesNotExist(t *testing.T) {
	cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\npolicy:\n  sharedClaim:\n    deployments: [paperclip/backup, paperclip/gone]\n"))
	if err != nil {
		t.Fatal(err)
	}
	backup := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "backup", Namespace: "paperclip"}}
	got := map[string]Result{}
	for _, r := range Run(context.Background(), fake.NewClientset(backup), Options{Release: release, Config: cfg, RelayURL: "https://127.0.0.1:1", Now: func() time.Time { return now }}) {
		if r.Check == "shared-claim" {
			got[strings.TrimSuffix(strings.Fields(r.Detail)[1], ",")] = r
		}
	}
	if r := got["paperclip/backup"]; !r.OK || r.Warning {
		t.Errorf("an existing listed Deployment: %+v", r)
	}
	if r := got["paperclip/gone"]; !r.OK || !r.Warning || !strings.Contains(r.Detail, "does not exist") || r.Fix == "" {
		t.Errorf("a listed Deployment that does not exist: %+v", r)
	}
}

// The CA bundle published beside the Paperclip server must be there and
// trust the relay's certificate and no CA but clipjob's: missing, or
// holding another CA, the failure names the ConfigMap.
func TestPublishedCABundle(t *testing.T) {
	want(t, run(t, fake.NewClientset(healthy(t).build(t)...), ""), "relay-ca", true, "paperclip/clipjob-ca")
	other, err := certs.NewCA("another-ca", now.Add(-time.Hour), 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*corev1.ConfigMap) []runtime.Object{
		"missing": func(*corev1.ConfigMap) []runtime.Object { return nil },
		"another CA": func(cm *corev1.ConfigMap) []runtime.Object {
			cm.Data[certs.BundleKey] = string(other.CertPEM)
			return []runtime.Object{cm}
		},
		// It trusts the relay, and a CA of whoever wrote it: the server
		// would take them for the relay.
		"clipjob's CA and another": func(cm *corev1.ConfigMap) []runtime.Object {
			cm.Data[certs.BundleKey] += string(other.CertPEM)
			return []runtime.Object{cm}
		},
	} {
		var objs []runtime.Object
		for _, o := range healthy(t).build(t) {
			if cm, ok := o.(*corev1.ConfigMap); ok && cm.Namespace == "paperclip" {
				objs = append(objs, edit(cm)...)
				continue
			}
			objs = append(objs, o)
		}
		results := run(t, fake.NewClientset(objs...), "")
		want(t, results, "relay-ca", false, "paperclip/clipjob-ca")
		if name == "another CA" && !strings.Contains(results["relay-ca"].Detail, "does not trust") {
			t.Errorf("%s: %q", name, results["relay-ca"].Detail)
		}
		if name == "clipjob's CA and another" && !strings.Contains(results["relay-ca"].Detail, "another-ca") {
			t.Errorf("%s: %q; want the other CA named", name, results["relay-ca"].Detail)
		}
	}
}
