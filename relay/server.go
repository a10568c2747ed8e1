package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/relay/api"
	"github.com/paperclipai/clipjob/relay/collect"
	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/redact"
	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/postgres"
)

// Serve collects and serves logs until ctx ends, then stops the API,
// stops following (flushing what was read) and closes the store, in that
// order. Metrics, probes and the pod informers run on a controller-runtime
// manager, like the webhook's.
func Serve(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("relay options: %w", err)
	}
	registerMetrics(o.Store == StorePostgres)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	redactor, err := redact.New(o.RedactPatterns, o.RedactValues)
	if err != nil {
		return fmt.Errorf("redaction patterns: %w", err)
	}
	var values *redact.ValuesFile
	if o.RedactValuesFile != "" {
		values = &redact.ValuesFile{Path: o.RedactValuesFile, Redactor: redactor, Static: o.RedactValues,
			Interval: o.RedactValuesInterval, Log: o.Log.WithName("redact"), Clock: o.Clock}
		if err := values.Load(); err != nil {
			return err
		}
	}
	store, err := openStore(ctx, o)
	if err != nil {
		return err
	}
	defer store.Close() // last: after the manager has stopped every runnable
	rc := rest.CopyConfig(o.RestConfig)
	rc.QPS, rc.Burst = 100, 200
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	// Log streams have a client of their own, with bounded HTTP/2 windows
	// (logClient).
	logs, err := logClient(rc)
	if err != nil {
		return err
	}
	// Reviews of callers' tokens get their own rate limit: a flood of API
	// requests must not starve log collection of API calls, nor the other
	// way round.
	arc := rest.CopyConfig(o.RestConfig)
	arc.QPS, arc.Burst = 20, 50
	authClient, err := kubernetes.NewForConfig(arc)
	if err != nil {
		return err
	}
	mgr, err := newManager(o)
	if err != nil {
		return err
	}
	// Collection runs from before the first pod event until the service
	// stops it, after the API (see service.Start).
	collectCtx, stopCollecting := context.WithCancel(context.WithoutCancel(ctx))
	svc := &service{opts: o, store: store, client: client, authClient: authClient, log: o.Log,
		collectCtx: collectCtx, stopCollecting: stopCollecting}
	svc.coll = &collect.Collector{Store: store, Source: collect.APILogSource{Client: logs}, Redact: redactor, Follow: o.Follow,
		MaxStreams: o.MaxStreams, Log: o.Log.WithName("collector"), Clock: o.Clock,
		Mirror: &mirror.Mirror{Dir: o.MirrorDir, Base: o.MirrorBase, Store: store, Clock: o.Clock},
		Pods:   podCache{mgr.GetCache()}, JobFailure: jobFailure(client), PodGone: podGone(client)}
	svc.coll.Start(collectCtx)
	if err := svc.divideRuns(mgr, store); err != nil {
		return err
	}
	// If the service never ran its ordered stop: followers end, then flush,
	// then (deferred first) the store closes.
	defer svc.coll.Stop()
	defer stopCollecting()
	pods, err := mgr.GetCache().GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	_, err = pods.AddEventHandler(podEvents(svc.coll))
	// The API listens only once the manager starts the service, after
	// the caches synced: ready before that, a restarted relay refused its
	// first clients' connections (seen by the fleet benchmark).
	err = errors.Join(err, mgr.AddHealthzCheck("ping", healthz.Ping), mgr.AddReadyzCheck("api", svc.apiReady),
		mgr.AddReadyzCheck("pod-informer", func(*http.Request) error {
			if !pods.HasSynced() {
				return errors.New("pod informer not synced")
			}
			return nil
		}), mgr.Add(svc))
	if values != nil {
		err = errors.Join(err, mgr.Add(values))
	}
	if err != nil {
		return err
	}
	o.Log.Info("relay serving", "api", o.APIAddr, "tls", o.CertDir != "", "namespaces", o.Namespaces, "store", o.Store, "data", o.DataDir)
	return mgr.Start(ctx)
}

// openStore opens the store o chooses.
func openStore(ctx context.Context, o Options) (store.Backend, error) {
	if o.Store == StorePostgres {
		url, err := o.postgresURL()
		if err != nil {
			return nil, err
		}
		s, err := postgres.Open(ctx, postgres.Options{ConnString: url, Schema: o.PostgresSchema, Clock: o.Clock})
		if err != nil {
			return nil, err // not a nil *postgres.Store in a Backend
		}
		return s, nil
	}
	s, err := bolt.Open(o.DataDir)
	if err != nil {
		return nil, err
	}
	s.Clock = o.Clock
	return s, nil
}

