package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// AnnotationCACreated records when the CA in a CA Secret was made: serving
// certificates move to it only once the bundle carrying it has had
// PropagationDelay to reach the API server.
const AnnotationCACreated = "clipjob.paperclip.io/ca-created"

// Target is a serving certificate to keep in a Secret.
type Target struct {
	Secret   string
	DNSNames []string
}

// Options configure a Manager. Zero durations take the defaults.
type Options struct {
	// Namespace of the Secrets.
	Namespace string
	// CASecret holds the CA (tls.crt, tls.key) and the bundle of every CA
	// still trusted (ca.crt).
	CASecret string
	// Serving are the certificates to keep. The first is the one this
	// process serves (GetCertificate).
	Serving []Target
	// MutatingWebhooks and ValidatingWebhooks name the configurations whose
	// webhooks get the CA bundle.
	MutatingWebhooks, ValidatingWebhooks []string
	// BundleConfigMaps are ConfigMaps to keep the bundle in (key ca.crt),
	// in other namespaces: a client there (the Paperclip server calling
	// the relay) mounts one to trust the relay, where it could not mount
	// the CA Secret (which holds the CA's key) and no operator has to copy
	// the bundle again at every renewal.
	BundleConfigMaps []ObjectRef
	// CAValidity of a new CA (default 2 years) and CertValidity of a
	// serving certificate (default 90 days); each is renewed when less
	// than a third of it is left.
	CAValidity, CertValidity time.Duration
	// Interval between checks (default 30s).
	Interval time.Duration
	// PropagationDelay is how long a new CA sits in the injected bundle
	// before serving certificates are issued by it (default 30s).
	PropagationDelay time.Duration
	Clock            clock.PassiveClock
	Log              logr.Logger
}

func (o *Options) defaults() {
	if o.CAValidity <= 0 {
		o.CAValidity = 2 * 365 * 24 * time.Hour
	}
	if o.CertValidity <= 0 {
		o.CertValidity = 90 * 24 * time.Hour
	}
	if o.Interval <= 0 {
		o.Interval = 30 * time.Second
	}
	if o.PropagationDelay <= 0 {
		o.PropagationDelay = 30 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// ObjectRef names an object of a namespace.
type ObjectRef struct{ Namespace, Name string }

// ParseObjectRef reads "namespace/name".
func ParseObjectRef(s string) (ObjectRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return ObjectRef{}, fmt.Errorf("%q: want namespace/name", s)
	}
	return ObjectRef{Namespace: ns, Name: name}, nil
}

func (r ObjectRef) String() string { return r.Namespace + "/" + r.Name }

// Validate names what a Manager cannot run without.
func (o *Options) Validate() error {
	var errs []error
	if o.Namespace == "" {
		errs = append(errs, errors.New("certificates: a namespace for the Secrets is required"))
	}
	if o.CASecret == "" {
		errs = append(errs, errors.New("certificates: the CA Secret's name is required (--ca-secret)"))
	}
	if len(o.Serving) == 0 || o.Serving[0].Secret == "" {
		errs = append(errs, errors.New("certificates: the serving Secret's name is required (--cert-secret)"))
	}
	for _, t := range o.Serving {
		if len(t.DNSNames) == 0 {
			errs = append(errs, fmt.Errorf("certificates: Secret %q needs a DNS name (--cert-dns-name)", t.Secret))
		}
	}
	return errors.Join(errs...)
}

// Manager keeps the CA, the serving certificates and the injected bundle,
// and serves the first certificate. It runs on every replica.
type Manager struct {
	client kubernetes.Interface
	o      Options

	served atomic.Pointer[tls.Certificate]
	// ready is nil once the served certificate is trusted by the bundle
	// injected into the webhook configurations.
	ready atomic.Pointer[error]
}

// New returns a Manager for o.
func New(client kubernetes.Interface, o Options) (*Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.defaults()
	m := &Manager{client: client, o: o}
	notYet := errors.New("no serving certificate loaded yet")
	m.ready.Store(&notYet)
	return m, nil
}

// NeedLeaderElection: every replica keeps its own served certificate
// current; the writes are safe under optimistic concurrency.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start checks at once, then every Interval and whenever one of the
// webhook configurations or published ConfigMaps changes (watched by
// name), until ctx ends: a bundle someone blanks or rewrites, or a helm
// upgrade that drops the field, is put back at once. A check that lost a
// write race is retried after a second.
func (m *Manager) Start(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	for _, w := range m.watches() {
		go m.watch(ctx, w, changed)
	}
	for {
		wait, last := m.o.Interval, time.Now()
		if err := m.Check(ctx); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				wait = time.Second
			} else {
				m.o.Log.Error(err, "keeping the certificates")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			// At most a check a second for changes: two publishers of one
			// ConfigMap (two releases for one namespace), or whoever
			// rewrites it in a loop, would otherwise have a check, and a
			// write, for each write.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Until(last.Add(minChangeGap))):
			}
		case <-time.After(wait):
		}
	}
}

