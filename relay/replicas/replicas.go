// Package replicas decides which relay replica collects which run when
// several relays share one PostgreSQL store.
//
// Each replica keeps a row in the store's table of replicas (Table),
// renewed every RenewInterval to live until the server's now() plus
// LeaseDuration; the live replicas are the rows still ahead of the
// server's now(), so no two relays' clocks are compared, and only the
// relays can write a row. A run belongs to the live replica that
// rendezvous hashing of its run id picks among the members' ids, so all
// the pods of a run, and the runs kept apart under its id, go to one.
// Why this design: docs/design/2026-11-28-relay-ownership.md.
//
// Two replicas may both believe for a moment that they own a run (their
// views differ, or one thawed and has not seen it lapsed); the store
// makes that harmless: a commit is refused unless the stream's stored
// cursor is the one its writer started from.
package replicas

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/relay/store"
)

// Member is a live replica as the store's table of replicas holds it.
type Member = store.Replica

// Table is the store's table of replicas.
type Table = store.ReplicaTable

// Members is this replica's membership and its view of the others. Owns
// is safe to call at any time; Start runs the membership.
type Members struct {
	Table Table
	// Name is this replica's name for people (its pod's). Names need not
	// be unique: two replicas started under one name are two members.
	Name string
	// LeaseDuration: a replica whose row was not renewed for this long is
	// gone, and its runs are taken over. RenewInterval: how often this
	// replica renews its row and reads the others'.
	LeaseDuration, RenewInterval time.Duration
	// Needs are the servers this replica cannot collect without (its
	// store, the API server), each pinged every round, in the background
	// so that a slow one never delays a renewal. After two pings of one in
	// a row failed (one can meet a connection the server closed, which
	// the pool then replaces) the replica leaves, so that the others take
	// its runs over, and owns nothing until that server answers again.
	Needs []Need
	// OnChange, when set, runs after the runs this replica owns may have
	// changed (the members, or its own membership). It runs on the
	// membership's goroutine: the next renewal waits for it.
	OnChange func()
	Log      logr.Logger
	// Clock times the renewals and this replica's own deadline. Default
	// the real clock. The table's times are the server's, never this.
	Clock clock.WithTicker

	mu      sync.Mutex
	needs   []needState // by index of Needs
	id      string
	member  bool
	live    []Member  // the live members, this one included when member; sorted by ID
	ids     []string  // their ids, for Pick
	why     string    // why this replica is not a member, "" when it is
	renewed time.Time // when the last renewal that succeeded was sent, by this replica's clock
	held    bool      // this replica's row may be in the table
	started bool
}

// Need is a server a replica pings; Name is for people ("the store").
type Need struct {
	Name string
	Ping func(context.Context) error
}

type needState struct {
	pinging bool
	fails   int
	last    error
}

// Owns says whether this replica collects the run whose id is key: it is
// a member and the hash picks it among the live members.
func (m *Members) Owns(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.member && Pick(m.ids, key) == m.id
}

// Pick is the member id rendezvous hashing gives key: the one with the
// highest hash of (id, key). "" when there are none. The hash needs no
// secret: the ids are random and only the relays read them (the run ids
// are a tenant's to choose, and a public hash over names a tenant can
// read let it name its Jobs so that one replica collected them all).
func Pick(ids []string, key string) string {
	best, bestScore := "", uint64(0)
	h := sha256.New()
	var sum [sha256.Size]byte
	for _, id := range ids {
		h.Reset()
		h.Write([]byte(id))
		h.Write([]byte{0})
		h.Write([]byte(key))
		s := binary.BigEndian.Uint64(h.Sum(sum[:0]))
		if best == "" || s > bestScore || (s == bestScore && id < best) {
			best, bestScore = id, s
		}
	}
	return best
}

// Status is this replica's membership: whether it collects, the live
// members it sees, and why it is not a member.
func (m *Members) Status() (member bool, live []Member, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.member, slices.Clone(m.live), m.why
}

// Start renews this replica's row and follows the others until ctx ends,
// then deletes its row, so the others take its runs over at once rather
// than after LeaseDuration. It implements manager.Runnable.
func (m *Members) Start(ctx context.Context) error {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("replicas: started twice")
	}
	m.started, m.id, m.needs = true, hex.EncodeToString(id), make([]needState, len(m.Needs))
	m.mu.Unlock()
	if m.Clock == nil {
		m.Clock = clock.RealClock{}
	}
	t := m.Clock.NewTicker(m.RenewInterval)
	defer t.Stop()
	for {
		m.round(ctx)
		select {
		case <-ctx.Done():
			m.leave()
			return nil
		case <-t.C():
		}
	}
}

