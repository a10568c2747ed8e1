// Package replicas decides which relay replica collects which run when
// several relays share one store (PostgreSQL).
//
// Each replica holds one Lease of its own (coordination.k8s.io/v1, named
// <group>.<identity>, labeled LabelGroup=<group>) and renews it every
// RenewInterval. The live replicas are the Leases of the group this
// replica saw renewed within their duration, by its own clock (as client-go's
// leader election does: no two clocks are compared). A run belongs to the
// live replica that rendezvous hashing (highest random weight) picks for
// its run id, so all the pods of a run, and the runs kept apart under the
// same id, are collected by one replica, as by a single relay.
//
// Why a hash over member Leases, not a Lease per pod or stream: the writes
// to the API server grow with replicas, not with runs (three replicas renew
// three Leases every two seconds whether they follow ten runs or a
// thousand; a Lease per pod renews a thousand); a takeover is no race for
// Leases, since every replica computes the same owner from the same
// members; and a replica that dies moves only its own runs (rendezvous
// hashing keeps every other run where it is). What neither design can
// promise is that two replicas never both believe they own a run — for the
// seconds their views of the members differ — and the store makes that
// harmless: a commit is refused unless the stream's stored cursor is the
// one its writer started from, so each line is stored once.
package replicas

import (
	"context"
	"crypto/hmac"
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
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// LabelGroup marks a replica's Lease with its group: the relays that share
// one store and divide its runs.
const LabelGroup = "clipjob.paperclip.io/relay-group"

// Members is this replica's membership of its group and its view of the
// others. Owns is safe to call at any time; Start runs the membership.
type Members struct {
	Client kubernetes.Interface
	// Namespace holds the group's Leases; Group names it; Identity is this
	// replica's (unique in the group: the pod's name).
	Namespace, Group, Identity string
	// LeaseDuration: a replica whose Lease was not renewed for this long
	// is gone, and its runs are taken over. RenewInterval: how often this
	// replica renews its Lease and reads the others'.
	LeaseDuration, RenewInterval time.Duration
	// Secret keys the hash that gives each run its replica (Pick) and
	// the proof each replica signs its Lease with (SignLease): the same
	// for every replica of the group, kept in their store, unknown to
	// tenants and to whoever holds only a Kubernetes token.
	Secret []byte
	// Healthy, when set, says whether this replica may collect (its store
	// answers): while it returns an error, the replica leaves the group,
	// so that the others take its runs over, and owns nothing.
	Healthy func() error
	// OnChange, when set, runs after the runs this replica owns may have
	// changed (the members, or its own membership). It runs on the
	// membership's goroutine: the next renewal waits for it.
	OnChange func()
	Log      logr.Logger

	mu     sync.Mutex
	member bool
	live   []string               // sorted identities of the live members, this one included when member
	why    string                 // why this replica is not a member, "" when it is
	seen   map[string]observation // by Lease name: a holder may have two (legacyLeaseName)
	// signed is the newest signed renewal seen of each Lease name, kept
	// after the Lease goes (for an hour), so that a Lease deleted and
	// written again with an old signed renewal is not taken as renewed.
	signed   map[string]signedRenewal
	renewed  time.Time // last successful renewal of this replica's Lease
	held     bool      // this replica's Lease exists with it as holder
	started  bool
	changeCh chan struct{}
}

// observation is when this replica last saw another's Lease renewed.
type observation struct {
	renew    time.Time // the Lease's renewTime, as written by its holder
	at       time.Time // when this replica saw that renewTime first
	duration time.Duration
	// id is its holder; name and lease identify the Lease as seen, so
	// that deleting it once its holder is long gone cannot delete one
	// renewed since.
	id, name string
	lease    metav1.Preconditions
	// signed: the renewal seen carried the group's proof (SignLease). Only
	// a signed Lease makes its holder a member; any Lease of the group
	// is deleted once long gone.
	signed bool
}

type signedRenewal struct {
	renew, seen time.Time
}

// gone says whether the holder of the Lease seen in o has been gone for
// another full lease duration after it lapsed: a replica killed before it
// could delete its Lease (SIGKILL, OOM, a lost node) left it behind, and
// a member deletes it then, so that dead replicas' Leases do not pile up
// in the group (each replica's pod name is new) nor count as members for
// a replica that just started.
func (m *Members) gone(o observation, now time.Time) bool {
	return now.Sub(o.at) >= o.duration+m.LeaseDuration
}

// LeaseName is the name of identity's Lease in group. A group is a DNS
// label, without '.' (ValidGroup), so the name says whose Lease it is: with
// '-', as before, replica "b-0" of group "relay-a" and replica "0" of group
// "relay-a-b" named one Lease, and a policy checking the name's prefix let
// one group's relay create the other's (a hostile review).
func LeaseName(group, identity string) string { return group + "." + identity }

// legacyLeaseName is the name relays before LeaseName's '.' gave their
// Leases: such a Lease, which that version did not sign, is no member's,
// and is deleted once it is long gone.
func legacyLeaseName(group, identity string) string { return group + "-" + identity }

// ValidGroup says why group cannot name a group of relays, or nil: it must
// be a DNS label (lowercase letters, digits and '-', at most 63), so that
// no group's Lease name begins with another's group and '.'.
func ValidGroup(group string) error {
	if bad := validation.IsDNS1123Label(group); len(bad) > 0 {
		return fmt.Errorf("the relay group %q is not a DNS label (%s)", group, strings.Join(bad, "; "))
	}
	return nil
}

func (m *Members) validate() error {
	switch {
	case m.Client == nil:
		return errors.New("replicas: no API client")
	case m.Namespace == "" || m.Group == "" || m.Identity == "":
		return errors.New("replicas: namespace, group and identity are required")
	case ValidGroup(m.Group) != nil:
		return fmt.Errorf("replicas: %w", ValidGroup(m.Group))
	case m.RenewInterval <= 0 || m.LeaseDuration < 2*m.RenewInterval:
		return fmt.Errorf("replicas: the lease duration (%s) must be at least twice the renew interval (%s)", m.LeaseDuration, m.RenewInterval)
	}
	return nil
}

// Owns says whether this replica collects the run whose id is key: it is
// a member of its group and the hash picks it among the live members.
func (m *Members) Owns(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.member && Pick(m.Secret, m.live, key) == m.Identity
}

// Pick is the member rendezvous hashing gives key: the one with the
// highest hash of (member, key), keyed with secret. "" when there are
// none. Keyed because the members' identities are pod names anyone who
// may list the namespace's pods can read: with a public hash a tenant
// named its Jobs so that one replica collected them all, at three tries
// a name (a hostile review). The group's replicas share the secret
// through their store.
func Pick(secret []byte, members []string, key string) string {
	best, bestScore := "", uint64(0)
	mac := hmac.New(sha256.New, secret)
	var sum [sha256.Size]byte
	for _, id := range members {
		mac.Reset()
		mac.Write([]byte(id))
		mac.Write([]byte{0})
		mac.Write([]byte(key))
		s := binary.BigEndian.Uint64(mac.Sum(sum[:0]))
		if best == "" || s > bestScore || (s == bestScore && id < best) {
			best, bestScore = id, s
		}
	}
	return best
}

// Status is this replica's membership: whether it collects, the live
// members it sees, and why it is not a member.
func (m *Members) Status() (member bool, live []string, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.member, slices.Clone(m.live), m.why
}

// Changed returns a channel closed at the next change of the members or
// of this replica's membership (for tests and waiters).
func (m *Members) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.changeCh == nil {
		m.changeCh = make(chan struct{})
	}
	return m.changeCh
}