// minChangeGap is the least time from a check's start to that of one a
// change wakes.
const minChangeGap = time.Second

type watchFunc func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)

// watches are the watches of the configurations to inject and of the
// ConfigMaps to publish in, by name.
func (m *Manager) watches() []watchFunc {
	var out []watchFunc
	api := m.client.AdmissionregistrationV1()
	for _, name := range m.o.MutatingWebhooks {
		out = append(out, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = "metadata.name=" + name
			return api.MutatingWebhookConfigurations().Watch(ctx, o)
		})
	}
	for _, name := range m.o.ValidatingWebhooks {
		out = append(out, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = "metadata.name=" + name
			return api.ValidatingWebhookConfigurations().Watch(ctx, o)
		})
	}
	// The published bundles too: whoever may write ConfigMaps where one is
	// published could otherwise have the clients there trust a CA of theirs
	// until the next periodic check.
	for _, ref := range m.o.BundleConfigMaps {
		out = append(out, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = "metadata.name=" + ref.Name
			return m.client.CoreV1().ConfigMaps(ref.Namespace).Watch(ctx, o)
		})
	}
	return out
}

// watch signals changed on every event of w, re-opening it when it ends.
func (m *Manager) watch(ctx context.Context, w watchFunc, changed chan<- struct{}) {
	for ctx.Err() == nil {
		wi, err := w(ctx, metav1.ListOptions{})
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.o.Interval): // the periodic check still runs
			}
			continue
		}
		for range wi.ResultChan() {
			select {
			case changed <- struct{}{}:
			default: // a check is due already
			}
		}
		wi.Stop()
	}
}

// GetCertificate serves the first target's certificate (tls.Config).
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := m.served.Load()
	if c == nil {
		return nil, errors.New("no serving certificate yet")
	}
	return c, nil
}

// Ready is a readiness check: ready once the served certificate is one the
// injected bundle trusts.
func (m *Manager) Ready(*http.Request) error { return *m.ready.Load() }

// Check brings the CA, the bundle and the serving certificates up to date,
// in that order, so that no certificate is ever served before its CA is
// trusted.
func (m *Manager) Check(ctx context.Context) error {
	now := m.o.Clock.Now()
	configs, err := m.configurations(ctx)
	if err != nil {
		return err
	}
	ca, bundle, created, err := m.ensureCA(ctx, now, injectedCAs(configs))
	if err != nil {
		return err
	}
	if err := m.inject(ctx, configs, bundle); err != nil {
		return err
	}
	published := m.publish(ctx, bundle)
	propagated := !now.Before(created.Add(m.o.PropagationDelay))
	for i, t := range m.o.Serving {
		pair, err := m.ensureServing(ctx, now, t, ca, bundle, propagated, i == 0)
		if err != nil {
			return err
		}
		if i == 0 && pair != nil {
			m.serve(pair, bundle, t.DNSNames[0], now)
		}
	}
	return published
}

// publish keeps each of BundleConfigMaps holding bundle. Its error does not
// stop the serving certificates' check: a namespace not made yet (the
// operator applies Paperclip's after installing clipjob) must not keep
// the webhook from serving; the next check writes it.
func (m *Manager) publish(ctx context.Context, bundle []byte) error {
	var errs []error
	for _, ref := range m.o.BundleConfigMaps {
		done, err := m.publishIn(ctx, ref, bundle)
		if err != nil {
			errs = append(errs, fmt.Errorf("publishing the CA bundle in ConfigMap %s: %w", ref, err))
			continue
		}
		if done != "" {
			m.o.Log.Info("CA bundle published", "configMap", ref.String(), "how", done)
		}
	}
	return errors.Join(errs...)
}

