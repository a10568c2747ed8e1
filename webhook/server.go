package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/admissionpolicies"
	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/runsecret"
)

// Paths the webhook configurations point at.
const (
	MutatePath   = "/mutate-batch-v1-job"
	ValidatePath = "/validate-batch-v1-job"
)

// Run serves the admission webhooks until ctx ends (plus ShutdownDelay).
// It refuses to start on an invalid configuration: there is no previous
// one to keep serving.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("webhook options: %w", err)
	}
	log := o.Log
	store, err := config.LoadStore(o.ConfigFile, time.Now())
	if err != nil {
		return err
	}
	cfg := store.Current()
	registerMetrics()
	recordConfig(cfg, nil)
	log.Info("configuration loaded", "file", o.ConfigFile, "hash", cfg.Hash(),
		"source", cfg.Source.Namespace+"/"+cfg.Source.Deployment, "profiles", cfg.ProfileNames())

	rc := rest.CopyConfig(o.RestConfig)
	rc.QPS, rc.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	clientset, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	mgrCtx, stopping, stop := drainOnStop(ctx, o.ShutdownDelay, log)
	defer stop()

	sources := NewSourceCache(mgrCtx, clientset)
	sources.Watch(cfg.Source)
	var certManager *certs.Manager
	if o.Certificates != nil {
		co := o.certificates(cfg.Source.Namespace)
		co.Log = log.WithName("certificates")
		if certManager, err = certs.New(clientset, co); err != nil {
			return err
		}
	}
	mgr, err := newManager(o, store, cfg.Source.Namespace, certManager)
	if err != nil {
		return err
	}
	if certManager != nil {
		if err := mgr.Add(certManager); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("certificates", certManager.Ready); err != nil {
			return err
		}
	}
	server := mgr.GetWebhookServer() // adds it to the manager's runnables
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return err
	}
	lock := claim.NewLock(clientset)
	lock.Active = claim.CachedActiveRuns(mgr.GetCache())
	server.Register(MutatePath, closeWhileStopping(&admission.Webhook{Handler: &Mutator{Configs: store, Sources: sources}}, stopping))
	server.Register(ValidatePath, closeWhileStopping(&admission.Webhook{Handler: &Validator{Configs: store, Sources: sources,
		PVCs: cachedPVCs(mgr.GetCache(), livePVCs(clientset)), Secrets: liveSecretMeta(meta), Claims: lock}}, stopping))
	pods := &PodValidator{Configs: store, Sources: sources,
		PVCs: cachedPVCs(mgr.GetCache(), livePVCs(clientset)),
		ReplicaSets: func(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
			return clientset.AppsV1().ReplicaSets(ns).Get(ctx, name, metav1.GetOptions{})
		},
		Deployments: func(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
			return clientset.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		}}
	server.Register(PodPath, closeWhileStopping(&admission.Webhook{Handler: pods}, stopping))
	server.Register(ClaimPath, closeWhileStopping(&admission.Webhook{Handler: pods}, stopping))
	controller := &claim.Controller{Jobs: mgr.GetCache(), Client: clientset, Lock: lock, Configs: store,
		Log: log.WithName("claim-controller")}
	if err := controller.SetupWithManager(mgrCtx, mgr, claim.Options{SweepInterval: o.SweepInterval, Namespaces: o.Namespaces}); err != nil {
		return err
	}
	if o.CompiledPolicies {
		if err := mgr.Add(&admissionpolicies.Syncer{Client: clientset.AdmissionregistrationV1(), Configs: store, Sources: sources,
			Owner: o.leaderElectionNamespace(cfg.Source.Namespace), Log: log.WithName("compiled-policies")}); err != nil {
			return err
		}
	}
	secrets := &runsecret.Reconciler{Jobs: mgr.GetCache(), Secrets: runsecret.KubeSecrets{Meta: meta, Client: clientset},
		Shared: func(name string) bool { return config.MatchAny(store.Current().Policy.Secrets.Shared, name) },
		Log:    log.WithName("run-secrets")}
	if err := secrets.SetupWithManager(mgr); err != nil {
		return err
	}
	jobs, err := mgr.GetCache().GetInformer(mgrCtx, &batchv1.Job{})
	if err != nil {
		return err
	}
	pvcs, err := mgr.GetCache().GetInformer(mgrCtx, &corev1.PersistentVolumeClaim{})
	if err != nil {
		return err
	}
	if err := addProbes(mgr, server, sources, map[string]func() bool{"job-cache": jobs.HasSynced, "pvc-cache": pvcs.HasSynced}, stopping); err != nil {
		return err
	}
	go watchConfig(mgrCtx, store, o, sources)
	log.Info("serving admission webhooks", "port", o.Port, "mutate", MutatePath, "validate", ValidatePath, "pods", PodPath, "claims", ClaimPath)
	return mgr.Start(mgrCtx)
}

// agentJobs selects the Jobs that carry the agent label.
var agentJobs = func() labels.Selector {
	req, err := labels.NewRequirement(contract.LabelAgentID, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*req)
}()

