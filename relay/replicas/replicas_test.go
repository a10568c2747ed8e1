package replicas

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// group is replicas sharing one (fake) API server.
type group struct {
	t      *testing.T
	client *fake.Clientset
	// cut: the replicas whose writes to their Lease fail (a replica cut
	// off from the API server, or killed: its Lease is renewed no more).
	mu  sync.Mutex
	cut map[string]bool
}

func newGroup(t *testing.T) *group {
	g := &group{t: t, client: fake.NewClientset(), cut: map[string]bool{}}
	cutOff := func(a k8stesting.Action) (bool, runtime.Object, error) {
		var name string
		switch a := a.(type) {
		case k8stesting.CreateAction:
			name = a.GetObject().(*coordinationv1.Lease).Name
		case k8stesting.UpdateAction:
			name = a.GetObject().(*coordinationv1.Lease).Name
		case k8stesting.DeleteAction:
			name = a.GetName()
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		for id := range g.cut {
			if name == LeaseName("relays", id) {
				return true, nil, errors.New("cut off from the API server")
			}
		}
		return false, nil, nil
	}
	for _, verb := range []string{"create", "update", "delete"} {
		g.client.PrependReactor(verb, "leases", cutOff)
	}
	return g
}

// member starts a replica; it stops (releasing its Lease) when the test
// ends or stop is called.
func (g *group) member(id string, healthy func() error) (m *Members, stop func()) {
	m = &Members{Client: g.client, Namespace: "ns", Group: "relays", Identity: id,
		LeaseDuration: 1200 * time.Millisecond, RenewInterval: 200 * time.Millisecond, Healthy: healthy, Log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Start(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	g.t.Cleanup(stop)
	return m, stop
}

// keys are run ids to divide.
var keys = func() []string {
	var k []string
	for i := range 300 {
		k = append(k, fmt.Sprintf("run-%d", i))
	}
	return k
}()

// waitOwners waits until every key is owned by exactly one of ms and
// those members see exactly the live set want.
func waitOwners(t *testing.T, want []string, ms ...*Members) map[string]int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		owners, ok := map[string]int{}, true
		for _, m := range ms {
			member, live, _ := m.Status()
			if member != slices.Contains(want, m.Identity) || !slices.Equal(live, want) && member {
				ok = false
			}
		}
		for _, k := range keys {
			n := 0
			for _, m := range ms {
				if m.Owns(k) {
					n++
					owners[m.Identity]++
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
				member, live, why := m.Status()
				st = append(st, fmt.Sprintf("%s: member %v live %v why %q", m.Identity, member, live, why))
			}
			t.Fatalf("after a minute the runs are not divided among %v: %v", want, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMembersDivideTheRuns: three replicas each own a share of the runs,
// and every run has exactly one owner; when one stops (its Lease
// released) or dies (its Lease renewed no more), the others divide its
// runs and keep their own; one that comes back gets its share back.
func TestMembersDivideTheRuns(t *testing.T) {
	g := newGroup(t)
	a, _ := g.member("a", nil)
	b, stopB := g.member("b", nil)
	c, _ := g.member("c", nil)
	owners := waitOwners(t, []string{"a", "b", "c"}, a, b, c)
	for _, id := range []string{"a", "b", "c"} {
		if owners[id] < 50 {
			t.Errorf("replica %s owns %d of %d runs: a share, not a third, but not this few", id, owners[id], len(keys))
		}
	}
	before := map[string]string{}
	for _, k := range keys {
		before[k] = Pick(nil, []string{"a", "b", "c"}, k)
	}

	// c dies: its Lease is renewed no more. After the Lease's duration
	// the others take its runs; c itself stops owning anything.
	g.mu.Lock()
	g.cut["c"] = true
	g.mu.Unlock()
	start := time.Now()
	waitOwners(t, []string{"a", "b"}, a, b, c)
	t.Logf("runs of a replica whose Lease stopped being renewed taken over in %s (lease 1.2s, renewal 0.2s)", time.Since(start).Round(10*time.Millisecond))
	if _, _, why := c.Status(); why == "" {
		t.Error("the replica whose Lease is not renewed says nothing of why it does not collect")
	}
	for _, k := range keys {
		if before[k] != "c" && !map[string]*Members{"a": a, "b": b}[before[k]].Owns(k) {
			t.Fatalf("run %s moved from %s though its replica lives on", k, before[k])
		}
	}

	// c is back; b stops cleanly: its runs move at the next reading.
	g.mu.Lock()
	delete(g.cut, "c")
	g.mu.Unlock()
	waitOwners(t, []string{"a", "b", "c"}, a, b, c)
	stopB()
	// Its runs move at the others' next reading, not after the Lease's
	// duration, because the Lease is gone once the stop returns (asserted
	// on the store, not on elapsed time, which a busy machine stretches).
	if _, err := g.client.CoordinationV1().Leases("ns").Get(context.Background(), LeaseName("relays", "b"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a stopped replica's Lease is still there (%v): its runs would move only when it lapses", err)
	}
	waitOwners(t, []string{"a", "c"}, a, c)
}

// TestAnUnhealthyReplicaLeaves: a replica whose store does not answer
// owns nothing and releases its Lease, so the others take its runs at
// once; healthy again, it takes its share back.
func TestAnUnhealthyReplicaLeaves(t *testing.T) {
	g := newGroup(t)
	var down atomic.Bool
	a, _ := g.member("a", nil)
	b, _ := g.member("b", func() error {
		if down.Load() {
			return errors.New("the store does not answer")
		}
		return nil
	})
	waitOwners(t, []string{"a", "b"}, a, b)
	down.Store(true)
	waitOwners(t, []string{"a"}, a, b)
	if _, _, why := b.Status(); why != "the store does not answer" {
		t.Errorf("why b does not collect: %q", why)
	}
	if _, err := g.client.CoordinationV1().Leases("ns").Get(context.Background(), LeaseName("relays", "b"), metav1.GetOptions{}); err == nil {
		t.Error("the unhealthy replica's Lease is still there")
	}
	down.Store(false)
	waitOwners(t, []string{"a", "b"}, a, b)
}

// TestPickMovesOnlyTheLeaversRuns: rendezvous hashing moves only the runs
// of the member that left.
func TestPickMovesOnlyTheLeaversRuns(t *testing.T) {
	all := []string{"r-0", "r-1", "r-2", "r-3"}
	for _, k := range keys {
		was := Pick(testSecret, all, k)
		now := Pick(testSecret, []string{"r-0", "r-1", "r-3"}, k)
		if was != "r-2" && now != was {
			t.Fatalf("run %s moved from %s to %s when r-2 left", k, was, now)
		}
	}
	if Pick(testSecret, nil, "x") != "" {
		t.Error("a run has an owner among no members")
	}
}

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// TestRunNamesChosenWithoutTheSecretSpread: a tenant who knows the
// replicas' identities (their pod names) but not the group's secret
// chooses names that one replica would get with any secret it guesses
// (none, here); with the group's secret those names spread over the three
// evenly, as ordinary names do. With the hash public the chosen names all
// went to one replica, at three tries a name.
func TestRunNamesChosenWithoutTheSecretSpread(t *testing.T) {
	members := []string{"clipjob-relay-7c9d8-abcde", "clipjob-relay-7c9d8-fghij", "clipjob-relay-7c9d8-klmno"}
	const n = 3000
	var chosen []string
	for i := 0; len(chosen) < n; i++ {
		if name := fmt.Sprintf("agent-run-%d", i); Pick(nil, members, name) == members[0] {
			chosen = append(chosen, name)
		}
	}
	got := map[string]int{}
	for _, name := range chosen {
		got[Pick(testSecret, members, name)]++
	}
	for _, id := range members {
		if f := float64(got[id]) / n; math.Abs(f-1.0/3) > 0.04 {
			t.Errorf("names chosen for %s without the secret: %s gets %.1f%% of them", members[0], id, 100*f)
		}
	}
}

// TestALeaseCountsAtMostThisReplicasDuration: a Lease written once with
// the longest duration the API server accepts (by anyone who may write
// Leases there, or by a replica started with a long --lease-duration and
// then killed) lapses after this replica's own duration, like any
// replica that stopped renewing: its runs are not left to nobody.
func TestALeaseCountsAtMostThisReplicasDuration(t *testing.T) {
	m := &Members{Group: "g", Identity: "r0", LeaseDuration: 10 * time.Second, seen: map[string]observation{}}
	ghost, forever := "ghost", int32(1<<31-1)
	at := time.Date(2026, 11, 26, 20, 0, 0, 0, time.UTC)
	m.observe([]coordinationv1.Lease{{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName("g", ghost)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &ghost, LeaseDurationSeconds: &forever,
			RenewTime: &metav1.MicroTime{Time: at}},
	}}, at)
	if got := m.seen[LeaseName("g", ghost)].duration; got != m.LeaseDuration {
		t.Errorf("a Lease of %d s counts for %s, want this replica's %s", forever, got, m.LeaseDuration)
	}
}

// TestGroupsNeverNameOneLease: with '-' between group and identity,
// replica "b-0" of group "relay-a" and replica "0" of group "relay-a-b"
// named one Lease; with '.', which no group holds, they do not, and no
// group's names begin with another's group and '.'.
func TestGroupsNeverNameOneLease(t *testing.T) {
	a, b := LeaseName("relay-a", "b-0"), LeaseName("relay-a-b", "0")
	if a == b {
		t.Fatalf("groups relay-a and relay-a-b name one Lease %s", a)
	}
	if strings.HasPrefix(b, "relay-a.") {
		t.Errorf("group relay-a-b's Lease %s begins with group relay-a's prefix", b)
	}
	if ValidGroup("relay.a") == nil {
		t.Error("a group holding '.' is accepted")
	}
}

// TestALeaseOfItsNameHeldByAnotherIsNotTaken: a Lease of this replica's
// name that someone else who may write Leases made first (another group's
// label, another holder) is neither renewed as its own (which took the
// holder's membership away, the two flipping it) nor deleted when this
// replica stops; it says why it is not a member.
func TestALeaseOfItsNameHeldByAnotherIsNotTaken(t *testing.T) {
	ctx := context.Background()
	holder, secs := "0", int32(10)
	theirs := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName("relay-a", "b-0"), Namespace: "ns", Labels: map[string]string{LabelGroup: "relay-a-b"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs},
	}
	cs := fake.NewClientset(theirs)
	m := &Members{Client: cs, Namespace: "ns", Group: "relay-a", Identity: "b-0", LeaseDuration: 10 * time.Second, RenewInterval: 2 * time.Second, Log: logr.Discard()}
	err := m.renew(ctx, time.Now())
	if err == nil || !strings.Contains(err.Error(), "--replica-id") {
		t.Errorf("renewing a Lease of the same name another group's replica holds: %v, want a refusal naming --replica-id", err)
	}
	m.release(ctx)
	got, err := cs.CoordinationV1().Leases("ns").Get(ctx, theirs.Name, metav1.GetOptions{})
	if err != nil || *got.Spec.HolderIdentity != "0" || got.Labels[LabelGroup] != "relay-a-b" {
		t.Errorf("the other replica's Lease after this one renewed and released: %+v, %v", got, err)
	}
}

// TestAHolderOfTwoLeasesLapses: a replica of the version before, killed,
// then started again under the same --replica-id (a StatefulSet, a host
// name) holds both names, <group>-<id> and <group>.<id>; keyed by holder
// the two Leases took turns in one observation, each resetting its clock,
// and a holder gone for an hour stayed live for good, its runs collected
// by nobody (a hostile review). Both lapse, and both are deleted (signed
// here, though the version before signed nothing).
func TestAHolderOfTwoLeasesLapses(t *testing.T) {
	g := newGroup(t)
	ctx := context.Background()
	secs, long := int32(1), time.Now().Add(-time.Hour)
	for i, name := range []string{"relays-ghost", LeaseName("relays", "ghost")} {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{LabelGroup: "relays"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ghost"), LeaseDurationSeconds: &secs,
				RenewTime: &metav1.MicroTime{Time: long.Add(time.Duration(i) * time.Minute)}}, // last renewed apart
		}
		SignLease(nil, l) // the group's (the test group's secret is none)
		if _, err := g.client.CoordinationV1().Leases("ns").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r0, _ := g.member("r0", nil)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		leases, err := g.client.CoordinationV1().Leases("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		_, live, _ := r0.Status()
		return len(leases.Items) == 1 && slices.Equal(live, []string{"r0"}), nil
	})
	if err != nil {
		_, live, why := r0.Status()
		t.Fatalf("live %v (%s): the holder of two Leases gone for an hour did not lapse, or its Leases stayed", live, why)
	}
}

// TestALeaseNobodySignedIsNoMember: anyone who may write the group's
// Leases (a stolen relay token: the chart's policy admits <group>.* with
// the group's label) made a member up and renewed it, and the runs the
// hash gave it were collected by nobody (a hostile review). A Lease
// without the group's proof, or signed with another secret, or named as
// relays before '.' named theirs (a replica of the version before, which
// signs nothing), is no member's, however fresh: every run has an owner
// that runs.
func TestALeaseNobodySignedIsNoMember(t *testing.T) {
	g := newGroup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leases := g.client.CoordinationV1().Leases("ns")
	phantoms := []*coordinationv1.Lease{
		{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("relays", "ghost-0")}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ghost-0")}},
		{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("relays", "ghost-1")}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ghost-1")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "relays-old-0"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old-0")}},
	}
	renew := func() {
		for i, l := range phantoms {
			l.Namespace, l.Labels = "ns", map[string]string{LabelGroup: "relays"}
			l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = ptr.To[int32](1), ptr.To(metav1.NowMicro())
			if i == 1 {
				SignLease([]byte("another group's secret"), l)
			}
			if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
				_, _ = leases.Create(ctx, l, metav1.CreateOptions{})
			}
		}
	}
	renew()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			renew()
		}
	})
	defer wg.Wait()
	defer cancel()
	m0, _ := g.member("r0", nil)
	m1, _ := g.member("r1", nil)
	waitOwners(t, []string{"r0", "r1"}, m0, m1)
	// A few lease durations (1.2 s) of the phantoms renewed every 100 ms.
	for range 3 {
		time.Sleep(1200 * time.Millisecond)
		for _, m := range []*Members{m0, m1} {
			if _, live, _ := m.Status(); !slices.Equal(live, []string{"r0", "r1"}) {
				t.Fatalf("%s counts %v live: a Lease nobody of the group signed counts", m.Identity, live)
			}
		}
	}
	for _, k := range keys {
		if !m0.Owns(k) && !m1.Owns(k) {
			t.Fatalf("run %s is owned by no replica", k)
		}
	}
}

