package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/config"
)

// Paths the webhook configurations point at.
const (
	MutatePath   = "/mutate-batch-v1-job"
	ValidatePath = "/validate-batch-v1-job"
)

// Options configure Run. Each field's comment gives its default.
type Options struct {
	// ConfigFile is the clipjob Config to load and watch. Required.
	ConfigFile string
	// ConfigPollInterval between reads of ConfigFile. Default 2s.
	ConfigPollInterval time.Duration
	// CertDir holds tls.crt and tls.key; they are reloaded when they
	// change. Default <tmp>/k8s-webhook-server/serving-certs.
	CertDir string
	// Host and Port of the webhook server. Default all addresses, 9443.
	Host string
	Port int
	// MetricsAddr serves Prometheus metrics and /configz. Default ":8080";
	// "0" disables.
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz. Default ":8081".
	ProbeAddr string
	// ShutdownDelay keeps serving after a stop signal, reporting not-ready,
	// so endpoints drop this replica before it closes. Default 0.
	ShutdownDelay time.Duration
	// LeaderElectionNamespace holds the Lease that elects the one replica
	// running the claim controller. Default: the pod's namespace
	// (POD_NAMESPACE), else the source namespace.
	LeaderElectionNamespace string
	// SweepInterval between sweeps of stale claims. Default 1m.
	SweepInterval time.Duration
	// KubeAPIQPS and KubeAPIBurst bound the webhook's own calls to the API
	// server (claims, PVC checks). An admission must never wait on a
	// client-side rate limiter; the API server's priority and fairness is
	// what protects it. Default 1000 and 2000.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// RestConfig reaches the API server. Required.
	RestConfig *rest.Config
	// Log is the logger. Default: discard.
	Log logr.Logger
}

func (o *Options) setDefaults() {
	if o.Port == 0 {
		o.Port = 9443
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = ":8080"
	}
	if o.ProbeAddr == "" {
		o.ProbeAddr = ":8081"
	}
	if o.KubeAPIQPS == 0 {
		o.KubeAPIQPS = 1000
	}
	if o.KubeAPIBurst == 0 {
		o.KubeAPIBurst = 2000
	}
}

// Run serves the admission webhooks until ctx ends (plus ShutdownDelay).
// It refuses to start on an invalid configuration: there is no previous
// one to keep serving.
func Run(ctx context.Context, o Options) error {
	o.setDefaults()
	if o.RestConfig == nil || o.ConfigFile == "" {
		return errors.New("webhook: RestConfig and ConfigFile are required")
	}
	log := o.Log
	initial, err := os.ReadFile(o.ConfigFile)
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	cfg, err := config.Parse(initial)
	if err != nil {
		return fmt.Errorf("config %s: %w", o.ConfigFile, err)
	}
	registerMetrics()
	recordConfig(cfg, nil)
	store := config.NewStore(cfg, time.Now())
	log.Info("configuration loaded", "file", o.ConfigFile, "hash", cfg.Hash(),
		"source", cfg.Source.Namespace+"/"+cfg.Source.Deployment, "profiles", cfg.ProfileNames())

	rc := rest.CopyConfig(o.RestConfig)
	rc.QPS, rc.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	clientset, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}

	var stopping atomic.Bool
	mgrCtx, stopMgr := context.WithCancel(context.WithoutCancel(ctx))
	defer stopMgr()
	go func() {
		<-ctx.Done()
		stopping.Store(true)
		if o.ShutdownDelay > 0 {
			log.Info("stop requested; still serving while endpoints drop this replica", "delay", o.ShutdownDelay)
			time.Sleep(o.ShutdownDelay)
		}
		stopMgr()
	}()

	sources := NewSourceCache(mgrCtx, clientset)
	sources.Watch(cfg.Source)

	server := crwebhook.NewServer(crwebhook.Options{
		Host: o.Host, Port: o.Port, CertDir: o.CertDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			// HTTP/2 off: the API server speaks HTTP/1.1 to webhooks anyway,
			// and it closes the Rapid Reset attack surface.
			c.NextProtos = []string{"http/1.1"}
			c.MinVersion = tls.VersionTLS12
		}},
	})
	claims := NewClaims(clientset)
	server.Register(MutatePath, &admission.Webhook{Handler: &Mutator{Configs: store, Sources: sources}})
	server.Register(ValidatePath, &admission.Webhook{Handler: &Validator{Configs: store, Sources: sources,
		PVCs: livePVCs(clientset), Claims: claims}})
	leNamespace := o.LeaderElectionNamespace
	if leNamespace == "" {
		leNamespace = os.Getenv("POD_NAMESPACE")
	}
	if leNamespace == "" {
		leNamespace = cfg.Source.Namespace
	}

	mgr, err := manager.New(o.RestConfig, manager.Options{
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr, ExtraHandlers: map[string]http.Handler{"/configz": configzHandler(store)}},
		HealthProbeBindAddress: o.ProbeAddr,
		WebhookServer:          server,
		// The webhook serves on every replica; election only picks the
		// replica that releases claims.
		LeaderElection:                true,
		LeaderElectionID:              "clipjob-claim-controller",
		LeaderElectionNamespace:       leNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(&ClaimController{Client: clientset, Claims: claims, Configs: store,
		SweepInterval: o.SweepInterval, Log: log.WithName("claim-controller")}); err != nil {
		return err
	}
	// GetWebhookServer is what adds the server to the manager's runnables.
	server = mgr.GetWebhookServer()
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	for name, check := range map[string]healthz.Checker{
		"webhook": server.StartedChecker(),
		"source-cache": func(*http.Request) error {
			if !sources.HasSynced() {
				return errors.New("source Deployment not listed yet")
			}
			return nil
		},
		"not-stopping": func(*http.Request) error {
			if stopping.Load() {
				return errors.New("shutting down")
			}
			return nil
		},
	} {
		if err := mgr.AddReadyzCheck(name, check); err != nil {
			return err
		}
	}

	go store.Watch(mgrCtx, o.ConfigFile, initial, config.WatchOptions{
		Interval: o.ConfigPollInterval,
		OnReload: func(c *config.Config, err error) {
			recordConfig(c, err)
			if err != nil {
				log.Error(err, "configuration refused; the previous one keeps serving", "file", o.ConfigFile, "serving", store.Current().Hash())
				return
			}
			sources.Watch(c.Source)
			log.Info("configuration reloaded", "hash", c.Hash(), "source", c.Source.Namespace+"/"+c.Source.Deployment)
		},
	})
	log.Info("serving admission webhooks", "port", o.Port, "mutate", MutatePath, "validate", ValidatePath)
	return mgr.Start(mgrCtx)
}

// configzHandler shows the configuration in force and the last refusal.
// Readiness deliberately does not fail on a refused reload: every replica
// would drop out of the Service at once and, with failurePolicy Fail, block
// all agent Jobs, while the previous configuration is still good to serve.
func configzHandler(store *config.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := store.Status()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"hash":      st.Hash,
			"loadedAt":  st.LoadedAt,
			"refused":   st.Refused,
			"refusedAt": st.RefusedAt,
			"profiles":  store.Current().ProfileNames(),
		})
	})
}
