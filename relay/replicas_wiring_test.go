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

// TestReachableNeedsTwoFailedPings: one failed ping (a connection the
// server closed, which the pool replaces) leaves the relay collecting; two
// in a row make it unhealthy, naming the store's error; one answer makes
// it healthy again.
func TestReachableNeedsTwoFailedPings(t *testing.T) {
	var failing atomic.Int64 // pings still to fail
	var pings atomic.Int64
	h := &reachable{what: "the store", interval: 5 * time.Millisecond, log: logr.Discard(), ping: func(context.Context) error {
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

// TestReplicaTimesThatCannotHoldAreRefused: a row that lapses before its
// replica could renew it twice would hand its runs back and forth; such a
// duration is refused at the start, naming both flags.
func TestReplicaTimesThatCannotHoldAreRefused(t *testing.T) {
	for _, tc := range []struct {
		lease, renew time.Duration
		ok           bool
	}{{4 * time.Second, time.Second, true}, {2 * time.Second, time.Second, true}, {time.Second, time.Second, false}, {4 * time.Second, 0, false}} {
		r := ReplicaOptions{Identity: "relay-0", LeaseDuration: tc.lease, RenewInterval: tc.renew}
		err := r.validate()
		if tc.ok != (err == nil) || err != nil && !(strings.Contains(err.Error(), "--lease-duration") && strings.Contains(err.Error(), "--lease-renew-interval")) {
			t.Errorf("--lease-duration %s, --lease-renew-interval %s: %v", tc.lease, tc.renew, err)
		}
	}
}
