package integration

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestHostileTenantCannotPlantACAInThePublishedBundle: the webhook
// publishes clipjob's CA bundle beside the Paperclip server as the
// ConfigMap clipjob-ca (certificates.publishCAConfigMap), which the server
// mounts and trusts the relay by (CLIPJOB_RELAY_CA_FILE, re-read at every
// call). A tenant who may write ConfigMaps in that namespace tries to make
// the server trust a CA of theirs: by making the ConfigMap first,
// immutable and with a finalizer (so deleting it leaves it there), or with
// the bundle under binaryData, so the webhook can never put its bundle
// there; and by rewriting it after the webhook has, in
// every way an update allows, to stand until the webhook's next check
// (30 s by default; an hour here, so only a watch can put it back).
// The webhook's bundle must be back within a second or so each time (a
// check follows a change at most a second after the last); and with
// the chart's policy (certificates.publishCAConfigMap's
// ValidatingAdmissionPolicy) each write is refused while the webhook's
// own still go through.
func TestHostileTenantCannotPlantACAInThePublishedBundle(t *testing.T) {
	// Not in parallel: the CA Secret is the release namespace's, one for
	// the cluster, as in TestSelfManagedCertificates.
	in := addInstall(t, harness.InstallOptions{NoWebhook: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "clipjob-ca"
	evil, err := certs.NewCA("tenant", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tenant := tenantClient(in, ctx, t, "tenant", rule("", "configmaps", "get", "list", "create", "update", "patch", "delete"))
	admin := suite.cs
	// Immutable, and kept by a finalizer of the tenant's past its deletion.
	squat := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{"tenant.example.com/keep"}},
		Immutable: ptr.To(true), Data: map[string]string{certs.BundleKey: string(evil.CertPEM)}}

	// The webhook's bundle: the CA Secret's, once it is there.
	bundle := func() string {
		s, err := admin.CoreV1().Secrets(harness.SystemNamespace).Get(ctx, "clipjob-ca", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return string(s.Data[certs.BundleKey])
	}
	// holds says whether the ConfigMap gives the server the webhook's
	// bundle and nothing else under ca.crt.
	holds := func() (bool, string) {
		cm, err := admin.CoreV1().ConfigMaps(in.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if _, ok := cm.BinaryData[certs.BundleKey]; ok {
			return false, "ca.crt under binaryData"
		}
		if b := bundle(); b == "" || cm.Data[certs.BundleKey] != b {
			return false, "ca.crt is not the webhook's bundle"
		}
		return true, ""
	}
	restored := func(what string, within time.Duration) {
		t.Helper()
		start := time.Now()
		var why string
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, within, true, func(context.Context) (bool, error) {
			var ok bool
			ok, why = holds()
			return ok, nil
		}); err != nil {
			t.Errorf("%s: the ConfigMap still does not hold the webhook's bundle after %s (%s): the Paperclip server trusts what it holds", what, within, why)
			return
		}
		t.Logf("%s: the webhook's bundle back after %s", what, time.Since(start).Round(time.Millisecond))
	}

	// Made first, immutable, with the tenant's CA.
	if _, err := tenant.CoreV1().ConfigMaps(in.Namespace).Create(ctx, squat, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--leader-election-namespace", harness.SystemNamespace,
		"--cert-secret", "clipjob-webhook-tls", "--ca-secret", "clipjob-ca", "--cert-dns-name", "localhost",
		"--publish-ca-configmap", in.Namespace + "/" + name, "--cert-check-interval", "1h", "--cert-propagation-delay", "3s"}
	wh, err := in.StartReplica(ctx, in.Namespace+"-webhook-publish", flags...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wh.Stop)
	restored("made first, immutable, with a finalizer, holding another CA", 30*time.Second)

	// Rewritten after the webhook published it. The replica's next
	// periodic check is an hour away: only a watch puts it back.
	rewrites := []struct {
		what string
		edit func(*corev1.ConfigMap)
	}{
		{"ca.crt rewritten", func(cm *corev1.ConfigMap) { cm.Data = map[string]string{certs.BundleKey: string(evil.CertPEM)} }},
		{"the webhook's bundle with another CA added", func(cm *corev1.ConfigMap) { cm.Data[certs.BundleKey] += string(evil.CertPEM) }},
		{"ca.crt moved to binaryData", func(cm *corev1.ConfigMap) {
			cm.Data, cm.BinaryData = nil, map[string][]byte{certs.BundleKey: evil.CertPEM}
		}},
		{"ca.crt rewritten and made immutable", func(cm *corev1.ConfigMap) {
			cm.Data, cm.Immutable = map[string]string{certs.BundleKey: string(evil.CertPEM)}, ptr.To(true)
		}},
	}
	for _, r := range rewrites {
		if ok, why := holds(); !ok {
			t.Fatalf("before %q: %s", r.what, why)
		}
		if err := rewrite(ctx, tenant, in.Namespace, name, r.edit); err != nil {
			t.Fatalf("%s: %v", r.what, err)
		}
		restored(r.what, 10*time.Second)
	}
	if err := tenant.CoreV1().ConfigMaps(in.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	restored("deleted", 10*time.Second)

	// The chart's policy stops the writes themselves: the tenant may no
	// longer make, rewrite or delete it, and the webhook still writes it
	// (a new CA's bundle, made by a replica started after the CA Secret is
	// deleted).
	if err := in.ApplyCABundlePolicy(ctx); err != nil {
		t.Fatal(err)
	}
	cms := tenant.CoreV1().ConfigMaps(in.Namespace)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := cms.Create(ctx, squat, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), nil
	}); err != nil {
		t.Fatal("with the chart's policy the tenant may still create the CA bundle's ConfigMap")
	}
	for _, r := range rewrites {
		if err := rewrite(ctx, tenant, in.Namespace, name, r.edit); !apierrors.IsForbidden(err) {
			t.Errorf("%s, with the chart's policy: %v; want it forbidden", r.what, err)
		}
	}
	if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("deleted, with the chart's policy: %v; want it forbidden", err)
	}
	wh.Stop()
	if err := admin.CoreV1().Secrets(harness.SystemNamespace).Delete(ctx, "clipjob-ca", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wh, err = in.StartReplica(ctx, in.Namespace+"-webhook-publish-again", flags...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wh.Stop)
	restored("a new CA, with the chart's policy", 20*time.Second)
}

// rewrite reads the ConfigMap and writes edit's change to it.
func rewrite(ctx context.Context, cs kubernetes.Interface, ns, name string, edit func(*corev1.ConfigMap)) error {
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	edit(cm)
	_, err = cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}