// Start renews this replica's Lease and follows the group until ctx ends,
// then deletes its Lease, so the others take its runs over at once rather
// than after LeaseDuration. It implements manager.Runnable.
func (m *Members) Start(ctx context.Context) error {
	if err := m.validate(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("replicas: started twice")
	}
	m.started, m.seen, m.signed = true, map[string]observation{}, map[string]signedRenewal{}
	m.mu.Unlock()
	t := time.NewTicker(m.RenewInterval)
	defer t.Stop()
	for {
		m.round(ctx)
		select {
		case <-ctx.Done():
			m.leave()
			return nil
		case <-t.C:
		}
	}
}

// round renews (or, unhealthy, releases) this replica's Lease, reads the
// group's and updates the view; OnChange runs if it changed.
func (m *Members) round(ctx context.Context) {
	// A slow API server may take longer than an interval; past the renew
	// deadline this replica stops collecting anyway.
	rctx, cancel := context.WithTimeout(ctx, m.renewDeadline())
	defer cancel()
	now := time.Now()
	why := ""
	if m.Healthy != nil {
		if err := m.Healthy(); err != nil {
			why = err.Error()
		}
	}
	if why == "" {
		if err := m.renew(rctx, now); err != nil {
			m.Log.Error(err, "renewing this relay's Lease", "lease", LeaseName(m.Group, m.Identity))
		}
	} else if m.held {
		m.release(rctx)
	}
	leases, err := m.Client.CoordinationV1().Leases(m.Namespace).List(rctx, metav1.ListOptions{LabelSelector: LabelGroup + "=" + m.Group})
	if err != nil {
		m.Log.Error(err, "reading the relays' Leases")
	}
	m.mu.Lock()
	if err == nil {
		m.observe(leases.Items, now)
	}
	deadline := m.renewDeadline()
	if why == "" && time.Since(m.renewed) >= deadline {
		why = fmt.Sprintf("this relay's Lease was not renewed for %s: the others take its runs over", deadline)
	}
	member := why == ""
	var live []string
	var leftBehind []observation
	// Each Lease counts on its own: a holder is live while any of its
	// Leases is, and a Lease long gone is deleted whoever holds another
	// (a replica of the version before, killed, then started again under
	// the same --replica-id, holds both names; keyed by holder, the two
	// took turns in one observation, each resetting its clock, and the
	// holder never lapsed: a hostile review). Its own legacy Lease too.
	liveIDs := map[string]bool{}
	for name, o := range m.seen {
		switch {
		case o.id == m.Identity && name == LeaseName(m.Group, m.Identity):
		case now.Sub(o.at) < o.duration:
			if o.id != m.Identity && o.signed {
				liveIDs[o.id] = true
			}
		case member && m.gone(o, now):
			leftBehind = append(leftBehind, o)
		}
	}
	for id := range liveIDs {
		live = append(live, id)
	}
	if member {
		live = append(live, m.Identity)
	}
	slices.Sort(live)
	changed := member != m.member || !slices.Equal(live, m.live)
	if why != m.why {
		if why != "" {
			m.Log.Info("not collecting", "why", why)
		} else {
			m.Log.Info("collecting its share of the runs", "replicas", live)
		}
	}
	m.member, m.live, m.why = member, live, why
	var ch chan struct{}
	if changed {
		ch, m.changeCh = m.changeCh, nil
	}
	m.mu.Unlock()
	m.deleteLeftBehind(rctx, leftBehind)
	if !changed {
		return
	}
	replicasLive.Set(float64(len(live)))
	collecting.Set(map[bool]float64{true: 1, false: 0}[member])
	m.Log.Info("relay replicas changed", "live", live, "member", member)
	if m.OnChange != nil {
		m.OnChange()
	}
	if ch != nil {
		close(ch)
	}
}

