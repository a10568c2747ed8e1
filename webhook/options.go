package webhook

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/certs"
)

// Options configure Run. DefaultOptions holds every default; the
// command's flags start from it, so a default is written once.
type Options struct {
	// ConfigFile is the clipjob Config to load and watch.
	ConfigFile string
	// ConfigPollInterval between reads of ConfigFile.
	ConfigPollInterval time.Duration
	// CertDir holds tls.crt and tls.key; they are reloaded when they
	// change. Empty means controller-runtime's default,
	// <tmp>/k8s-webhook-server/serving-certs.
	CertDir string
	// Host and Port of the webhook server. An empty Host is all addresses.
	Host string
	Port int
	// MetricsAddr serves Prometheus metrics and /configz; "0" disables.
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz.
	ProbeAddr string
	// PprofAddr serves net/http/pprof for profiling under load; "" (the
	// default) disables it.
	PprofAddr string
	// ShutdownDelay keeps serving after a stop signal, reporting not-ready,
	// so endpoints drop this replica before it closes.
	ShutdownDelay time.Duration
	// LeaderElectionNamespace holds the Lease that elects the one replica
	// running the claim controller. Empty means the pod's namespace
	// (POD_NAMESPACE), else the source namespace.
	LeaderElectionNamespace string
	// SweepInterval between sweeps of stale claims.
	SweepInterval time.Duration
	// Namespaces, when set, are the only namespaces whose agent Jobs and
	// PVCs the webhook caches and whose claims, queued runs and run
	// Secrets its controllers act on, as cert-manager's --namespace
	// scopes it. Two installations in one cluster, each registered for
	// its own namespaces, then never act on each other's runs. Empty
	// means every namespace.
	Namespaces []string
	// CompiledPolicies: the elected replica keeps clipjob's compiled
	// MutatingAdmissionPolicies for the source's namespace current
	// (package admissionpolicies), so the API server completes bare agent
	// Jobs itself.
	CompiledPolicies bool
	// KubeAPIQPS and KubeAPIBurst bound the webhook's own calls to the API
	// server (claims, PVC checks). An admission must never wait on a
	// client-side rate limiter; the API server's priority and fairness is
	// what protects it.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// Certificates, when set, makes the webhook issue, serve and rotate its
	// own certificates and inject their CA (the chart's selfManaged mode)
	// instead of reading CertDir. Its Namespace defaults to the leader
	// election's.
	Certificates *certs.Options
	// RestConfig reaches the API server. Required.
	RestConfig *rest.Config
	// Log is the logger.
	Log logr.Logger
}

// DefaultOptions returns the options of a webhook started with no flags,
// as the chart runs it: everything but RestConfig.
func DefaultOptions() Options {
	return Options{
		ConfigFile:         "/etc/clipjob/config.yaml",
		ConfigPollInterval: 2 * time.Second,
		Port:               9443,
		MetricsAddr:        ":8080",
		ProbeAddr:          ":8081",
		SweepInterval:      time.Minute,
		KubeAPIQPS:         1000,
		KubeAPIBurst:       2000,
		Log:                logr.Discard(),
	}
}

// validate names the first option Run cannot start with.
func (o *Options) validate() error {
	var errs []error
	if o.RestConfig == nil {
		errs = append(errs, errors.New("RestConfig is required"))
	}
	if o.ConfigFile == "" {
		errs = append(errs, errors.New("--config (ConfigFile) is required: the clipjob Config file"))
	}
	if o.Port <= 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port (Port) must be 1-65535, not %d", o.Port))
	}
	if o.ConfigPollInterval <= 0 {
		errs = append(errs, fmt.Errorf("--config-poll-interval (ConfigPollInterval) must be positive, not %s", o.ConfigPollInterval))
	}
	if o.SweepInterval <= 0 {
		errs = append(errs, fmt.Errorf("--claim-sweep-interval (SweepInterval) must be positive, not %s", o.SweepInterval))
	}
	if o.Certificates != nil {
		co := o.certificates("")
		if err := co.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range o.Namespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, fmt.Errorf("--namespace (Namespaces) %q: %s", ns, msg))
		}
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps and --kube-api-burst (KubeAPIQPS, KubeAPIBurst) must be positive, not %g and %d", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	return errors.Join(errs...)
}

// leaderElectionNamespace is where the election Lease (and self-managed
// certificates) live: the flag, else the pod's namespace, else fallback.
func (o *Options) leaderElectionNamespace(fallback string) string {
	if o.LeaderElectionNamespace != "" {
		return o.LeaderElectionNamespace
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return fallback
}

// certificates is a copy of Certificates with its namespace defaulted.
func (o *Options) certificates(sourceNamespace string) certs.Options {
	co := *o.Certificates
	if co.Namespace == "" {
		co.Namespace = o.leaderElectionNamespace(sourceNamespace)
	}
	return co
}