// TestAMemberLeaseRewrittenLapsesFromItsLastSignedRenewal: whoever may
// write the group's Leases sets a member's holder to another name, or
// replays an older signed renewal of it: neither counts as a renewal. The
// member, refused its own Lease, stops collecting at its renew deadline;
// the others take its runs from its last signed renewal, after it
// stopped, so no run is owned twice for long (with the holder flipped to
// and fro, it was most of the time: a hostile review).
func TestAMemberLeaseRewrittenLapsesFromItsLastSignedRenewal(t *testing.T) {
	g := newGroup(t)
	m0, _ := g.member("r0", nil)
	m1, _ := g.member("r1", nil)
	waitOwners(t, []string{"r0", "r1"}, m0, m1)
	leases := g.client.CoordinationV1().Leases("ns")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	set := func(holder string) {
		for ctx.Err() == nil {
			l, err := leases.Get(ctx, LeaseName("relays", "r0"), metav1.GetOptions{})
			if err == nil {
				l.Spec.HolderIdentity = ptr.To(holder)
				if _, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
					return
				}
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			set("someone-else")
			time.Sleep(600 * time.Millisecond) // under r0's renew deadline (800 ms)
			set("r0")
			time.Sleep(250 * time.Millisecond) // about one renewal of r0's
		}
	})
	defer wg.Wait()
	defer cancel()
	var samples, twice int
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		samples++
		for _, k := range keys {
			if m0.Owns(k) && m1.Owns(k) {
				twice++
				break
			}
		}
	}
	t.Logf("runs owned by both replicas in %d of %d samples over 5 s", twice, samples)
	if twice*2 > samples {
		t.Errorf("with r0's holder flipped to and fro, runs were owned twice %d%% of the time", twice*100/samples)
	}
}