// renewDeadline is how long this replica goes on collecting without
// renewing its Lease: two renewals short of its duration, so that it has
// stopped before the others see the Lease lapse.
func (m *Members) renewDeadline() time.Duration {
	return max(m.LeaseDuration-2*m.RenewInterval, m.RenewInterval)
}

// observe records when each Lease of the group was last seen renewed;
// a released or deleted Lease is forgotten at once. A renewal without the
// group's proof (SignLease) is not taken for one: the Lease of a member
// someone else rewrote keeps its last signed renewal, and lapses from it,
// and a Lease nobody signed is no member's. Anyone who may write the
// group's Leases (a stolen relay token; the chart's policy lets it write
// <group>.*) made members up and renewed them, and the runs the hash gave
// them were collected by nobody (a hostile review).
func (m *Members) observe(leases []coordinationv1.Lease, now time.Time) {
	present := map[string]bool{}
	for _, l := range leases {
		id := ptr.Deref(l.Spec.HolderIdentity, "")
		if id == "" || l.Name != LeaseName(m.Group, id) && l.Name != legacyLeaseName(m.Group, id) {
			// Released, or not a member's Lease. A member's, rewritten
			// (its holder set to another name), keeps its last signed
			// renewal until it lapses: forgetting it at once handed its
			// runs to the others while it still collected them.
			if o, ok := m.seen[l.Name]; ok && o.signed {
				present[l.Name] = true
			}
			continue
		}
		present[l.Name] = true
		renew := time.Time{}
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.Time
		}
		// The Lease's own duration counts up to this replica's: anyone
		// who may write Leases here (or a replica started with a longer
		// one, then killed) could otherwise keep a member live for years
		// whose runs nobody collects (a hostile review).
		d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
		if d <= 0 || d > m.LeaseDuration {
			d = m.LeaseDuration
		}
		o, ok := m.seen[l.Name]
		last, known := m.signed[l.Name]
		switch {
		case ok && o.id == id && o.renew.Equal(renew):
			// The renewal seen before, read again.
		case VerifyLease(m.Secret, &l) && (!known || renew.After(last.renew)):
			o = observation{renew: renew, at: now, duration: d, signed: true}
			m.signed[l.Name] = signedRenewal{renew: renew, seen: now}
		case ok && o.signed:
			// Rewritten without the proof, or an older signed renewal
			// written again: it keeps its last signed renewal, from which
			// it lapses.
		default:
			o = observation{renew: renew, at: now, duration: d}
		}
		o.id, o.name, o.lease = id, l.Name, metav1.Preconditions{UID: ptr.To(l.UID), ResourceVersion: ptr.To(l.ResourceVersion)}
		m.seen[l.Name] = o
	}
	for name := range m.seen {
		if !present[name] {
			delete(m.seen, name)
		}
	}
	for name, r := range m.signed {
		if now.Sub(r.seen) > time.Hour && !present[name] {
			delete(m.signed, name)
		}
	}
}

