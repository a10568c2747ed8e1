package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/e2e/harness"
)

func servedSerial(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, suite.cluster.CA.TLSConfig())
	if err != nil {
		t.Fatalf("TLS to the webhook: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestServingCertHotReload replaces the serving certificate the way a
// Secret volume update does (new files swapped in atomically): the webhook
// serves the new one without a restart, and admission keeps working.
func TestServingCertHotReload(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	before := servedSerial(t, in.Webhook.Addr)
	kp, err := suite.cluster.CA.Serving("clipjob-webhook-rotated", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(kp.CertPEM)
	cert, _ := x509.ParseCertificate(block.Bytes)
	want := cert.SerialNumber.String()

	staging := filepath.Join(filepath.Dir(in.Webhook.CertDir), "certs-next")
	if err := kp.WriteTLS(staging); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.key", "tls.crt"} {
		if err := os.Rename(filepath.Join(staging, f), filepath.Join(in.Webhook.CertDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	got := before
	for time.Now().Before(deadline) && got != want {
		time.Sleep(200 * time.Millisecond)
		got = servedSerial(t, in.Webhook.Addr)
	}
	if got != want {
		t.Fatalf("still serving serial %s two minutes on, want the new %s", got, want)
	}
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-after-rotation"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("admission after rotation: %v", err)
	}
}

// servedCert returns the certificate served at addr, without trusting it.
func servedCert(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reading what is served
	if err != nil {
		t.Fatalf("TLS to %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// injectedBundles returns the CA bundle of every registered webhook.
func injectedBundles(in *harness.Install, ctx context.Context, t *testing.T) [][]byte {
	t.Helper()
	mwc, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, in.MutatingWebhookName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vwc, err := suite.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, in.ValidatingWebhookName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, w := range mwc.Webhooks {
		out = append(out, w.ClientConfig.CABundle)
	}
	for _, w := range vwc.Webhooks {
		out = append(out, w.ClientConfig.CABundle)
	}
	return out
}

// TestSelfManagedCertificates: a replica run as the chart runs it by
// default (certificates.mode selfManaged, with the chart's RBAC) issues a
// CA and its serving certificate into Secrets and injects the CA into the
// webhook configurations, and admissions go through it. Deleting both
// Secrets while a loop creates Jobs (a forced rotation) makes a new CA and
// certificate with zero failed admissions.
func TestSelfManagedCertificates(t *testing.T) {
	// Alone: the certificates' Secrets are the release namespace's, one
	// pair for the cluster, and the chart lets the webhook inject its CA
	// into its own configurations only, by their names.
	in := addInstall(t, harness.InstallOptions{AsTheRelease: true})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	// The chart's names: its RBAC lets the webhook read these Secrets and no others.
	const caSecret, certSecret = "clipjob-ca", "clipjob-webhook-tls"
	t.Cleanup(func() {
		if err := in.Register(context.Background(), harness.RegisterOptions{}); err != nil {
			t.Error(err)
		}
	})
	wh, err := in.StartReplica(ctx, in.Namespace+"-webhook-selfmanaged", "--leader-election-namespace", harness.SystemNamespace,
		"--cert-secret", certSecret, "--ca-secret", caSecret, "--cert-dns-name", "localhost",
		"--inject-ca-mutating", in.MutatingWebhookName(), "--inject-ca-validating", in.ValidatingWebhookName(),
		"--cert-check-interval", "5s", "--cert-propagation-delay", "3s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wh.Stop) // before the registration is put back
	addr := strings.Replace(wh.Addr, "127.0.0.1", "localhost", 1)
	if err := in.Register(ctx, harness.RegisterOptions{Addr: addr}); err != nil {
		t.Fatal(err)
	}
	trusted := func(cert *x509.Certificate) bool {
		for _, b := range injectedBundles(in, ctx, t) {
			if certs.Verify(b, cert, "localhost", time.Now()) != nil {
				return false
			}
		}
		return true
	}
	first := servedCert(t, wh.Addr)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return trusted(first), nil
	}); err != nil {
		t.Fatalf("the webhook configurations never trusted the self-managed certificate; see %s", wh.Log)
	}

	// The loop admits before the Secrets go, and goes on admitting once
	// the new certificate is served: conditions, not seconds.
	stop := make(chan struct{})
	ok, failed, lastErr, done := in.AdmissionLoop(ctx, t, "e2e-rotation", stop)
	if !harness.Reaches(ctx, ok, 5) {
		close(stop)
		<-done
		t.Fatalf("the admission loop never got going (%d failed, last %v)", failed.Load(), lastErr.Load())
	}
	for _, s := range []string{caSecret, certSecret} {
		if err := suite.cs.CoreV1().Secrets(harness.SystemNamespace).Delete(ctx, s, metav1.DeleteOptions{}); err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
	}
	var rotated *x509.Certificate
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		rotated = servedCert(t, wh.Addr)
		return len(rotated.AuthorityKeyId) > 0 && !bytes.Equal(rotated.AuthorityKeyId, first.AuthorityKeyId), nil
	})
	after := err == nil && harness.Reaches(ctx, ok, ok.Load()+10) // admissions on the new certificate
	close(stop)
	<-done
	t.Logf("forced rotation: %d admissions, %d failed", ok.Load(), failed.Load())
	if err != nil {
		t.Fatalf("no certificate from a new CA after the Secrets were deleted; see %s", wh.Log)
	}
	if !after {
		t.Errorf("admissions stopped after the rotation (%d so far); see %s", ok.Load(), wh.Log)
	}
	if failed.Load() != 0 {
		t.Errorf("%d admissions failed during the rotation; last: %v", failed.Load(), lastErr.Load())
	}
	if ok.Load() < 10 {
		t.Errorf("only %d admissions during the rotation: the loop did not run", ok.Load())
	}
	if !trusted(rotated) || !trusted(first) {
		t.Error("after the rotation the bundle must trust the new certificate and still the old CA's")
	}

	// A bundle someone blanks is put back at once (the replica watches
	// its configurations), not at the next periodic check: a replica of
	// the same install whose periodic check is an hour away puts it back,
	// so only its watch can have.
	wh.Stop()
	watcher, err := in.StartReplica(ctx, in.Namespace+"-webhook-selfmanaged-watch", "--leader-election-namespace", harness.SystemNamespace,
		"--cert-secret", certSecret, "--ca-secret", caSecret, "--cert-dns-name", "localhost",
		"--inject-ca-mutating", in.MutatingWebhookName(), "--inject-ca-validating", in.ValidatingWebhookName(),
		"--cert-check-interval", "1h", "--cert-propagation-delay", "3s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watcher.Stop)
	// Twice: the first blank may meet the replica's start-up check; the
	// second comes after a check, with only the watch left to see it.
	vwcs := suite.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	for round := 1; round <= 2; round++ {
		vwc, err := vwcs.Get(ctx, in.ValidatingWebhookName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range vwc.Webhooks {
			vwc.Webhooks[i].ClientConfig.CABundle = nil
		}
		if _, err := vwcs.Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		blanked := time.Now()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			return trusted(rotated), nil
		}); err != nil {
			t.Fatalf("blank %d: the CA bundle was not put back (the replica's periodic check is an hour away; its watch did not); see %s", round, watcher.Log)
		}
		t.Logf("blank %d: bundle re-injected after %s", round, time.Since(blanked).Round(time.Millisecond))
	}
}
