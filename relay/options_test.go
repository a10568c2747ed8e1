package relay

import (
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