// publishIn makes ConfigMap ref hold bundle under ca.crt, and nothing else
// there: it says what it did ("" if the bundle was there already). Its
// clients trust whatever ca.crt holds, so one that cannot be made to hold
// the bundle (immutable: made so by whoever wrote it first or last) is
// deleted, only as read and without its finalizers, and made again.
func (m *Manager) publishIn(ctx context.Context, ref ObjectRef, bundle []byte) (string, error) {
	cms := m.client.CoreV1().ConfigMaps(ref.Namespace)
	create := func() error {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Namespace: ref.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "clipjob"}},
			Data: map[string]string{BundleKey: string(bundle)}}, metav1.CreateOptions{})
		return err
	}
	cm, err := cms.Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "created", create()
	}
	if err != nil {
		return "", err
	}
	_, binary := cm.BinaryData[BundleKey]
	if cm.Data[BundleKey] == string(bundle) && !binary {
		return "", nil
	}
	if cm.Immutable != nil && *cm.Immutable {
		// Its finalizers would keep it, and what it holds, past the delete.
		if len(cm.Finalizers) > 0 {
			cm.Finalizers = nil
			if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				return "", fmt.Errorf("it is immutable and holds another bundle; removing its finalizers: %w", err)
			}
		}
		err := cms.Delete(ctx, ref.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion}})
		if err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("it is immutable and holds another bundle; deleting it: %w", err)
		}
		return "made again: it was immutable and held another bundle", create()
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[BundleKey] = string(bundle)
	delete(cm.BinaryData, BundleKey) // a key in both is refused
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return "updated", err
}

// BundleKey is the key of the bundle in the CA Secret and in the
// ConfigMaps it is published in.
const BundleKey = "ca.crt"

func (m *Manager) serve(pair *KeyPair, bundle []byte, dnsName string, now time.Time) {
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		m.ready.Store(&err)
		return
	}
	if old := m.served.Load(); old == nil || !bytes.Equal(old.Certificate[0], cert.Certificate[0]) {
		m.o.Log.Info("serving certificate loaded", "expires", pair.Cert.NotAfter, "issuer", pair.Cert.Issuer.CommonName)
	}
	m.served.Store(&cert)
	err = Verify(bundle, pair.Cert, dnsName, now)
	m.ready.Store(&err)
}

// ensureCA returns the CA to issue with, the bundle to inject and when
// the CA was made, making a new CA if there is none or it nears its end.
// A new CA's bundle keeps every CA still trusted, from the old Secret and
// from what is injected now, so deleting the Secret breaks nothing; after
// that the Secret's bundle alone says what is trusted.
func (m *Manager) ensureCA(ctx context.Context, now time.Time, injected []*x509.Certificate) (*KeyPair, []byte, time.Time, error) {
	secrets := m.client.CoreV1().Secrets(m.o.Namespace)
	sec, err := secrets.Get(ctx, m.o.CASecret, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, time.Time{}, fmt.Errorf("reading CA Secret %s/%s: %w", m.o.Namespace, m.o.CASecret, err)
	}
	found := err == nil
	var current *KeyPair
	trusted := injected
	if found {
		current, _ = ParseKeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
		trusted = append(ParseBundle(sec.Data["ca.crt"]), trusted...)
		if current != nil && renewDue(current.Cert, now) {
			m.o.Log.Info("CA nears its end; making a new one", "expires", current.Cert.NotAfter)
			trusted = append(trusted, current.Cert)
			current = nil
		}
	}
	if current != nil {
		// The Secret's bundle is the record of what is trusted: what the
		// configurations hold besides is not kept (a CA someone put there by
		// hand is dropped at the next check), and an old CA leaves it by
		// expiring, or by being edited out of the Secret's ca.crt.
		created, _ := time.Parse(time.RFC3339, sec.Annotations[AnnotationCACreated])
		bundle := Bundle(now, append([]*x509.Certificate{current.Cert}, ParseBundle(sec.Data["ca.crt"])...)...)
		if !bytes.Equal(bundle, sec.Data["ca.crt"]) { // an old CA expired
			sec.Data["ca.crt"] = bundle
			if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
				return nil, nil, time.Time{}, err
			}
		}
		return current, bundle, created, nil
	}
	ca, err := NewCA("clipjob-ca", now, m.o.CAValidity)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	bundle := Bundle(now, append([]*x509.Certificate{ca.Cert}, trusted...)...)
	data := map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM, "ca.crt": bundle}
	annotations := map[string]string{AnnotationCACreated: now.UTC().Format(time.RFC3339)}
	if found {
		sec.Annotations, sec.Data = annotations, data
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	} else {
		_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: m.o.CASecret, Namespace: m.o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "clipjob"}, Annotations: annotations},
			Type: corev1.SecretTypeTLS, Data: data}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	m.o.Log.Info("new CA made", "secret", m.o.Namespace+"/"+m.o.CASecret, "expires", ca.Cert.NotAfter, "trusted", len(ParseBundle(bundle)))
	return ca, bundle, now, nil
}