// drainOnStop returns the context the manager runs under: it ends delay
// after ctx does, and stopping is set meanwhile, so readiness fails and
// endpoints drop this replica while it still answers admissions.
func drainOnStop(ctx context.Context, delay time.Duration, log logr.Logger) (mgrCtx context.Context, stopping *atomic.Bool, stop func()) {
	stopping = &atomic.Bool{}
	mgrCtx, stop = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-mgrCtx.Done():
			return
		}
		stopping.Store(true)
		if delay > 0 {
			log.Info("stop requested; still serving while endpoints drop this replica", "delay", delay)
			time.Sleep(delay)
		}
		stop()
	}()
	return mgrCtx, stopping, stop
}

// closeWhileStopping answers with Connection: close once the replica is
// stopping: the API server keeps connections to webhooks open, and one
// kept to a replica about to close could carry the next admission into a
// connection reset. Closed after each answer, the API server's next call
// opens a new connection, which the Service sends to a replica still
// ready.
func closeWhileStopping(h http.Handler, stopping *atomic.Bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stopping.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// newManager builds the controller-runtime manager: the TLS webhook
// server, metrics with /configz, probes, and the election of the replica
// that runs the claim controller.
func newManager(o Options, store *config.Store, sourceNamespace string, certManager *certs.Manager) (manager.Manager, error) {
	server := crwebhook.NewServer(crwebhook.Options{
		Host: o.Host, Port: o.Port, CertDir: o.CertDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			// HTTP/2 off: the API server speaks HTTP/1.1 to webhooks anyway,
			// and it closes the Rapid Reset attack surface.
			c.NextProtos = []string{"http/1.1"}
			c.MinVersion = tls.VersionTLS12
			if certManager != nil { // else CertDir, reloaded when it changes
				c.GetCertificate = certManager.GetCertificate
			}
		}},
	})
	leNamespace := o.leaderElectionNamespace(sourceNamespace)
	return manager.New(o.RestConfig, manager.Options{
		Logger: o.Log,
		// The cache holds agent Jobs only, for the claim controller.
		Cache: cache.Options{DefaultNamespaces: namespaces(o.Namespaces), ByObject: map[client.Object]cache.ByObject{
			&batchv1.Job{}: {Label: agentJobs},
			// Every PVC of the cluster is listed: keep only what the
			// policy reads of it, so annotations and managed fields of
			// PVCs clipjob never serves do not fill the webhook's memory.
			&corev1.PersistentVolumeClaim{}: {Transform: pvcEssentials},
		}},
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr, ExtraHandlers: map[string]http.Handler{"/configz": configzHandler(store)}},
		HealthProbeBindAddress: o.ProbeAddr,
		PprofBindAddress:       o.PprofAddr,
		WebhookServer:          server,
		// The webhook serves on every replica; election only picks the
		// replica that releases claims.
		LeaderElection:                true,
		LeaderElectionID:              "clipjob-claim-controller",
		LeaderElectionNamespace:       leNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
}

// namespaces is the cache's namespace scope: nil (every namespace) when
// none is named.
func namespaces(names []string) map[string]cache.Config {
	if len(names) == 0 {
		return nil
	}
	m := make(map[string]cache.Config, len(names))
	for _, ns := range names {
		m[ns] = cache.Config{}
	}
	return m
}

// addProbes: ready once the webhook server is up and the source
// Deployment and agent Jobs listed, and not while draining.
func addProbes(mgr manager.Manager, server crwebhook.Server, sources *SourceCache, caches map[string]func() bool, stopping *atomic.Bool) error {
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
	// The claim checks a run against the agent's other Jobs in the Job
	// cache; the PVC check reads the PVC cache (a miss asks live, but a
	// cold cache would send every admission live).
	for name, synced := range caches {
		if err := mgr.AddReadyzCheck(name, func(*http.Request) error {
			if !synced() {
				return fmt.Errorf("%s not listed yet", name)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// watchConfig applies changes of the config file until ctx ends; a
// refused one is logged and counted, and the previous one keeps serving.
func watchConfig(ctx context.Context, store *config.Store, o Options, sources *SourceCache) {
	log := o.Log
	store.Watch(ctx, o.ConfigFile, config.WatchOptions{
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

// pvcEssentials cuts a cached PVC down to what the volume rules read: its
// name, namespace, identity, access modes, and data source (a clone of the
// shared claim is refused to other pods as the claim is).
func pvcEssentials(obj any) (any, error) {
	pvc, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return obj, nil // a deletion tombstone: as it is
	}
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pvc.Name, Namespace: pvc.Namespace, UID: pvc.UID,
			ResourceVersion: pvc.ResourceVersion, DeletionTimestamp: pvc.DeletionTimestamp},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: pvc.Spec.AccessModes, DataSource: pvc.Spec.DataSource, DataSourceRef: pvc.Spec.DataSourceRef},
	}, nil
}
