package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/paperclipai/clipjob/contract"
)

// Options configure Serve. Each field's comment gives its default.
type Options struct {
	// DataDir holds the store (a volume that outlives the pod). Required.
	DataDir string
	// Namespaces to collect agent pods from. Default all.
	Namespaces []string
	// APIAddr serves the HTTP API. Default ":8090".
	APIAddr string
	// CertDir holds tls.crt and tls.key for the API, reloaded when they
	// change. Callers send bearer tokens, so serve TLS anywhere but
	// loopback. Default: plain HTTP.
	CertDir string
	// MetricsAddr serves /metrics; ProbeAddr /healthz and /readyz.
	// Default ":8080" and ":8081".
	MetricsAddr, ProbeAddr string
	// MaxStreams bounds open log streams. Default 200.
	MaxStreams int
	Follow     FollowOptions
	// RetentionMaxAge and RetentionMaxBytes bound what is kept of finished
	// runs. Default 7 days, no size bound. RetentionInterval between
	// sweeps. Default 1m.
	RetentionMaxAge   time.Duration
	RetentionMaxBytes int64
	RetentionInterval time.Duration
	// RedactPatterns (regular expressions) and RedactValues (literal
	// secrets) are removed from lines before storage, besides the built-in
	// token patterns.
	RedactPatterns, RedactValues []string
	// MirrorDir, when set, is the shared volume's data directory: each
	// run's agent output is kept as run-logs/<company>/<agent>/<run>.pod.ndjson
	// there, where Paperclip's Claude adapter reads it. Default: off.
	MirrorDir string
	// TokenAudiences a caller's token must be for. Default: the API
	// server's.
	TokenAudiences []string
	RestConfig     *rest.Config
	Log            logr.Logger
}

func (o *Options) setDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.APIAddr, ":8090")
	def(&o.MetricsAddr, ":8080")
	def(&o.ProbeAddr, ":8081")
	if o.RetentionMaxAge == 0 {
		o.RetentionMaxAge = 7 * 24 * time.Hour
	}
	if o.RetentionInterval <= 0 {
		o.RetentionInterval = time.Minute
	}
}

// Serve collects and serves logs until ctx ends, then stops following,
// flushes what it read to the store and closes it.
func Serve(ctx context.Context, o Options) error {
	o.setDefaults()
	if o.DataDir == "" || o.RestConfig == nil {
		return errors.New("relay: DataDir and RestConfig are required")
	}
	log := o.Log
	registerMetrics()
	redact, err := NewRedactor(o.RedactPatterns, o.RedactValues)
	if err != nil {
		return fmt.Errorf("redaction patterns: %w", err)
	}
	store, err := OpenStore(o.DataDir)
	if err != nil {
		return err
	}
	defer store.Close()
	rc := rest.CopyConfig(o.RestConfig)
	rc.QPS, rc.Burst = 100, 200
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}

	namespaces := o.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	listers := map[string]listersv1.PodLister{}
	var synced []cache.InformerSynced
	coll := &Collector{Store: store, Source: APILogSource{Client: client}, Redact: redact, Follow: o.Follow,
		MaxStreams: o.MaxStreams, Log: log.WithName("collector"), Mirror: &Mirror{Dir: o.MirrorDir, Store: store},
		Pods: func(ns, name string) *corev1.Pod {
			l, ok := listers[ns]
			if !ok {
				l = listers[metav1.NamespaceAll]
			}
			if l == nil {
				return nil
			}
			p, err := l.Pods(ns).Get(name)
			if err != nil {
				return nil
			}
			return p
		}}
	// Followers get their own context: on shutdown the servers stop first,
	// then the followers, which flush before the store closes.
	collectCtx, stopCollecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCollecting()
	coll.Start(collectCtx)
	// Every lister is registered before any informer starts: handlers of
	// one namespace read the map while later ones would be added.
	var factories []informers.SharedInformerFactory
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = contract.LabelRunID }))
		inf := f.Core().V1().Pods()
		listers[ns] = inf.Lister()
		_, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { coll.OnPod(obj.(*corev1.Pod)) },
			UpdateFunc: func(_, obj any) { coll.OnPod(obj.(*corev1.Pod)) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if p, ok := obj.(*corev1.Pod); ok {
					coll.OnPodDeleted(p)
				}
			},
		})
		if err != nil {
			return err
		}
		synced = append(synced, inf.Informer().HasSynced)
		factories = append(factories, f)
	}
	for _, f := range factories {
		f.Start(collectCtx.Done())
	}
	ready := func() error {
		for _, s := range synced {
			if !s() {
				return errors.New("pod informer not synced")
			}
		}
		return nil
	}
	go func() {
		if cache.WaitForCacheSync(collectCtx.Done(), synced...) {
			n, err := coll.Reconcile()
			if err != nil {
				log.Error(err, "finishing runs whose pods vanished while the relay was away")
			} else if n > 0 {
				log.Info("finished runs whose pods vanished while the relay was away", "runs", n)
			}
		}
	}()

	api := &API{Store: store, Auth: &KubeAuth{Client: client, Audiences: o.TokenAudiences}, Log: log.WithName("api")}
	// Following log responses end when the relay stops.
	apiCtx, stopAPI := context.WithCancel(context.Background())
	defer stopAPI()
	servers := []*http.Server{
		{Addr: o.APIAddr, Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second,
			BaseContext: func(net.Listener) context.Context { return apiCtx }},
		{Addr: o.MetricsAddr, Handler: promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second},
		{Addr: o.ProbeAddr, Handler: probes(ready), ReadHeaderTimeout: 10 * time.Second},
	}
	if o.CertDir != "" {
		cw, err := certwatcher.New(filepath.Join(o.CertDir, "tls.crt"), filepath.Join(o.CertDir, "tls.key"))
		if err != nil {
			return fmt.Errorf("API certificate: %w", err)
		}
		go func() { _ = cw.Start(collectCtx) }()
		servers[0].TLSConfig = &tls.Config{GetCertificate: cw.GetCertificate, MinVersion: tls.VersionTLS12}
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return err
		}
		if s.TLSConfig != nil {
			ln = tls.NewListener(ln, s.TLSConfig)
		}
		go func() {
			if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	log.Info("relay serving", "api", o.APIAddr, "tls", o.CertDir != "", "namespaces", o.Namespaces, "data", o.DataDir)

	retention := time.NewTicker(o.RetentionInterval)
	defer retention.Stop()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case runErr = <-errc:
			break loop
		case <-retention.C:
			n, err := store.Retain(o.RetentionMaxAge, o.RetentionMaxBytes, time.Now())
			if err != nil {
				log.Error(err, "retention")
			}
			runsRetired.Add(float64(n))
			storeSize.Set(float64(store.Size()))
		}
	}
	log.Info("stopping: closing streams and flushing the store")
	stopAPI()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	stopCollecting()
	coll.Stop()
	return runErr
}

func probes(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}
