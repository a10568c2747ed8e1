package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
)

// divideRuns, for a store several relays share, makes this relay a
// member in the store's table of replicas (package replicas): it collects
// only the runs it owns, hands them over when the members change, stops
// collecting while its store is out of reach, and says so in readiness. With bbolt it does nothing: one
// relay collects every run, as before replicas existed.
func (s *service) divideRuns(mgr manager.Manager, st store.Backend) error {
	if s.opts.Store != StorePostgres {
		return nil
	}
	pg, ok := st.(*postgres.Store)
	if !ok {
		return fmt.Errorf("the %s store keeps no table of the relays sharing it", s.opts.Store)
	}
	replicas.RegisterMetrics()
	o := s.opts.Replicas
	health := &reachable{what: "the store", ping: pg.Ping, interval: o.RenewInterval, log: s.log.WithName("store")}
	// The runs' logs come through the API server: a replica cut off from
	// it but not from the store would keep its row, and its runs, while
	// it can follow none of them.
	api := &reachable{what: "the API server", interval: o.RenewInterval, log: s.log.WithName("api-server"),
		ping: func(ctx context.Context) error {
			return s.client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
		}}
	s.members = &replicas.Members{Table: pg.Replicas(), Name: o.Identity,
		LeaseDuration: o.LeaseDuration, RenewInterval: o.RenewInterval,
		Healthy:  func() error { return errors.Join(health.err(), api.err()) },
		OnChange: s.coll.Rebalance, Log: s.log.WithName("replicas"), Clock: s.opts.Clock}
	s.coll.Owns = s.members.Owns
	if err := mgr.Add(health); err != nil {
		return err
	}
	if err := mgr.Add(api); err != nil {
		return err
	}
	if err := mgr.Add(s.members); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("store", func(*http.Request) error { return health.err() }); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("collecting", s.collectingReady)
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

// reachable pings a server every interval. It is unhealthy after two
// pings in a row failed (one can meet a connection the server closed,
// which the pool then replaces), healthy again after one answered.
type reachable struct {
	what     string // the server, for people: "the store"
	ping     func(context.Context) error
	interval time.Duration
	log      logr.Logger

	mu    sync.Mutex
	fails int
	last  error
}

// err is nil while the server answers, else why it does not.
func (h *reachable) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fails < 2 {
		return nil
	}
	return fmt.Errorf("%s does not answer: %w", h.what, h.last)
}

// Start implements manager.Runnable.
func (h *reachable) Start(ctx context.Context) error {
	wait.UntilWithContext(ctx, h.check, h.interval)
	return nil
}

func (h *reachable) check(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := h.ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	was := h.fails >= 2
	if err != nil {
		h.fails, h.last = h.fails+1, err
	} else {
		h.fails, h.last = 0, nil
	}
	now := h.fails >= 2
	h.mu.Unlock()
	if was != now {
		h.log.Info("reachable", "server", h.what, "reachable", !now, "err", err)
	}
}
