package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/dashboard"
	"github.com/paperclipai/clipjob/internal/command"
)

// dashboardCmd serves the runs page on loopback as the viewer, until
// interrupted (the way kubectl proxy and istioctl dashboard do).
func dashboardCmd(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveDashboard(ctx, args, stdout, stderr, nil)
}

// serveDashboard runs the command; ready, when given, gets the page's
// URL once it listens (tests).
func serveDashboard(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(url string)) error {
	fs := flag.NewFlagSet("dashboard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var namespaces command.List
	fs.Var(&namespaces, "namespace", "a namespace whose runs to show (repeatable, or comma-separated; default every namespace, which needs the right to list Jobs cluster-wide)")
	var claimNamespaces command.List
	fs.Var(&claimNamespaces, "claim-namespace", "also read claim Leases here: policy.concurrency.claimNamespace, with scope Cluster (repeatable)")
	address := fs.String("address", "127.0.0.1:8095", "loopback address to serve the page on (the page reads the cluster with your credentials)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
	relayURL := fs.String("relay-url", "", "the relay's API, e.g. https://localhost:8090 after kubectl -n clipjob-system port-forward svc/clipjob-relay 8090:api (empty: no logs, results or costs)")
	tokenFile := fs.String("relay-token-file", "", "a file holding a token for the relay's audience: kubectl create token <serviceaccount> --audience clipjob-relay > token")
	caFile := fs.String("relay-ca-file", "", "PEM CA bundle that signed the relay's serving certificate (default: the system's roots)")
	serverName := fs.String("relay-server-name", "", "the name the relay's certificate is for, when --relay-url reaches it by another (a port-forward to localhost): clipjob-relay.clipjob-system.svc")
	relayLimit := fs.Int("relay-limit", 1000, "how many of the relay's newest runs to show")
	refresh := fs.Duration("refresh", 2*time.Second, "how often the page reads the cluster and the relay again")
	if err := (commonFlags{fs: fs}).parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("dashboard takes no arguments, got %q", fs.Args())}
	}
	if (*relayURL == "") != (*tokenFile == "") {
		return usageError{errors.New("--relay-url and --relay-token-file go together: the relay answers only a token made for its audience")}
	}
	// Loopback only: the page reads the cluster with the viewer's
	// credentials, and its Host check names the address it listens on.
	if host, _, err := net.SplitHostPort(*address); err != nil {
		return usageError{fmt.Errorf("--address %s: %w", *address, err)}
	} else if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return usageError{fmt.Errorf("--address %s: not a loopback address; the page reads the cluster with your credentials: serve it on 127.0.0.1 and reach it from another machine through an SSH tunnel", *address)}
	}
	s := &dashboard.Server{Refresh: *refresh, ClaimNamespaces: claimNamespaces}
	for _, n := range namespaces {
		for _, ns := range strings.Split(n, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				s.Namespaces = append(s.Namespaces, ns)
			}
		}
	}
	if *relayURL != "" {
		client, err := relayClient(*caFile, *serverName)
		if err != nil {
			return err
		}
		if _, err := os.Stat(*tokenFile); err != nil {
			return fmt.Errorf("--relay-token-file: %w", err)
		}
		s.Relay = &dashboard.Relay{URL: *relayURL, TokenFile: *tokenFile, HTTP: client, Limit: *relayLimit}
	}
	rc, err := command.RestConfig(*kubeconfig)
	if err != nil {
		return fmt.Errorf("no Kubernetes API access: %w", err)
	}
	if s.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *address)
	if err != nil {
		return fmt.Errorf("--address %s: %w", *address, err)
	}
	s.Hosts = dashboard.HostsFor(ln.Addr().String())
	// The page's session secret: the Host check keeps other web pages
	// out, this keeps out other users and processes of the machine.
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	s.Token = hex.EncodeToString(token)
	url := "http://" + ln.Addr().String() + "/?token=" + s.Token
	fmt.Fprintf(stdout, "Serving the runs page at %s as %s (Ctrl-C stops it)\n", url, describe(namespaces))
	if ready != nil {
		ready(url)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		_ = srv.Close() // event streams do not end by themselves
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func describe(namespaces []string) string {
	if len(namespaces) == 0 {
		return "your kubeconfig, every namespace"
	}
	return "your kubeconfig, namespaces " + strings.Join(namespaces, ",")
}

// relayClient trusts caFile (else the system's roots) for the relay's
// certificate, checked for serverName (else the URL's host).
// relayTimeout bounds one request to the relay.
const relayTimeout = 15 * time.Second

func relayClient(caFile, serverName string) (*http.Client, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--relay-ca-file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--relay-ca-file %s: no PEM certificate in it", caFile)
		}
	}
	// Every request to the relay is a bounded read (a list, a record, a
	// slice of a log): a relay that accepts and never answers (a stuck
	// port-forward) must not hold the page up.
	return &http.Client{Timeout: relayTimeout, Transport: &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: relayTimeout}}, nil
}
