package realnode

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/paperclipai/clipjob/e2e/harness"
)

var certificatesGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}

// TestChartWithCertManagerOnTheRealNode: the chart in certManager mode
// against cert-manager's own controller and cainjector (built from the
// module proxy, run against the local control plane): cert-manager issues
// the webhook's serving certificate from the chart's self-signed CA and
// injects that CA into both webhook configurations; the webhook pods serve
// it and admit a bare Job; a forced renewal (as `cmctl renew` does) while
// a loop creates agent Jobs fails none, and the webhook ends up serving the
// renewed certificate. On a first run make test builds cert-manager
// beside the tier, and this test waits for that build
// (hack/cert-manager/build.sh holds a lock).
func TestChartWithCertManagerOnTheRealNode(t *testing.T) {
	requireRealNode(t)
	t.Parallel() // a release and an agent namespace of its own
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cm, err := harness.StartCertManager(ctx, suite.cluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cm.Stop)
	r := installRelease(ctx, t, "cm", func(ns string) map[string]any {
		values := inClusterValues(ns)
		values["certificates"] = map[string]any{"mode": "certManager"}
		return values
	})

	release := r.Namespace
	ca, err := suite.cs.CoreV1().Secrets(release).Get(ctx, r.Name+"-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cert-manager made no CA Secret: %v", err)
	}
	m, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.mutating(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(m.Webhooks[0].ClientConfig.CABundle, bytes.TrimSpace(ca.Data["tls.crt"])) {
		t.Errorf("the injected bundle is not cert-manager's CA")
	}

	certName := r.Name + "-webhook"
	certs := dynamic.NewForConfigOrDie(suite.cluster.Config).Resource(certificatesGVR).Namespace(release)
	// Ready comes before the first issuance has settled (revision set, no
	// Issuing condition left True); cmctl refuses to renew until then too.
	waitCertificate(ctx, t, certs, certName, func(rev int64, issuing bool) bool { return rev >= 1 && !issuing })
	before := r.servedLeaf(ctx, t)

	stop := make(chan struct{})
	ok, failed, lastErr, done := r.in.AdmissionLoop(ctx, t, "e2e-certmanager-renew", stop)
	waitAdmitted(ctx, t, ok, 20)
	renew(ctx, t, certs, certName)
	waitCertificate(ctx, t, certs, certName, func(rev int64, issuing bool) bool { return rev >= 2 && !issuing })
	// The kubelet brings the renewed Secret into the pods within its sync
	// period; the webhook then serves it.
	var after *x509.Certificate
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		after = r.servedLeaf(ctx, t)
		return !after.Equal(before), nil
	})
	waitAdmitted(ctx, t, ok, ok.Load()+20)
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("the webhook still serves the certificate from before the renewal (serial %s): %v", before.SerialNumber, err)
	}
	t.Logf("renewal under load: serial %s -> %s; %d admitted, %d failed", before.SerialNumber, after.SerialNumber, ok.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d of %d creates failed during the renewal; last: %v", failed.Load(), ok.Load()+failed.Load(), lastErr.Load())
	}
	if ok.Load() < 20 {
		t.Errorf("only %d creates ran during the renewal", ok.Load())
	}
}

// waitCertificate waits until the Certificate is Ready and done(revision,
// an Issuing=True condition present) holds.
func waitCertificate(ctx context.Context, t *testing.T, certs dynamic.ResourceInterface, name string, done func(int64, bool) bool) {
	t.Helper()
	var last *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		crt, err := certs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = crt
		rev, _, _ := unstructured.NestedInt64(crt.Object, "status", "revision")
		conds, _, _ := unstructured.NestedSlice(crt.Object, "status", "conditions")
		ready, issuing := false, false
		for _, c := range conds {
			cond, _ := c.(map[string]any)
			if cond["type"] == "Ready" && cond["status"] == "True" {
				ready = true
			}
			if cond["type"] == "Issuing" && cond["status"] == "True" {
				issuing = true
			}
		}
		return ready && done(rev, issuing), nil
	})
	if err != nil {
		t.Fatalf("Certificate %s: %v; last status %v", name, err, last)
	}
}

// renew triggers a renewal as `cmctl renew` does: an Issuing=True
// condition, reason ManuallyTriggered, through the status subresource.
func renew(ctx context.Context, t *testing.T, certs dynamic.ResourceInterface, name string) {
	t.Helper()
	crt, err := certs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(crt.Object, "status", "conditions")
	issuing := map[string]any{"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
		"message": "Certificate re-issuance manually triggered", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
	replaced := false
	for i, c := range conds {
		if c.(map[string]any)["type"] == "Issuing" {
			conds[i], replaced = issuing, true
		}
	}
	if !replaced {
		conds = append(conds, issuing)
	}
	if err := unstructured.SetNestedSlice(crt.Object, conds, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.UpdateStatus(ctx, crt, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// servedLeaf is the certificate the webhook Service serves now.
func (r *chartRelease) servedLeaf(ctx context.Context, t *testing.T) *x509.Certificate {
	t.Helper()
	svc, err := suite.cs.CoreV1().Services(r.Namespace).Get(ctx, r.Name+"-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port)),
		&tls.Config{InsecureSkipVerify: true}) // the leaf is compared, not trusted
	if err != nil {
		t.Fatalf("dialing the webhook Service: %v", err)
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	return leaf
}
