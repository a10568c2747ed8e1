package webhook

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/templates"
)

// SourceCache serves the source Deployment from an informer watching that
// one object, so admission never calls the API server. When the configured
// source moves (another namespace or name), the informer is replaced.
type SourceCache struct {
	client kubernetes.Interface
	// SyncTimeout bounds how long a request waits for a new informer's
	// first list. Default 3s, well inside the webhook's timeout.
	SyncTimeout time.Duration

	mu      sync.Mutex
	watched config.Source // namespace and name of the running informer
	store   cache.Store
	synced  cache.InformerSynced
	stop    context.CancelFunc
	ctx     context.Context

	memo struct {
		sync.Mutex
		rv, cfgHash string
		inh         *templates.Inherited
		hashes      *templates.TemplateHashes
		err         error
	}
}

var _ InheritedSource = (*SourceCache)(nil)

// NewSourceCache returns a cache whose informers live until ctx ends.
func NewSourceCache(ctx context.Context, client kubernetes.Interface) *SourceCache {
	return &SourceCache{client: client, ctx: ctx, SyncTimeout: 3 * time.Second}
}

// Watch starts (or moves) the informer for src.
func (s *SourceCache) Watch(src config.Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.store != nil && s.watched.Namespace == src.Namespace && s.watched.Deployment == src.Deployment {
		return
	}
	if s.stop != nil {
		s.stop()
	}
	ctx, stop := context.WithCancel(s.ctx)
	lw := cache.NewListWatchFromClient(s.client.AppsV1().RESTClient(), "deployments", src.Namespace,
		fields.OneTermEqualSelector("metadata.name", src.Deployment))
	inf := cache.NewSharedIndexInformer(lw, &appsv1.Deployment{}, 0, cache.Indexers{})
	go inf.Run(ctx.Done())
	s.watched, s.store, s.synced, s.stop = src, inf.GetStore(), inf.HasSynced, stop
}

// HasSynced reports whether the informer has listed the source once.
func (s *SourceCache) HasSynced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced != nil && s.synced()
}

// Inherited implements InheritedSource. It computes the inherited values
// once per source resourceVersion and configuration, and keeps the template
// hashes of that pair beside them.
func (s *SourceCache) Inherited(ctx context.Context, cfg *config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
	s.Watch(cfg.Source)
	s.mu.Lock()
	store, synced := s.store, s.synced
	s.mu.Unlock()
	ref := cfg.Source.Namespace + "/" + cfg.Source.Deployment
	if !synced() {
		wait, cancel := context.WithTimeout(ctx, s.SyncTimeout)
		defer cancel()
		if !cache.WaitForCacheSync(wait.Done(), synced) {
			sourceAvailable.Set(0)
			return nil, nil, &templates.SourceError{Source: ref, Reason: "not listed yet (is the API server reachable, and may clipjob get deployments in namespace " + cfg.Source.Namespace + "?)"}
		}
	}
	obj, ok, err := store.GetByKey(ref)
	if err != nil || !ok {
		sourceAvailable.Set(0)
		return nil, nil, &templates.SourceError{Source: ref, Reason: "not found; deploy Paperclip there or set source.namespace and source.deployment in the clipjob config"}
	}
	d, isDeployment := obj.(*appsv1.Deployment)
	if !isDeployment {
		return nil, nil, fmt.Errorf("source cache holds %T, not a Deployment", obj)
	}

	s.memo.Lock()
	defer s.memo.Unlock()
	if s.memo.rv == d.ResourceVersion && s.memo.cfgHash == cfg.Hash() {
		return s.memo.inh, s.memo.hashes, s.memo.err
	}
	inh, err := templates.InheritFromDeployment(d, cfg.Source)
	s.memo.rv, s.memo.cfgHash, s.memo.inh, s.memo.hashes, s.memo.err = d.ResourceVersion, cfg.Hash(), inh, &templates.TemplateHashes{}, err
	if err != nil {
		sourceAvailable.Set(0)
	} else {
		sourceAvailable.Set(1)
	}
	return inh, s.memo.hashes, err
}
