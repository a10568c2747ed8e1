package relay

import (
	"context"
	"fmt"
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
)

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
	replicas.RegisterMetrics()
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
	if err := mgr.Add(s.members); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("store", func(*http.Request) error { return s.members.Unreachable("the store") }); err != nil {
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
