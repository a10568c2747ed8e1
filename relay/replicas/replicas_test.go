package replicas_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/internal/testing/poll"
	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// group is replicas sharing one PostgreSQL schema.
type group struct {
	t      *testing.T
	conn   string
	schema string
	store  *postgres.Store
}

func newGroup(t *testing.T) *group {
	conn, schema := pgtest.Schema(t)
	s, err := postgres.Open(context.Background(), postgres.Options{ConnString: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &group{t: t, conn: conn, schema: schema, store: s}
}

// table is a replica's table of replicas, which the test can cut off
// (every statement fails: the replica lost its connection) or freeze
// (a renewal hangs, whatever its context says, until thawed: the
// replica's process stopped, as by SIGSTOP, mid-renewal).
type table struct {
	replicas.Table
	cut    atomic.Bool
	mu     sync.Mutex
	frozen chan struct{} // non-nil while frozen; closed to thaw
	// changes receives the replica's view each time it changed, as its
	// OnChange saw it (the replica may change it again before a test
	// asks for its Status); while one is unread, later ones are dropped.
	changes chan view
}

// view is a replica's view at a change: whether it collects, and why not.
type view struct {
	member bool
	why    string
}

// table is a replica's table of replicas on its own connection, closed
// when the test ends.
func (g *group) table() *table {
	tab, err := g.store.Replicas()
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(tab.Close)
	return &table{Table: tab, changes: make(chan view, 1)}
}

func (t *table) Renew(ctx context.Context, id, name string, ttl time.Duration) ([]replicas.Member, error) {
	t.mu.Lock()
	frozen := t.frozen
	t.mu.Unlock()
	if frozen != nil {
		<-frozen
	}
	if t.cut.Load() {
		return nil, errors.New("cut off from PostgreSQL")
	}
	return t.Table.Renew(ctx, id, name, ttl)
}

func (t *table) Leave(ctx context.Context, id string) error {
	if t.cut.Load() {
		return errors.New("cut off from PostgreSQL")
	}
	return t.Table.Leave(ctx, id)
}

func (t *table) freeze() {
	t.mu.Lock()
	t.frozen = make(chan struct{})
	t.mu.Unlock()
}

func (t *table) thaw() {
	t.mu.Lock()
	close(t.frozen)
	t.frozen = nil
	t.mu.Unlock()
}

// member starts a replica named name; it stops (deleting its row) when
// the test ends or stop is called.
func (g *group) member(name string, needs ...replicas.Need) (m *replicas.Members, tab *table, stop func()) {
	tab = g.table()
	m = &replicas.Members{Table: tab, Name: name, LeaseDuration: 1200 * time.Millisecond, RenewInterval: 200 * time.Millisecond,
		Needs: needs, Log: logr.Discard(), OnChange: func() {
			// OnChange runs on the goroutine that changes the view, so
			// Status here is the view that changed.
			member, _, why := m.Status()
			select {
			case tab.changes <- view{member, why}:
			default:
			}
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Start(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	g.t.Cleanup(stop)
	return m, tab, stop
}

// rows are the names in the schema's table of replicas.
func (g *group) rows() []string {
	db, err := pgx.Connect(context.Background(), g.conn)
	if err != nil {
		g.t.Fatal(err)
	}
	defer db.Close(context.Background())
	r, err := db.Query(context.Background(), `SELECT name FROM `+pgx.Identifier{g.schema}.Sanitize()+`.replicas ORDER BY name`)
	if err != nil {
		g.t.Fatal(err)
	}
	names, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		g.t.Fatal(err)
	}
	return names
}

// keys are run ids to divide.
var keys = func() []string {
	var k []string
	for i := range 300 {
		k = append(k, fmt.Sprintf("run-%d", i))
	}
	return k
}()

// liveNames are the names of the live members m sees.
func liveNames(m *replicas.Members) []string {
	_, live, _ := m.Status()
	var out []string
	for _, o := range live {
		out = append(out, o.Name)
	}
	slices.Sort(out)
	return out
}

// waitOwners waits until every key is owned by exactly one of ms and
// the members among them see exactly the live set want (by name).
func waitOwners(t *testing.T, want []string, ms ...*replicas.Members) map[string]int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		owners, ok := map[string]int{}, true
		for _, m := range ms {
			member, _, _ := m.Status()
			if member != slices.Contains(want, m.Name) || member && !slices.Equal(liveNames(m), want) {
				ok = false
			}
		}
		for _, k := range keys {
			n := 0
			for _, m := range ms {
				if m.Owns(k) {
					n++
					owners[m.Name]++
				}
			}
			if n != 1 && len(want) > 0 || n != 0 && len(want) == 0 {
				ok = false
			}
		}
		if ok {
			return owners
		}
		if time.Now().After(deadline) {
			var st []string
			for _, m := range ms {
				member, _, why := m.Status()
				st = append(st, fmt.Sprintf("%s: member %v live %v why %q", m.Name, member, liveNames(m), why))
			}
			t.Fatalf("after a minute the runs are not divided among %v: %v", want, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMembersDivideTheRuns: three replicas each own a share of the runs,
// and every run has exactly one owner; when one loses its connection to
// PostgreSQL (its row renewed no more) the others divide its runs once
// its row lapses by the server's clock, and keep their own, and it owns
// nothing; back, it gets its share back; one that stops deletes its row,
// so its runs move at the others' next renewal.
func TestMembersDivideTheRuns(t *testing.T) {
	g := newGroup(t)
	a, _, _ := g.member("a")
	b, _, stopB := g.member("b")
	c, cTable, _ := g.member("c")
	all := []*replicas.Members{a, b, c}
	owners := waitOwners(t, []string{"a", "b", "c"}, all...)
	for _, name := range []string{"a", "b", "c"} {
		if owners[name] < 50 {
			t.Errorf("replica %s owns %d of %d runs: a share, not a third, but not this few", name, owners[name], len(keys))
		}
	}
	before := map[string]*replicas.Members{}
	for _, k := range keys {
		for _, m := range all {
			if m.Owns(k) {
				before[k] = m
			}
		}
	}

	cTable.cut.Store(true)
	start := time.Now()
	waitOwners(t, []string{"a", "b"}, all...)
	t.Logf("runs of a replica cut off from PostgreSQL taken over in %s (lease 1.2s, renewal 0.2s)", time.Since(start).Round(10*time.Millisecond))
	if _, _, why := c.Status(); why == "" {
		t.Error("the replica cut off from PostgreSQL says nothing of why it does not collect")
	}
	for _, k := range keys {
		if before[k] != c && !before[k].Owns(k) {
			t.Fatalf("run %s moved from %s though its replica lives on", k, before[k].Name)
		}
	}

	cTable.cut.Store(false)
	waitOwners(t, []string{"a", "b", "c"}, all...)
	stopB()
	// Its runs move at the others' next renewal, not after the row's
	// duration, because the row is gone once the stop returns (asserted
	// on the table, not on elapsed time, which a busy machine stretches).
	if rows := g.rows(); !slices.Equal(rows, []string{"a", "c"}) {
		t.Errorf("rows after b stopped: %v: its runs would move only when its row lapses", rows)
	}
	waitOwners(t, []string{"a", "c"}, a, c)
}

// TestAFrozenReplicaLosesItsRuns: a replica stopped mid-renewal (SIGSTOP,
// a paused VM) still believes it owns its runs, since it cannot run to
// learn otherwise; by the server's clock its row lapses and the others
// take its runs. Thawed, it first sees that it lapsed and owns nothing
// (its commits meanwhile are refused by the stream cursors, which the
// new owners moved), then renews and takes its share back.
func TestAFrozenReplicaLosesItsRuns(t *testing.T) {
	g := newGroup(t)
	a, _, _ := g.member("a")
	b, _, _ := g.member("b")
	c, cTable, _ := g.member("c")
	waitOwners(t, []string{"a", "b", "c"}, a, b, c)
	var mine []string
	for _, k := range keys {
		if c.Owns(k) {
			mine = append(mine, k)
		}
	}
	cTable.freeze()
	waitOwners(t, []string{"a", "b"}, a, b)
	stale := 0
	for _, k := range mine {
		if c.Owns(k) {
			stale++
		}
	}
	if stale != len(mine) {
		t.Fatalf("the frozen replica ran on: it owns %d of its %d runs", stale, len(mine))
	}
	t.Logf("the others took the frozen replica's %d runs while it still believed it owned them", len(mine))
	select {
	case <-cTable.changes: // a change from before the freeze
	default:
	}
	cTable.thaw()
	var first view
	select {
	case first = <-cTable.changes:
	case <-time.After(time.Minute):
		t.Fatal("a minute after the thaw the replica's view has not changed")
	}
	if first.member || first.why == "" {
		t.Errorf("the thawed replica's first view: member %v (%q), want none: its row lapsed", first.member, first.why)
	}
	waitOwners(t, []string{"a", "b", "c"}, a, b, c)
}

// TestAnUnhealthyReplicaLeaves: a replica whose store does not answer
// owns nothing and deletes its row, so the others take its runs at once;
// healthy again, it takes its share back. One failed ping (a connection
// the server closed, which the pool replaces) leaves it collecting; two
// in a row make it leave, naming the store's error.
func TestAnUnhealthyReplicaLeaves(t *testing.T) {
	g := newGroup(t)
	var failing, pings atomic.Int64 // pings still to fail; pings made
	a, _, _ := g.member("a")
	b, bTable, _ := g.member("b", replicas.Need{Name: "the store", Ping: func(context.Context) error {
		pings.Add(1)
		if failing.Load() > 0 {
			failing.Add(-1)
			return errors.New("connection refused")
		}
		return nil
	}})
	waitOwners(t, []string{"a", "b"}, a, b)
	select {
	case <-bTable.changes: // b joining
	default:
	}
	failing.Store(1)
	poll.WaitFor(t, func() bool { return failing.Load() == 0 }, "the failing ping never came")
	after := pings.Load()
	poll.WaitFor(t, func() bool { return pings.Load() > after+1 }, "no pings after the failed one")
	if err := b.Unreachable("the store"); err != nil {
		t.Fatalf("unreachable after one failed ping: %v", err)
	}
	select {
	case <-bTable.changes:
		t.Fatal("one failed ping changed b's membership")
	default:
	}
	failing.Store(1 << 30)
	waitOwners(t, []string{"a"}, a, b)
	if _, _, why := b.Status(); why != "the store does not answer: connection refused" {
		t.Errorf("why b does not collect: %q", why)
	}
	if err := b.Unreachable("the store"); err == nil {
		t.Error("pings failing, the store reachable")
	}
	if rows := g.rows(); !slices.Equal(rows, []string{"a"}) {
		t.Errorf("rows while b is unhealthy: %v", rows)
	}
	failing.Store(0)
	waitOwners(t, []string{"a", "b"}, a, b)
}

// TestTwoReplicasOfOneNameAreTwoMembers: names are for people; two
// replicas started under one name (a copied --replica-id) are two members
// that divide the runs, neither taking the other's membership.
func TestTwoReplicasOfOneNameAreTwoMembers(t *testing.T) {
	g := newGroup(t)
	a, _, _ := g.member("relay-0")
	b, _, _ := g.member("relay-0")
	owners := waitOwners(t, []string{"relay-0", "relay-0"}, a, b)
	if owners["relay-0"] != len(keys) {
		t.Fatalf("owned %d of %d runs", owners["relay-0"], len(keys))
	}
	n := 0
	for _, k := range keys {
		if a.Owns(k) {
			n++
		}
	}
	if n == 0 || n == len(keys) {
		t.Errorf("one of the two replicas named relay-0 owns %d of %d runs, want a share", n, len(keys))
	}
}

// TestPickMovesOnlyTheLeaversRuns: rendezvous hashing moves only the runs
// of the member that left.
func TestPickMovesOnlyTheLeaversRuns(t *testing.T) {
	all := []string{"r-0", "r-1", "r-2", "r-3"}
	for _, k := range keys {
		was := replicas.Pick(all, k)
		now := replicas.Pick([]string{"r-0", "r-1", "r-3"}, k)
		if was != "r-2" && now != was {
			t.Fatalf("run %s moved from %s to %s when r-2 left", k, was, now)
		}
	}
	if replicas.Pick(nil, "x") != "" {
		t.Error("a run has an owner among no members")
	}
}

// TestRunNamesChosenKnowingThePodNamesSpread: a tenant who can read the
// replicas' pod names chooses run names that a hash over those names
// gives one replica; the replicas' ids in the table are random, so those
// names spread over the three evenly, as ordinary names do. With a public
// hash over pod names the chosen names all went to one replica, at three
// tries a name.
func TestRunNamesChosenKnowingThePodNamesSpread(t *testing.T) {
	g := newGroup(t)
	pods := []string{"clipjob-relay-7c9d8-abcde", "clipjob-relay-7c9d8-fghij", "clipjob-relay-7c9d8-klmno"}
	var ms []*replicas.Members
	for _, p := range pods {
		m, _, _ := g.member(p)
		ms = append(ms, m)
	}
	waitOwners(t, []string{pods[0], pods[1], pods[2]}, ms...)
	const n = 3000
	var chosen []string
	for i := 0; len(chosen) < n; i++ {
		if name := fmt.Sprintf("agent-run-%d", i); replicas.Pick(pods, name) == pods[0] {
			chosen = append(chosen, name)
		}
	}
	got := map[string]int{}
	for _, name := range chosen {
		for _, m := range ms {
			if m.Owns(name) {
				got[m.Name]++
			}
		}
	}
	for _, p := range pods {
		if f := float64(got[p]) / n; math.Abs(f-1.0/3) > 0.04 {
			t.Errorf("names chosen for %s knowing the pod names: %s gets %.1f%% of them", pods[0], p, 100*f)
		}
	}
}

// statusTable records, as each renewal starts, whether its replica was a
// member after the round before, and says when the renewal returned (the
// test cuts the table after the first: cut before it returns, the first
// renewal could fail too).
type statusTable struct {
	*table
	m      *replicas.Members
	mu     sync.Mutex
	member []bool
	calls  chan struct{}
}

func (t *statusTable) Renew(ctx context.Context, id, name string, ttl time.Duration) ([]replicas.Member, error) {
	member, _, _ := t.m.Status()
	t.mu.Lock()
	t.member = append(t.member, member)
	t.mu.Unlock()
	defer func() { t.calls <- struct{}{} }()
	return t.table.Renew(ctx, id, name, ttl)
}

// TestAReplicaThatCannotRenewStopsBeforeItsRowLapses: a replica whose
// renewals fail (cut off from PostgreSQL) collects on while its last
// renewal that succeeded is younger than the duration less two renewals,
// by its own clock, and stops at that deadline: before its row, which
// lives the whole duration from that renewal by the server's clock,
// lapses and the others take its runs. On a fake clock, each renewal a
// step of it.
func TestAReplicaThatCannotRenewStopsBeforeItsRowLapses(t *testing.T) {
	g := newGroup(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 28, 18, 0, 0, 0, time.UTC))
	const lease, renew = 10 * time.Second, time.Second // deadline 8 s
	st := &statusTable{table: g.table(), calls: make(chan struct{}, 1)}
	m := &replicas.Members{Table: st, Name: "a", LeaseDuration: lease, RenewInterval: renew, Clock: clk, Log: logr.Discard()}
	st.m = m
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wait := func() {
		t.Helper()
		select {
		case <-st.calls:
		case <-time.After(time.Minute):
			t.Fatal("a minute on, no renewal")
		}
	}
	wait() // the first renewal, which succeeds
	st.cut.Store(true)
	for range 9 {
		// The ticker fires once the membership waits on it.
		for !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(renew)
		wait()
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	// member[0]: before the first renewal; member[k]: after the round k-1
	// seconds after the last renewal that succeeded.
	want := []bool{false, true, true, true, true, true, true, true, true, false}
	if !slices.Equal(st.member, want) {
		t.Errorf("member after each renewal: %v, want %v (a member until 8 s after its last renewal, then not)", st.member, want)
	}
	if _, _, why := m.Status(); why == "" {
		t.Error("the replica that stopped says nothing of why")
	}
}
