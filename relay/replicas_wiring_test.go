package relay

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestStoreHealthNeedsTwoFailedPings: one failed ping (a connection the
// server closed, which the pool replaces) leaves the relay collecting; two
// in a row make it unhealthy, naming the store's error; one answer makes
// it healthy again.
func TestStoreHealthNeedsTwoFailedPings(t *testing.T) {
	var failing atomic.Int64 // pings still to fail
	var pings atomic.Int64
	h := &storeHealth{interval: 5 * time.Millisecond, log: logr.Discard(), ping: func(context.Context) error {
		pings.Add(1)
		if failing.Load() > 0 {
			failing.Add(-1)
			return errors.New("connection refused")
		}
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = h.Start(ctx) }()
	waitUntil := func(ok func() bool, msg string) {
		t.Helper()
		if wait.PollUntilContextTimeout(ctx, time.Millisecond, time.Minute, true, func(context.Context) (bool, error) { return ok(), nil }) != nil {
			t.Fatal(msg)
		}
	}
	failing.Store(1)
	waitUntil(func() bool { return failing.Load() == 0 && pings.Load() > 2 }, "the failing ping never came")
	after := pings.Load()
	waitUntil(func() bool { return pings.Load() > after }, "no ping after the failed one")
	if err := h.err(); err != nil {
		t.Fatalf("unhealthy after one failed ping: %v", err)
	}
	failing.Store(1 << 30)
	waitUntil(func() bool { return h.err() != nil }, "pings failing, still healthy")
	if err := h.err(); !strings.Contains(err.Error(), "the store does not answer: connection refused") {
		t.Errorf("unhealthy because %v", err)
	}
	failing.Store(0)
	waitUntil(func() bool { return h.err() == nil }, "the store answers again, still unhealthy")
}

// TestAGroupThatIsNoDNSLabelIsRefused: a Lease is named for its group,
// '.' and the replica, so a group holding '.' (or anything a DNS label may
// not) would make names ambiguous between groups; it is refused at the
// start, naming --lease-group.
func TestAGroupThatIsNoDNSLabelIsRefused(t *testing.T) {
	r := DefaultOptions().Replicas
	r.Namespace, r.Identity = "clipjob-system", "relay-0"
	refusedNaming(t, &r, &r.Group, "--lease-group",
		map[string]bool{"clipjob-relay": true, "relay-a-b": true, "relay.a": false, "Relay": false, strings.Repeat("r", 64): false})
}

// TestAnIdentityThatNamesNoLeaseIsRefused: outside a pod the replica's
// identity defaults to the host name, which may hold capitals or an
// underscore; such a relay is refused at its start, naming --replica-id,
// instead of running unready for good (found by a hostile review).
func TestAnIdentityThatNamesNoLeaseIsRefused(t *testing.T) {
	r := DefaultOptions().Replicas
	r.Namespace, r.Group = "clipjob-system", "clipjob-relay"
	refusedNaming(t, &r, &r.Identity, "--replica-id",
		map[string]bool{"relay-0": true, "Build_Host": false, "a.b": true, "-x": false, "x-": false})
}

// refusedNaming sets *field to each value and checks that r is valid
// when the value is marked true, and otherwise refused naming flag.
func refusedNaming(t *testing.T, r *ReplicaOptions, field *string, flag string, values map[string]bool) {
	t.Helper()
	for v, ok := range values {
		*field = v
		err := r.validate()
		if ok && err != nil {
			t.Errorf("%s %q refused: %v", flag, v, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), flag)) {
			t.Errorf("%s %q: %v, want a refusal naming %s", flag, v, err, flag)
		}
	}
}