// AnnotationProof holds a replica's proof on its Lease: an HMAC, keyed
// with the group's secret, of the Lease's name, holder, renewal and
// duration.
const AnnotationProof = "clipjob.paperclip.io/relay-proof"

// leaseProof is the proof of l's name, holder, renewal and duration.
func leaseProof(secret []byte, l *coordinationv1.Lease) []byte {
	key := hmac.New(sha256.New, secret)
	key.Write([]byte("clipjob relay Lease proof"))
	mac := hmac.New(sha256.New, key.Sum(nil))
	renew := int64(0)
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.UnixMicro()
	}
	fmt.Fprintf(mac, "%s\x00%s\x00%d\x00%d", l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), renew, ptr.Deref(l.Spec.LeaseDurationSeconds, 0))
	return mac.Sum(nil)
}

// SignLease puts the proof of l's current name, holder, renewal and
// duration on it, keyed with the group's secret.
func SignLease(secret []byte, l *coordinationv1.Lease) {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationProof] = hex.EncodeToString(leaseProof(secret, l))
}

// VerifyLease says whether l carries the proof of its name, holder,
// renewal and duration under the group's secret.
func VerifyLease(secret []byte, l *coordinationv1.Lease) bool {
	got, err := hex.DecodeString(l.Annotations[AnnotationProof])
	return err == nil && hmac.Equal(got, leaseProof(secret, l))
}

