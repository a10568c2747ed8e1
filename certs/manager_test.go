package certs

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

const ns = "clipjob-system"

var start = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func configurations() (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	return &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "clipjob-mutating"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "mutate.jobs.clipjob.paperclip.io"}}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "clipjob-validating"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.jobs.clipjob.paperclip.io"}, {Name: "validate.pods.clipjob.paperclip.io"}}}
}

type fixture struct {
	t     *testing.T
	cs    *fake.Clientset
	clock *clocktesting.FakePassiveClock
	m     *Manager
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	mwc, vwc := configurations()
	f := &fixture{t: t, cs: fake.NewClientset(mwc, vwc), clock: clocktesting.NewFakePassiveClock(start)}
	f.m = f.manager()
	return f
}

// manager is another replica over the same API.
func (f *fixture) manager() *Manager {
	m, err := New(f.cs, Options{Namespace: ns, CASecret: "clipjob-ca",
		Serving: []Target{
			{Secret: "clipjob-webhook-tls", DNSNames: []string{"clipjob-webhook.clipjob-system.svc"}},
			{Secret: "clipjob-relay-tls", DNSNames: []string{"clipjob-relay.clipjob-system.svc"}},
		},
		MutatingWebhooks: []string{"clipjob-mutating"}, ValidatingWebhooks: []string{"clipjob-validating"},
		CertValidity: 90 * 24 * time.Hour, CAValidity: 365 * 24 * time.Hour, PropagationDelay: time.Minute,
		Clock: f.clock, Log: logr.Discard()})
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

func (f *fixture) check(m *Manager) {
	f.t.Helper()
	if err := m.Check(context.Background()); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) secret(name string) *corev1.Secret {
	f.t.Helper()
	s, err := f.cs.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// bundles returns the CA bundle of every webhook of both configurations.
func (f *fixture) bundles() [][]byte {
	f.t.Helper()
	mwc, err := f.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "clipjob-mutating", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	vwc, err := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "clipjob-validating", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	out := [][]byte{mwc.Webhooks[0].ClientConfig.CABundle}
	for _, w := range vwc.Webhooks {
		out = append(out, w.ClientConfig.CABundle)
	}
	return out
}

// servedTrusted asserts that every webhook's bundle trusts what m serves,
// as the API server would check it.
func (f *fixture) servedTrusted(m *Manager) *x509.Certificate {
	f.t.Helper()
	c, err := m.GetCertificate(nil)
	if err != nil {
		f.t.Fatal(err)
	}
	for i, b := range f.bundles() {
		if err := Verify(b, c.Leaf, "clipjob-webhook.clipjob-system.svc", f.clock.Now()); err != nil {
			f.t.Fatalf("webhook %d: %v", i, err)
		}
	}
	if err := m.Ready(nil); err != nil {
		f.t.Fatalf("not ready: %v", err)
	}
	return c.Leaf
}

func writes(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" || a.GetVerb() == "update" {
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

func TestFirstCheckIssuesAndInjects(t *testing.T) {
	f := newFixture(t)
	if err := f.m.Ready(nil); err == nil {
		t.Error("ready before any certificate")
	}
	f.check(f.m)
	leaf := f.servedTrusted(f.m)
	if leaf.NotAfter.Sub(start) > 91*24*time.Hour {
		t.Errorf("serving certificate valid until %v", leaf.NotAfter)
	}
	relay := f.secret("clipjob-relay-tls")
	pair, err := ParseKeyPair(relay.Data[corev1.TLSCertKey], relay.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(relay.Data["ca.crt"], pair.Cert, "clipjob-relay.clipjob-system.svc", start); err != nil {
		t.Errorf("the relay's Secret: %v", err)
	}
	if relay.Type != corev1.SecretTypeTLS {
		t.Errorf("relay Secret type %s", relay.Type)
	}

	// Nothing changed: a second check, by another replica too, writes
	// nothing.
	f.cs.ClearActions()
	other := f.manager()
	f.check(f.m)
	f.check(other)
	if w := writes(f.cs); len(w) != 0 {
		t.Errorf("an idle check wrote %v", w)
	}
	f.servedTrusted(other)
}

func TestServingCertificateRenewedBeforeItEnds(t *testing.T) {
	f := newFixture(t)
	f.check(f.m)
	first := f.servedTrusted(f.m)
	f.clock.SetTime(start.Add(59 * 24 * time.Hour))
	f.check(f.m)
	if !f.servedTrusted(f.m).Equal(first) {
		t.Error("renewed with more than a third of its life left")
	}
	f.clock.SetTime(start.Add(61 * 24 * time.Hour))
	f.check(f.m)
	renewed := f.servedTrusted(f.m)
	if renewed.Equal(first) || !renewed.NotAfter.After(first.NotAfter) {
		t.Errorf("not renewed with less than a third left: %v", renewed.NotAfter)
	}
}

// A new CA joins the bundle beside the old one; the serving certificate
// from the old CA is kept while it is trusted, so no client that has the
// old bundle fails; the old CA leaves the bundle only when it expires.
func TestCARotationKeepsTheOldCATrusted(t *testing.T) {
	f := newFixture(t)
	f.check(f.m)
	oldCA, _ := ParseKeyPair(f.secret("clipjob-ca").Data[corev1.TLSCertKey], f.secret("clipjob-ca").Data[corev1.TLSPrivateKeyKey])
	// Checks every 30 days: the serving certificate is renewed every 60,
	// the CA when a third of its 365 days is left, at day 270.
	for day := 30; day <= 270; day += 30 {
		f.clock.SetTime(start.Add(time.Duration(day) * 24 * time.Hour))
		f.check(f.m)
		if got := len(ParseBundle(f.bundles()[0])); day < 270 && got != 1 {
			t.Fatalf("day %d: %d CAs in the bundle", day, got)
		}
	}
	bundle := ParseBundle(f.bundles()[0])
	if len(bundle) != 2 || !bundle[1].Equal(oldCA.Cert) {
		t.Fatalf("bundle after CA rotation holds %d CAs; want the new and the old", len(bundle))
	}
	served := f.servedTrusted(f.m)
	if served.Issuer.String() != oldCA.Cert.Subject.String() || served.CheckSignatureFrom(oldCA.Cert) != nil {
		t.Error("the serving certificate moved off the old CA in the same check that made the new one")
	}
	for day := 300; day <= 360; day += 30 {
		f.clock.SetTime(start.Add(time.Duration(day) * 24 * time.Hour))
		f.check(f.m)
		f.servedTrusted(f.m)
	}
	f.clock.SetTime(start.Add(366 * 24 * time.Hour)) // the old CA expired
	f.check(f.m)
	if got := ParseBundle(f.bundles()[0]); len(got) != 1 || got[0].Equal(oldCA.Cert) {
		t.Errorf("bundle after the old CA expired: %d CAs", len(got))
	}
	f.servedTrusted(f.m)
}

// Deleting every Secret (a forced rotation) breaks nothing: the CAs the
// webhook configurations trust now stay in the new bundle, and the
// certificate being served is kept until the new CA has propagated.
func TestDeletedSecretsRotateWithoutBreakingTrust(t *testing.T) {
	f := newFixture(t)
	f.check(f.m)
	before := f.servedTrusted(f.m)
	for _, s := range []string{"clipjob-ca", "clipjob-webhook-tls", "clipjob-relay-tls"} {
		if err := f.cs.CoreV1().Secrets(ns).Delete(context.Background(), s, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.SetTime(start.Add(time.Second))
	f.check(f.m)
	if len(ParseBundle(f.bundles()[0])) != 2 {
		t.Fatal("the new bundle dropped the CA the API server trusts now")
	}
	if !f.servedTrusted(f.m).Equal(before) {
		t.Error("served a certificate from a CA not yet propagated")
	}
	f.clock.SetTime(start.Add(2 * time.Minute))
	f.check(f.m)
	after := f.servedTrusted(f.m)
	if after.Equal(before) {
		t.Error("no new serving certificate after the propagation delay")
	}
}

// Someone blanking or replacing a bundle gets it put back.
func TestBlankedBundleIsReinjected(t *testing.T) {
	f := newFixture(t)
	f.check(f.m)
	vwc, _ := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "clipjob-validating", metav1.GetOptions{})
	vwc.Webhooks[1].ClientConfig.CABundle = []byte("garbage")
	if _, err := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(context.Background(), vwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.check(f.m)
	f.servedTrusted(f.m)
}

// Two replicas racing: the loser's write conflicts and it takes the
// winner's certificates on its next check.
func TestLostRaceIsRetried(t *testing.T) {
	f := newFixture(t)
	loser := f.manager()
	f.check(f.m)
	f.clock.SetTime(start.Add(61 * 24 * time.Hour)) // the serving certificates need renewal
	conflicts := 1
	f.cs.PrependReactor("update", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if conflicts == 0 {
			return false, nil, nil
		}
		conflicts--
		return true, nil, apierrors.NewConflict(corev1.Resource("secrets"), "clipjob-webhook-tls", errors.New("the object has been modified"))
	})
	if err := loser.Check(context.Background()); !apierrors.IsConflict(err) {
		t.Fatalf("a write that lost the race: want a conflict to retry on, got %v", err)
	}
	f.check(loser)
	f.servedTrusted(loser)
}

func TestOptionsNameWhatIsMissing(t *testing.T) {
	_, err := New(fake.NewClientset(), Options{Serving: []Target{{Secret: "s"}}})
	for _, want := range []string{"namespace", "--ca-secret", "--cert-dns-name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not say %q", err, want)
		}
	}
}

// A bundle someone blanks (or a helm upgrade drops) is put back at once,
// on the configuration's watch event, not at the next periodic check.
func TestBlankedBundleIsReinjectedAtOnce(t *testing.T) {
	f := newFixture(t)
	f.m.o.Interval = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.m.Start(ctx) }()
	defer func() { cancel(); <-done }()
	// A minute: far above any stall of a loaded machine, and far below
	// Interval (an hour), so the periodic check cannot be what puts it back.
	waitFor := func(ok func() bool) bool {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if ok() {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	injected := func() bool {
		for _, b := range f.bundles() {
			if len(ParseBundle(b)) == 0 {
				return false
			}
		}
		return true
	}
	if !waitFor(injected) {
		t.Fatal("never injected")
	}
	mwc, _ := f.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "clipjob-mutating", metav1.GetOptions{})
	mwc.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := f.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitFor(injected) {
		t.Error("a blanked bundle was not put back on the watch event (the periodic check is an hour away)")
	}
}

// A CA put into a configuration's bundle by hand is not kept there: the
// CA Secret's bundle says what is trusted.
func TestAForeignCAInTheBundleIsDropped(t *testing.T) {
	f := newFixture(t)
	f.check(f.m)
	foreign, err := NewCA("someone-elses-ca", start, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	vwc, _ := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "clipjob-validating", metav1.GetOptions{})
	vwc.Webhooks[0].ClientConfig.CABundle = append(append([]byte{}, vwc.Webhooks[0].ClientConfig.CABundle...), foreign.CertPEM...)
	if _, err := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(context.Background(), vwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.check(f.m)
	for i, b := range f.bundles() {
		for _, c := range ParseBundle(b) {
			if c.Equal(foreign.Cert) {
				t.Errorf("webhook %d still trusts a CA put there by hand", i)
			}
		}
	}
	f.servedTrusted(f.m)
}

// The bundle is published in a ConfigMap of the Paperclip server's
// namespace, which may be made after clipjob: the webhook serves before
// it exists, the ConfigMap comes at the first check after, follows a CA
// rotation, and an idle check writes nothing.
func TestBundlePublishedInAConfigMap(t *testing.T) {
	f := newFixture(t)
	ref, err := ParseObjectRef("paperclip/clipjob-ca")
	if err != nil {
		t.Fatal(err)
	}
	f.m.o.BundleConfigMaps = []ObjectRef{ref}
	// The fake API has no namespaces: the reactor refuses as the API
	// server does until the namespace is made (its lock is held here, so
	// it reads a flag rather than the fake).
	namespaceMade := false
	f.cs.PrependReactor("create", "configmaps", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if !namespaceMade {
			return true, nil, apierrors.NewNotFound(corev1.Resource("namespaces"), "paperclip")
		}
		return false, nil, nil
	})
	if err := f.m.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "ConfigMap paperclip/clipjob-ca") {
		t.Fatalf("check without the namespace: %v; want the ConfigMap named", err)
	}
	f.servedTrusted(f.m) // serving all the same
	namespaceMade = true
	published := func() string {
		t.Helper()
		cm, err := f.cs.CoreV1().ConfigMaps("paperclip").Get(context.Background(), "clipjob-ca", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[BundleKey]
	}
	f.check(f.m)
	if got, want := published(), string(f.secret("clipjob-ca").Data["ca.crt"]); got != want || got == "" {
		t.Fatalf("published %q; want the CA Secret's bundle %q", got, want)
	}
	relay := f.secret("clipjob-relay-tls")
	pair, err := ParseKeyPair(relay.Data[corev1.TLSCertKey], relay.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify([]byte(published()), pair.Cert, "clipjob-relay.clipjob-system.svc", start); err != nil {
		t.Errorf("the published bundle does not trust the relay: %v", err)
	}
	f.cs.ClearActions()
	f.check(f.m)
	if w := writes(f.cs); len(w) != 0 {
		t.Errorf("an idle check wrote %v", w)
	}
	f.clock.SetTime(start.Add(270 * 24 * time.Hour)) // the CA is renewed
	f.check(f.m)
	if got := ParseBundle([]byte(published())); len(got) != 2 {
		t.Errorf("after the CA's renewal the ConfigMap holds %d CAs; want the new and the old", len(got))
	}
}

func TestParseObjectRef(t *testing.T) {
	for _, bad := range []string{"", "x", "/x", "x/", "a/b/c"} {
		if _, err := ParseObjectRef(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Two publishers of one ConfigMap (two releases of clipjob for one
// Paperclip namespace, each with its own CA) each put their own bundle
// back when the other writes theirs: watching it, they would do so as
// fast as the API server answers. A check follows a change at most once
// a second, so they write it a few times a second at most (and the
// chart's policy refuses the other release's writes).
func TestPublishersOfOneConfigMapDoNotFightFlatOut(t *testing.T) {
	mwc, vwc := configurations()
	cs := fake.NewClientset(mwc, vwc)
	ref := ObjectRef{Namespace: "paperclip", Name: "clipjob-ca"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for _, release := range []string{"a", "b"} {
		m, err := New(cs, Options{Namespace: ns, CASecret: release + "-ca",
			Serving:          []Target{{Secret: release + "-webhook-tls", DNSNames: []string{release + "-webhook.clipjob-system.svc"}}},
			BundleConfigMaps: []ObjectRef{ref}, Interval: time.Hour, PropagationDelay: time.Minute, Log: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_ = m.Start(ctx)
			done <- struct{}{}
		}()
	}
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	<-done
	n := 0
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "configmaps" && (a.GetVerb() == "update" || a.GetVerb() == "create") {
			n++
		}
	}
	t.Logf("%d writes of the ConfigMap in 2 s", n)
	if n > 10 {
		t.Errorf("%d writes of the ConfigMap in 2 s: the two publishers fight flat out", n)
	}
}