// newManager serves metrics and probes, and caches the pods of agent runs
// in the namespaces collected from.
func newManager(o Options) (manager.Manager, error) {
	runPods, err := labels.NewRequirement(contract.LabelRunID, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	co := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.NewSelector().Add(*runPods), Transform: slimPod},
	}}
	if len(o.Namespaces) > 0 {
		co.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.Namespaces {
			co.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return manager.New(o.RestConfig, manager.Options{
		Logger:                 o.Log,
		Cache:                  co,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress: o.ProbeAddr,
		PprofBindAddress:       o.PprofAddr,
	})
}

// slimPod keeps of a pod, before the cache stores it, what the relay
// reads: its metadata but managed fields and annotations, its containers'
// names, and its status. The rest of an agent pod's spec (the env,
// volumes, mounts and security context the webhook injects) was most of
// the informer's share of the relay's heap, for every pod of every run.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{TypeMeta: pod.TypeMeta, ObjectMeta: pod.ObjectMeta, Status: pod.Status}
	slim.ManagedFields, slim.Annotations = nil, nil
	names := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i].Name = c.Name
		}
		return out
	}
	slim.Spec.InitContainers, slim.Spec.Containers = names(pod.Spec.InitContainers), names(pod.Spec.Containers)
	return slim, nil
}

// podEvents hands pod events to the collector; it only starts and stops
// followers, it writes nothing to the API.
func podEvents(coll *collect.Collector) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { coll.OnPod(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { coll.OnPod(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				coll.OnPod(p)
			}
		},
	}
}

// service is the relay's own work as one manager runnable: collection, the
// API and retention. It owns the shutdown order that correctness needs.
type service struct {
	opts       Options
	store      store.Backend
	client     kubernetes.Interface
	authClient kubernetes.Interface
	coll       *collect.Collector
	log        logr.Logger
	// collectCtx is the followers' context, ended by stopCollecting.
	collectCtx     context.Context
	stopCollecting context.CancelFunc
	// listening: the API accepts connections.
	listening atomic.Bool
	// members divides the runs among the relays sharing a PostgreSQL
	// store; nil with bbolt (this relay collects every run).
	members *replicas.Members
}

// apiReady is the readiness of the API: listening.
func (s *service) apiReady(*http.Request) error {
	if !s.listening.Load() {
		return errors.New("API not listening yet")
	}
	return nil
}

// divideRuns, for a store several relays share, makes this relay a
// member in the store's table of replicas (package replicas): it collects
// only the runs it owns, hands them over when the members change, stops
// collecting while its store or the API server is out of reach, and says
// so in readiness. With bbolt it does nothing: one relay collects every
// run, as before replicas existed.
func (s *service) divideRuns(mgr manager.Manager, st store.Backend) error {
	if s.opts.Store != StorePostgres {
		return nil
	}
	pg, ok := st.(*postgres.Store)
	if !ok {
		return fmt.Errorf("the %s store keeps no table of the relays sharing it", s.opts.Store)
	}
	table, err := pg.Replicas()
	if err != nil {
		return err
	}
	o := s.opts.Replicas
	s.members = &replicas.Members{Table: table, Name: o.Identity,
		LeaseDuration: o.LeaseDuration, RenewInterval: o.RenewInterval,
		Needs: []replicas.Need{{Name: "the store", Ping: pg.Ping},
			// The runs' logs come through the API server: a replica cut
			// off from it but not from the store would keep its row, and
			// its runs, while it can follow none of them.
			{Name: "the API server", Ping: func(ctx context.Context) error {
				return s.client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
			}}},
		OnChange: s.coll.Rebalance, Log: s.log.WithName("replicas"), Clock: s.opts.Clock}
	s.coll.Owns = s.members.Owns
	return errors.Join(mgr.Add(s.members), mgr.AddReadyzCheck("collecting", s.collectingReady),
		mgr.AddReadyzCheck("store", func(*http.Request) error { return s.members.Unreachable("the store") }))
}

// collectingReady: this relay collects its share of the runs.
func (s *service) collectingReady(*http.Request) error {
	member, _, why := s.members.Status()
	if !member {
		if why == "" {
			why = "joining the relays sharing the store"
		}
		return fmt.Errorf("not collecting: %s", why)
	}
	return nil
}

// podCache is the informer's cache of agent pods, as the collector reads
// it.
type podCache struct{ cache.Cache }

func (c podCache) Pod(ns, name string) *corev1.Pod {
	var p corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		return nil
	}
	return &p
}

func (c podCache) Pods() ([]corev1.Pod, error) {
	var l corev1.PodList
	err := c.List(context.Background(), &l)
	return l.Items, err
}

// Start implements manager.Runnable; the manager starts it once the pod
// cache has synced. Until ctx ends it collects, serves the API and applies
// retention; then it stops, in this order:
//  1. the API, so no reader waits on a run that has stopped changing;
//  2. collection: followers stop and flush what they read to the store.
//
// Serve closes the store once the manager returns.
func (s *service) Start(ctx context.Context) error {
	s.coll.Sweep() // the runs whose pods vanished while the relay was away
	stopAPI, serveErr, err := s.serveAPI(s.collectCtx)
	if err != nil {
		return err
	}
	runErr := s.retainUntil(ctx, serveErr)

	s.log.Info("stopping: closing streams and flushing the store")
	s.listening.Store(false)
	stopAPI(s.opts.ShutdownTimeout)
	s.stopCollecting()
	s.coll.Stop()
	return runErr
}