// TestAnOldSignedRenewalIsNoRenewal: a member's Lease read (by anyone
// who may read Leases) and written again later, deleted and recreated,
// carries a valid proof of an old renewal: it neither keeps a dead member
// live nor brings it back.
func TestAnOldSignedRenewalIsNoRenewal(t *testing.T) {
	m := &Members{Group: "g", Identity: "r0", LeaseDuration: 10 * time.Second, seen: map[string]observation{}, signed: map[string]signedRenewal{}}
	at := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	lease := func(renew time.Time) coordinationv1.Lease {
		l := coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("g", "dead"), Labels: map[string]string{LabelGroup: "g"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("dead"), LeaseDurationSeconds: ptr.To[int32](10), RenewTime: &metav1.MicroTime{Time: renew}}}
		SignLease(nil, &l)
		return l
	}
	old, last := lease(at), lease(at.Add(2*time.Second))
	m.observe([]coordinationv1.Lease{old}, at)
	m.observe([]coordinationv1.Lease{last}, at.Add(2*time.Second))
	m.observe(nil, at.Add(3*time.Second)) // deleted
	later := at.Add(20 * time.Second)
	m.observe([]coordinationv1.Lease{old}, later) // recreated from an old read
	if o := m.seen[last.Name]; o.signed || later.Sub(o.at) < o.duration && o.signed {
		t.Errorf("an old signed renewal written again counts as a renewal: %+v", o)
	}
	m.observe([]coordinationv1.Lease{lease(later)}, later) // a real renewal
	if o := m.seen[last.Name]; !o.signed || !o.at.Equal(later) {
		t.Errorf("a new signed renewal is not taken: %+v", o)
	}
}