// ensureServing keeps target's Secret holding a certificate for its DNS
// names that the bundle trusts and that is not near its end. A new one is
// issued by the current CA; while that CA is too new to be trusted by the
// API server yet, a certificate the bundle still trusts is kept. It
// returns the pair in the Secret (nil if there is none to serve).
func (m *Manager) ensureServing(ctx context.Context, now time.Time, t Target, ca *KeyPair, bundle []byte, propagated, served bool) (*KeyPair, error) {
	secrets := m.client.CoreV1().Secrets(m.o.Namespace)
	sec, err := secrets.Get(ctx, t.Secret, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", m.o.Namespace, t.Secret, err)
	}
	exists := err == nil
	var pair *KeyPair
	if exists {
		pair, _ = ParseKeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	}
	good := pair != nil && slices.Equal(pair.Cert.DNSNames, t.DNSNames) && Verify(bundle, pair.Cert, t.DNSNames[0], now) == nil
	if good && !renewDue(pair.Cert, now) {
		if !bytes.Equal(sec.Data["ca.crt"], bundle) {
			sec.Data["ca.crt"] = bundle
			if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
				return nil, err
			}
		}
		return pair, nil
	}
	if !propagated {
		// A certificate from the new CA could reach a client before the
		// bundle that trusts it: keep what is still trusted a little longer.
		if good {
			return pair, nil
		}
		if c := m.served.Load(); served && c != nil && c.Leaf != nil && Verify(bundle, c.Leaf, t.DNSNames[0], now) == nil {
			return nil, nil
		}
	}
	validity := m.o.CertValidity
	if left := ca.Cert.NotAfter.Sub(now); left < validity {
		validity = left // never outlive the CA
	}
	issued, err := ca.Issue(t.DNSNames, now, validity)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{corev1.TLSCertKey: issued.CertPEM, corev1.TLSPrivateKeyKey: issued.KeyPEM, "ca.crt": bundle}
	if exists {
		sec.Data = data
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	} else {
		_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: t.Secret, Namespace: m.o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "clipjob"}}, Type: corev1.SecretTypeTLS, Data: data}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, err
	}
	m.o.Log.Info("serving certificate issued", "secret", m.o.Namespace+"/"+t.Secret, "dnsNames", t.DNSNames, "expires", issued.Cert.NotAfter)
	return issued, nil
}

// renewDue reports whether less than a third of cert's life is left.
func renewDue(cert *x509.Certificate, now time.Time) bool {
	life := cert.NotAfter.Sub(cert.NotBefore)
	return cert.NotAfter.Sub(now) < life/3
}

// configuration is one webhook configuration as read now: pointers to
// its webhooks' CA bundles, and how to write it back.
type configuration struct {
	kind, name string
	bundles    []*[]byte
	update     func(context.Context) error
}

// configurations reads the webhook configurations to inject; one not
// there yet (the chart creates it) is skipped.
func (m *Manager) configurations(ctx context.Context) ([]configuration, error) {
	var out []configuration
	mutating := m.client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	for _, name := range m.o.MutatingWebhooks {
		c, err := mutating.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", name, err)
		}
		cfg := configuration{kind: "MutatingWebhookConfiguration", name: name,
			update: func(ctx context.Context) error { _, err := mutating.Update(ctx, c, metav1.UpdateOptions{}); return err }}
		for i := range c.Webhooks {
			cfg.bundles = append(cfg.bundles, &c.Webhooks[i].ClientConfig.CABundle)
		}
		out = append(out, cfg)
	}
	validating := m.client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	for _, name := range m.o.ValidatingWebhooks {
		c, err := validating.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", name, err)
		}
		cfg := configuration{kind: "ValidatingWebhookConfiguration", name: name,
			update: func(ctx context.Context) error {
				_, err := validating.Update(ctx, c, metav1.UpdateOptions{})
				return err
			}}
		for i := range c.Webhooks {
			cfg.bundles = append(cfg.bundles, &c.Webhooks[i].ClientConfig.CABundle)
		}
		out = append(out, cfg)
	}
	return out, nil
}

// injectedCAs returns the CAs in the configurations' bundles.
func injectedCAs(configs []configuration) []*x509.Certificate {
	var cas []*x509.Certificate
	for _, c := range configs {
		for _, b := range c.bundles {
			cas = append(cas, ParseBundle(*b)...)
		}
	}
	return cas
}

// inject sets bundle on every webhook of the configurations that lacks it.
func (m *Manager) inject(ctx context.Context, configs []configuration, bundle []byte) error {
	for _, c := range configs {
		changed := false
		for _, b := range c.bundles {
			if !bytes.Equal(*b, bundle) {
				*b, changed = bundle, true
			}
		}
		if !changed {
			continue
		}
		if err := c.update(ctx); err != nil {
			return fmt.Errorf("injecting the CA bundle into %s %s: %w", c.kind, c.name, err)
		}
		m.o.Log.Info("CA bundle injected", "kind", c.kind, "name", c.name)
	}
	return nil
}