// retainUntil applies retention every RetentionInterval until ctx ends or
// the API server fails, and returns that failure.
func (s *service) retainUntil(ctx context.Context, serveErr <-chan error) error {
	t := s.opts.Clock.NewTicker(s.opts.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-serveErr:
			return err
		case <-t.C():
			gone, err := s.store.Retain(s.opts.RetentionMaxAge, s.opts.RetentionMaxBytes, s.opts.Clock.Now())
			if err != nil {
				s.log.Error(err, "retention")
			}
			for i := range gone {
				// The mirror follows the store's retention.
				if err := s.coll.Mirror.Remove(&gone[i]); err != nil {
					s.log.Error(err, "removing a retired run's mirror files", "run", gone[i].ID)
				}
			}
			runsRetired.Add(float64(len(gone)))
			s.forgetRetired()
			storeSize.Set(float64(s.store.Size()))
		}
	}
}

// forgetRetired forgets the retired runs whose pods are all gone.
func (s *service) forgetRetired() {
	if n, err := s.coll.ForgetRetired(s.opts.Namespaces); err != nil {
		s.log.Error(err, "forgetting retired runs whose pods are gone")
	} else if n > 0 {
		s.log.V(1).Info("forgot retired runs whose pods are gone", "runs", n)
	}
}

// serveAPI listens on APIAddr (TLS with a reloading certificate when
// CertDir is set) and serves until stopped; a serving failure arrives on
// the channel.
func (s *service) serveAPI(ctx context.Context) (stop func(timeout time.Duration), _ <-chan error, _ error) {
	if len(s.opts.TokenAudiences) == 0 {
		s.log.Info("WARNING: accepting callers' tokens for the API server's audience: a token sent to the relay works against the API server too; set --token-audience")
	}
	api := &api.API{Store: s.store, Auth: &api.KubeAuth{Client: s.authClient, Audiences: s.opts.TokenAudiences, Clock: s.opts.Clock},
		Log: s.log.WithName("api"), Clock: s.opts.Clock}
	reqCtx, cancel := context.WithCancel(context.Background())
	srv := &http.Server{Addr: s.opts.APIAddr, Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return reqCtx }}
	ln, err := net.Listen("tcp", s.opts.APIAddr)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if s.opts.CertDir != "" {
		cw, err := certwatcher.New(filepath.Join(s.opts.CertDir, "tls.crt"), filepath.Join(s.opts.CertDir, "tls.key"))
		if err != nil {
			cancel()
			_ = ln.Close()
			return nil, nil, fmt.Errorf("API certificate: %w", err)
		}
		go func() { _ = cw.Start(ctx) }()
		ln = tls.NewListener(ln, &tls.Config{GetCertificate: cw.GetCertificate, MinVersion: tls.VersionTLS12})
	}
	errc := make(chan error, 1)
	s.listening.Store(true)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	return func(timeout time.Duration) {
		cancel() // the responses that follow a run would hold Shutdown for its whole timeout
		ctx, done := context.WithTimeout(context.Background(), timeout)
		defer done()
		_ = srv.Shutdown(ctx)
	}, errc, nil
}

// podGone asks the API server whether a pod is gone, or is now another
// pod of the same name.
func podGone(cs kubernetes.Interface) collect.PodGone {
	return func(ctx context.Context, ns, name string, uid types.UID) (bool, error) {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return pod.UID != uid, nil
	}
}

// jobFailure reads a Job's Failed condition reason live.
func jobFailure(cs kubernetes.Interface) collect.JobFailure {
	return func(ctx context.Context, ns, name string) (string, error) {
		job, err := cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", client.IgnoreNotFound(err)
		}
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				return c.Reason, nil
			}
		}
		return "", nil
	}
}

var (
	storeSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_store_bytes", Help: "Size of the store file.",
	})
	runsRetired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_runs_deleted_total", Help: "Runs deleted by retention.",
	})
	registerOnce, registerReplicas sync.Once
)

// registerMetrics adds the relay's metrics to controller-runtime's
// registry, which the manager serves on /metrics; the replicas' only with
// a store several relays share.
func registerMetrics(shared bool) {
	registerOnce.Do(func() {
		for _, cs := range [][]prometheus.Collector{{storeSize, runsRetired}, postgres.Collectors(), collect.Collectors(), mirror.Collectors(), redact.Collectors()} {
			metrics.Registry.MustRegister(cs...)
		}
	})
	if shared {
		registerReplicas.Do(func() { metrics.Registry.MustRegister(replicas.Collectors()...) })
	}
}
