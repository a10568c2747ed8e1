// Package app is the clipjob-webhook command: its flags, bound to
// webhook.DefaultOptions so each default is written once, and the start of
// webhook.Run with a logger and API access. main only calls Main, so the
// whole command is testable without a cluster.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/internal/command"
	"github.com/paperclipai/clipjob/webhook"
)

// Options are the webhook's options and what the command alone needs.
type Options struct {
	webhook.Options
	command.Server
	// SelfManaged are the flags of self-managed certificates; a
	// --cert-secret turns them on.
	SelfManaged SelfManagedCerts
}

// SelfManagedCerts are the flags of the chart's selfManaged certificates.
type SelfManagedCerts struct {
	CertSecret, CASecret, RelayCertSecret string
	DNSNames, RelayDNSNames               []string
	MutatingWebhooks, ValidatingWebhooks  []string
	// PublishCA are namespace/name of ConfigMaps to keep the CA bundle in.
	PublishCA                       []string
	CheckInterval, PropagationDelay time.Duration
}

// options returns the certs.Options the flags ask for, or nil.
func (c SelfManagedCerts) options() (*certs.Options, error) {
	if c.CertSecret == "" {
		if len(c.PublishCA) > 0 {
			return nil, errors.New("--publish-ca-configmap needs self-managed certificates (--cert-secret)")
		}
		return nil, nil
	}
	o := &certs.Options{CASecret: c.CASecret, Serving: []certs.Target{{Secret: c.CertSecret, DNSNames: c.DNSNames}},
		MutatingWebhooks: c.MutatingWebhooks, ValidatingWebhooks: c.ValidatingWebhooks,
		Interval: c.CheckInterval, PropagationDelay: c.PropagationDelay}
	if c.RelayCertSecret != "" {
		o.Serving = append(o.Serving, certs.Target{Secret: c.RelayCertSecret, DNSNames: c.RelayDNSNames})
	}
	for _, p := range c.PublishCA {
		ref, err := certs.ParseObjectRef(p)
		if err != nil {
			return nil, fmt.Errorf("--publish-ca-configmap: %w", err)
		}
		o.BundleConfigMaps = append(o.BundleConfigMaps, ref)
	}
	return o, nil
}

// NewFlags returns the command's flags bound to o; their defaults are
// o's values.
func NewFlags(o *Options) *flag.FlagSet {
	fs := flag.NewFlagSet("clipjob-webhook", flag.ContinueOnError)
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "clipjob Config file; re-read when it changes")
	fs.DurationVar(&o.ConfigPollInterval, "config-poll-interval", o.ConfigPollInterval, "how often to re-read the config file")
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "directory with tls.crt and tls.key, reloaded on change (default <tmp>/k8s-webhook-server/serving-certs)")
	fs.StringVar(&o.Host, "host", o.Host, "address to serve webhooks on (default all)")
	fs.IntVar(&o.Port, "port", o.Port, "port to serve webhooks on")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, `metrics and /configz address ("0" disables)`)
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr, "/healthz and /readyz address")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, `net/http/pprof address for profiling ("" disables)`)
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "keep serving this long after SIGTERM while reporting not ready")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "namespace of the Lease electing the claim controller (default $POD_NAMESPACE, else the source namespace)")
	fs.Var((*command.List)(&o.Namespaces), "namespace", "act only on agent Jobs, PVCs and claims in this namespace (repeatable; default all): for a second installation in one cluster, registered for its own namespaces")
	fs.DurationVar(&o.SweepInterval, "claim-sweep-interval", o.SweepInterval, "how often to delete claims of finished or vanished Jobs")
	fs.BoolVar(&o.CompiledPolicies, "compiled-policies", o.CompiledPolicies, "keep clipjob's compiled MutatingAdmissionPolicies for the source's namespace current (the elected replica), so the API server completes bare agent Jobs itself (Kubernetes 1.36+)")
	fs.Var((*command.Float32)(&o.KubeAPIQPS), "kube-api-qps", "queries per second to the API server (claims, PVC checks)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "burst of queries to the API server")
	c := &o.SelfManaged
	fs.StringVar(&c.CertSecret, "cert-secret", c.CertSecret, "self-managed certificates: the Secret to keep the serving certificate in (instead of --cert-dir)")
	fs.StringVar(&c.CASecret, "ca-secret", c.CASecret, "self-managed certificates: the Secret to keep the CA in")
	fs.Var((*command.List)(&c.DNSNames), "cert-dns-name", "self-managed certificates: a DNS name of the serving certificate (repeatable; the Service's)")
	fs.Var((*command.List)(&c.MutatingWebhooks), "inject-ca-mutating", "self-managed certificates: a MutatingWebhookConfiguration to inject the CA into (repeatable)")
	fs.Var((*command.List)(&c.ValidatingWebhooks), "inject-ca-validating", "self-managed certificates: a ValidatingWebhookConfiguration to inject the CA into (repeatable)")
	fs.StringVar(&c.RelayCertSecret, "relay-cert-secret", c.RelayCertSecret, "self-managed certificates: also keep the relay's serving certificate in this Secret")
	fs.Var((*command.List)(&c.RelayDNSNames), "relay-cert-dns-name", "self-managed certificates: a DNS name of the relay's certificate (repeatable)")
	fs.Var((*command.List)(&c.PublishCA), "publish-ca-configmap", "self-managed certificates: a ConfigMap (namespace/name) to keep the CA bundle in, key ca.crt, for a client of the relay in that namespace (repeatable)")
	fs.DurationVar(&c.CheckInterval, "cert-check-interval", c.CheckInterval, "self-managed certificates: how often to check them (default 30s)")
	fs.DurationVar(&c.PropagationDelay, "cert-propagation-delay", c.PropagationDelay, "self-managed certificates: how long a new CA is trusted before certificates are issued by it (default 30s)")
	o.Server.BindFlags(fs)
	return fs
}

// Parse returns the options that args select, starting from the defaults.
func Parse(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{Options: webhook.DefaultOptions()}
	fs := NewFlags(o)
	if err := command.ParseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	var err error
	if o.Certificates, err = o.SelfManaged.options(); err != nil {
		return nil, err
	}
	return o, nil
}

// Main runs the command with args and returns the process exit code: 0
// after a clean stop, 1 when run fails or the API is out of reach, 2 on a
// usage error. run is webhook.Run outside tests.
func Main(ctx context.Context, args []string, stderr io.Writer, run func(context.Context, webhook.Options) error) int {
	var o *Options
	return command.ServerMain(ctx, "clipjob-webhook", stderr, func() (*command.Server, error) {
		var err error
		if o, err = Parse(args, stderr); err != nil {
			return nil, err
		}
		return &o.Server, nil
	}, func(ctx context.Context, log logr.Logger, cfg *rest.Config) error {
		o.Log, o.RestConfig = log, cfg
		return run(ctx, o.Options)
	})
}
