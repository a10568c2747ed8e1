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

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/paperclipai/clipjob/internal/command"
	"github.com/paperclipai/clipjob/webhook"
)

// Options are the webhook's options and what the command alone needs.
type Options struct {
	webhook.Options
	// Kubeconfig is a kubeconfig file; empty means in-cluster, else
	// $KUBECONFIG or ~/.kube/config.
	Kubeconfig string
	Zap        zap.Options
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
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "keep serving this long after SIGTERM while reporting not ready")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "namespace of the Lease electing the claim controller (default $POD_NAMESPACE, else the source namespace)")
	fs.DurationVar(&o.SweepInterval, "claim-sweep-interval", o.SweepInterval, "how often to delete claims of finished or vanished Jobs")
	fs.Var((*command.Float32)(&o.KubeAPIQPS), "kube-api-qps", "queries per second to the API server (claims, PVC checks)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "burst of queries to the API server")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file (default in-cluster, else $KUBECONFIG or ~/.kube/config)")
	o.Zap.BindFlags(fs)
	return fs
}

// Parse returns the options that args select, starting from the defaults.
func Parse(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{Options: webhook.DefaultOptions()}
	fs := NewFlags(o)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: clipjob-webhook takes only flags", fs.Args())
	}
	return o, nil
}

// Main runs the command with args and returns the process exit code: 0
// after a clean stop, 1 when run fails or the API is out of reach, 2 on a
// usage error. run is webhook.Run outside tests.
func Main(ctx context.Context, args []string, stderr io.Writer, run func(context.Context, webhook.Options) error) int {
	o, err := Parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "clipjob-webhook:", err)
		return 2
	}
	o.Zap.DestWriter = stderr
	o.Log = zap.New(zap.UseFlagOptions(&o.Zap))
	ctrl.SetLogger(o.Log)
	if o.RestConfig, err = command.RestConfig(o.Kubeconfig); err != nil {
		fmt.Fprintln(stderr, "clipjob-webhook: no Kubernetes API access:", err)
		return 1
	}
	if err := run(ctx, o.Options); err != nil {
		o.Log.Error(err, "clipjob-webhook stopped")
		return 1
	}
	return 0
}
