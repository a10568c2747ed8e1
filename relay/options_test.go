package relay

import (
	"errors"
	"strings"
	"testing"
	"time"
)

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

// TestReplicaIdentityDefaultsToTheHostName: a replica's name in the table
// of replicas is its host's (a pod's name) unless --replica-id says
// otherwise; on a host with no name, and none given, the relay refuses to
// start, naming the flag, rather than join the table nameless.
func TestReplicaIdentityDefaultsToTheHostName(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "clipjob-relay-7d9f-x2k4q", nil }
	r := ReplicaOptions{LeaseDuration: 4 * time.Second, RenewInterval: time.Second}
	if err := r.validate(); err != nil || r.Identity != "clipjob-relay-7d9f-x2k4q" {
		t.Errorf("no --replica-id on a named host: identity %q, %v", r.Identity, err)
	}
	r = ReplicaOptions{Identity: "given", LeaseDuration: 4 * time.Second, RenewInterval: time.Second}
	if err := r.validate(); err != nil || r.Identity != "given" {
		t.Errorf("--replica-id given: identity %q, %v", r.Identity, err)
	}
	hostname = func() (string, error) { return "", errors.New("no name") }
	r = ReplicaOptions{LeaseDuration: 4 * time.Second, RenewInterval: time.Second}
	if err := r.validate(); err == nil || !strings.Contains(err.Error(), "--replica-id") {
		t.Errorf("a nameless host and no --replica-id: %v, want an error naming --replica-id", err)
	}
}