// TestTheLeaseOfAReplicaLongGoneIsDeleted: a replica killed before it
// could delete its Lease (SIGKILL, OOM, a lost node) leaves it behind,
// and every restart of a pod adds another (the identity is the pod's
// name). A member deletes such a Lease once it has lapsed for another
// full duration; a live member's Lease, and Leases that are no member's
// of this group, stay.
func TestTheLeaseOfAReplicaLongGoneIsDeleted(t *testing.T) {
	g := newGroup(t)
	ctx := context.Background()
	secs, long := int32(1), time.Now().Add(-time.Hour)
	lease := func(name, holder, group string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{LabelGroup: group}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: &secs,
				RenewTime: &metav1.MicroTime{Time: long}},
		}
	}
	dead := lease(LeaseName("relays", "killed-0"), "killed-0", "relays")
	// Named as relays before '.' named them: one killed during the
	// rolling upgrade to this version.
	deadBefore := lease("relays-killed-9", "killed-9", "relays")
	others := []*coordinationv1.Lease{
		lease(LeaseName("other", "killed-1"), "killed-1", "other"), // another group's
		lease("relays.not-its-name", "killed-2", "relays"),         // no member's Lease
		lease(LeaseName("relays", "released"), "", "relays"),       // released, held by nobody
	}
	for _, l := range append(others, dead, deadBefore) {
		if _, err := g.client.CoordinationV1().Leases("ns").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r0, _ := g.member("r0", nil)
	r1, _ := g.member("r1", nil)
	for _, l := range []*coordinationv1.Lease{dead, deadBefore} {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := g.client.CoordinationV1().Leases("ns").Get(ctx, l.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("the Lease %s of a replica gone for an hour was not deleted: %v", l.Name, err)
		}
	}
	for _, l := range others {
		if _, err := g.client.CoordinationV1().Leases("ns").Get(ctx, l.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("Lease %s, no member's of this group, was deleted: %v", l.Name, err)
		}
	}
	for _, m := range []*Members{r0, r1} {
		if member, live, why := m.Status(); !member || !slices.Equal(live, []string{"r0", "r1"}) {
			t.Errorf("%s: member %v, live %v (%s); want both live members kept", m.Identity, member, live, why)
		}
		if _, err := g.client.CoordinationV1().Leases("ns").Get(ctx, LeaseName("relays", m.Identity), metav1.GetOptions{}); err != nil {
			t.Errorf("the live member %s's Lease: %v", m.Identity, err)
		}
	}
}
