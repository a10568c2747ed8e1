package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func servedSerial(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, env.cluster.CA.TLSConfig())
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
	ctx := ctxT(t)
	before := servedSerial(t, env.webhook.Addr)
	kp, err := env.cluster.CA.Serving("clipjob-webhook-rotated", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(kp.CertPEM)
	cert, _ := x509.ParseCertificate(block.Bytes)
	want := cert.SerialNumber.String()

	staging := filepath.Join(filepath.Dir(env.webhook.CertDir), "certs-next")
	if err := kp.WriteTLS(staging); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.key", "tls.crt"} {
		if err := os.Rename(filepath.Join(staging, f), filepath.Join(env.webhook.CertDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	got := before
	for time.Now().Before(deadline) && got != want {
		time.Sleep(200 * time.Millisecond)
		got = servedSerial(t, env.webhook.Addr)
	}
	if got != want {
		t.Fatalf("still serving serial %s after 30s, want the new %s", got, want)
	}
	if _, err := env.cs.BatchV1().Jobs(ns).Create(ctx, bareJob(t, "e2e-after-rotation"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("admission after rotation: %v", err)
	}
}