// deleteLeftBehind deletes the Leases of replicas long gone, each only
// as this replica saw it: one renewed or recreated since is kept (the
// preconditions), and another member deleting it first is no error.
func (m *Members) deleteLeftBehind(ctx context.Context, gone []observation) {
	for _, o := range gone {
		err := m.Client.CoordinationV1().Leases(m.Namespace).Delete(ctx, o.name, metav1.DeleteOptions{Preconditions: &o.lease})
		switch {
		case err == nil:
			m.Log.Info("deleted the Lease of a relay gone without releasing it", "lease", o.name, "lastRenewed", o.renew)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			m.Log.Error(err, "deleting the Lease of a relay gone without releasing it", "lease", o.name)
		}
	}
}

// renew creates or renews this replica's Lease.
func (m *Members) renew(ctx context.Context, now time.Time) error {
	leases := m.Client.CoordinationV1().Leases(m.Namespace)
	name := LeaseName(m.Group, m.Identity)
	secs := int32((m.LeaseDuration + time.Second - 1) / time.Second)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.Namespace, Labels: map[string]string{LabelGroup: m.Group}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &m.Identity, LeaseDurationSeconds: &secs,
				AcquireTime: &metav1.MicroTime{Time: now}, RenewTime: &metav1.MicroTime{Time: now}}}
		SignLease(m.Secret, l)
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
	case err == nil:
		if err := m.mine(l); err != nil {
			return err
		}
		if ptr.Deref(l.Spec.HolderIdentity, "") != m.Identity {
			l.Spec.HolderIdentity, l.Spec.AcquireTime = &m.Identity, &metav1.MicroTime{Time: now}
		}
		l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &secs, &metav1.MicroTime{Time: now}
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[LabelGroup] = m.Group
		SignLease(m.Secret, l)
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.renewed, m.held = now, true
	m.mu.Unlock()
	return nil
}

// mine says whether l, found under this replica's Lease name, may be
// taken as its own: held by it or by nobody, in its group. Anyone else who
// may write Leases here can have made it first (and, before LeaseName
// joined with '.', another group's replica named the same Lease):
// renewing it would take that holder's membership away, the two flipping
// it back and forth (a hostile review).
func (m *Members) mine(l *coordinationv1.Lease) error {
	holder, group := ptr.Deref(l.Spec.HolderIdentity, ""), l.Labels[LabelGroup]
	if (holder == "" || holder == m.Identity) && (group == "" || group == m.Group) {
		return nil
	}
	return fmt.Errorf("the Lease %s/%s is held by %q of group %q: someone else made this relay's Lease first; give this one another --replica-id or --lease-group",
		m.Namespace, l.Name, holder, group)
}

// release deletes this replica's Lease: the others take its runs over at
// their next reading, not after LeaseDuration. Only its own: a Lease of
// the same name another relay holds stays.
func (m *Members) release(ctx context.Context) {
	leases := m.Client.CoordinationV1().Leases(m.Namespace)
	l, err := leases.Get(ctx, LeaseName(m.Group, m.Identity), metav1.GetOptions{})
	if err == nil {
		if m.mine(l) != nil {
			return
		}
		err = leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
	}
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		m.Log.Error(err, "releasing this relay's Lease")
		return
	}
	m.mu.Lock()
	m.held, m.renewed = false, time.Time{}
	m.mu.Unlock()
}

// leave releases the Lease when the relay stops, owning nothing from then on.
func (m *Members) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.mu.Lock()
	m.member, m.why = false, "stopping"
	m.mu.Unlock()
	m.release(ctx)
}
