package app

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDashboardFlags: the relay's URL without a token (or the reverse)
// is a usage error naming both flags.
func TestDashboardFlags(t *testing.T) {
	for _, args := range [][]string{
		{"dashboard", "--relay-url", "https://localhost:8090"},
		{"dashboard", "--relay-token-file", "token"},
	} {
		var stderr bytes.Buffer
		if code := Main(args, nil, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--relay-url and --relay-token-file go together") {
			t.Errorf("%v: exit %d, %s", args, code, stderr.String())
		}
	}
	// Served beyond loopback, the page would read the cluster with the
	// viewer's credentials for whoever reaches it.
	for _, addr := range []string{"0.0.0.0:8095", ":8095", "192.0.2.1:8095"} {
		var stderr bytes.Buffer
		if code := Main([]string{"dashboard", "--address", addr}, nil, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "not a loopback address") {
			t.Errorf("--address %s: exit %d, %s", addr, code, stderr.String())
		}
	}
}

// TestDashboardServesThePageOnLoopback: the command serves the page on
// the address it was given, until its context ends.
func TestDashboardServesThePageOnLoopback(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	var stdout bytes.Buffer
	go func() {
		done <- serveDashboard(ctx, []string{"--address", "127.0.0.1:0", "--kubeconfig", kubeconfig, "--namespace", "paperclip"},
			&stdout, io.Discard, func(url string) { urls <- url })
	}()
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		t.Fatalf("the command ended before serving: %v", err)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<title>clipjob runs</title>") {
		t.Errorf("GET %s: %s %.200s", url, resp.Status, body)
	}
	// Another user of the machine reaches loopback too, without the
	// printed URL's token.
	bare, _, _ := strings.Cut(url, "?")
	if resp, err := http.Get(bare + "api/runs"); err != nil {
		t.Error(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the page's API without the session's token: %s, want 401", resp.Status)
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.Contains(url, "?token=") || !strings.Contains(stdout.String(), "namespaces paperclip") {
		t.Errorf("url %s, said %q", url, stdout.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("stopping: %v", err)
	}
}
