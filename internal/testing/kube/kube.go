// Package kube holds Kubernetes fixtures for tests that need no cluster.
package kube

import (
	"os"
	"path/filepath"
	"testing"
)

// Host and Token are what the kubeconfig from Kubeconfig points at.
const (
	Host  = "https://127.0.0.1:6443"
	Token = "t"
)

// Kubeconfig writes a kubeconfig for Host with a bearer Token and returns
// its path. Nothing listens there: it is for code that reads a kubeconfig,
// not code that calls the API.
func Kubeconfig(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+Host+`"}}]
users: [{name: u, user: {token: `+Token+`}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