// round renews (or, unhealthy, deletes) this replica's row, reads the
// live members and updates the view; OnChange runs if it changed.
func (m *Members) round(ctx context.Context) {
	deadline := m.renewDeadline()
	// A slow server may take longer than an interval; past the renew
	// deadline this replica stops collecting anyway.
	rctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	sent := m.Clock.Now()
	why := ""
	if err := m.ping(ctx); err != nil {
		why = err.Error()
	}
	var live []Member
	renewed := false
	if why == "" {
		var err error
		if live, err = m.Table.Renew(rctx, m.id, m.Name, m.LeaseDuration); err != nil {
			m.Log.Error(err, "renewing this relay's row in the table of replicas")
		} else {
			renewed = true
		}
	} else if m.held {
		if err := m.Table.Leave(rctx, m.id); err != nil {
			m.Log.Error(err, "deleting this relay's row from the table of replicas")
		} else {
			m.held = false
		}
	}

	m.mu.Lock()
	if renewed {
		// Its row lives until the server's now() at the renewal plus the
		// duration; the renewal was sent before that now(), so counting
		// from sent, by this replica's clock, ends no later.
		m.renewed, m.held = sent, true
	}
	if why == "" && m.Clock.Since(m.renewed) >= deadline {
		why = fmt.Sprintf("this relay's row in the table of replicas was not renewed for %s: the others take its runs over", deadline)
	}
	member := why == ""
	if !renewed {
		// The others as last seen; this one only while a member.
		live = slices.DeleteFunc(slices.Clone(m.live), func(o Member) bool { return o.ID == m.id })
		if member {
			live = append(live, Member{ID: m.id, Name: m.Name})
		}
	} else if !member {
		live = slices.DeleteFunc(live, func(o Member) bool { return o.ID == m.id })
	}
	slices.SortFunc(live, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	ids := make([]string, len(live))
	for i, o := range live {
		ids[i] = o.ID
	}
	changed := member != m.member || !slices.Equal(ids, m.ids)
	if why != m.why {
		if why != "" {
			m.Log.Info("not collecting", "why", why)
		} else {
			m.Log.Info("collecting its share of the runs", "replicas", names(live))
		}
	}
	m.member, m.live, m.ids, m.why = member, live, ids, why
	m.mu.Unlock()
	if !changed {
		return
	}
	replicasLive.Set(float64(len(live)))
	collecting.Set(map[bool]float64{true: 1, false: 0}[member])
	m.Log.Info("relay replicas changed", "live", names(live), "member", member)
	if m.OnChange != nil {
		m.OnChange()
	}
}

// ping starts a ping of each need that has none in flight, and returns
// why this replica may not collect: a need whose last two pings failed.
func (m *Members) ping(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for i, n := range m.Needs {
		st := &m.needs[i]
		errs = append(errs, st.err(n.Name))
		if st.pinging {
			continue
		}
		st.pinging = true
		go func() {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := n.Ping(pctx)
			cancel()
			m.mu.Lock()
			defer m.mu.Unlock()
			st.pinging = false
			if err == nil {
				st.fails, st.last = 0, nil
			} else if ctx.Err() == nil {
				st.fails, st.last = st.fails+1, err
			}
		}()
	}
	return errors.Join(errs...)
}

// Unreachable says why the need named name does not answer, or nil.
func (m *Members) Unreachable(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, st := range m.needs {
		if m.Needs[i].Name == name {
			return st.err(name)
		}
	}
	return nil
}

func (st needState) err(name string) error {
	if st.fails < 2 {
		return nil
	}
	return fmt.Errorf("%s does not answer: %w", name, st.last)
}

// names are the members' names, for the log.
func names(ms []Member) []string {
	out := make([]string, len(ms))
	for i, o := range ms {
		out[i] = o.Name
	}
	return out
}

// renewDeadline is how long this replica goes on collecting without
// renewing its row: two renewals short of its duration, so that it has
// stopped before the others see the row lapse.
func (m *Members) renewDeadline() time.Duration {
	return max(m.LeaseDuration-2*m.RenewInterval, m.RenewInterval)
}

// leave deletes this replica's row when the relay stops, owning nothing
// from then on.
func (m *Members) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.mu.Lock()
	m.member, m.why = false, "stopping"
	m.mu.Unlock()
	if err := m.Table.Leave(ctx, m.id); err != nil {
		m.Log.Error(err, "deleting this relay's row from the table of replicas")
	}
	if c, ok := m.Table.(interface{ Close() }); ok {
		c.Close()
	}
}

var (
	replicasLive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_replicas",
		Help: "Relay replicas sharing this replica's store it sees live (their rows in the table of replicas renewed), itself included when it collects.",
	})
	collecting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_replica_collecting",
		Help: "1 while this replica collects its share of the runs; 0 while it does not (its store unreachable, its row not renewed, stopping).",
	})
)

// Collectors returns the membership metrics, for a relay that shares its
// store to register: on one that does not they would say it collects
// nothing.
func Collectors() []prometheus.Collector { return []prometheus.Collector{replicasLive, collecting} }
