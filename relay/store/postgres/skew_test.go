package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// TestARelayWhoseClockRunsAheadDeletesNoRunTheOthersKeep: the relays
// sharing a store each apply retention, by their own clocks. One whose
// clock is eight days ahead (a VM's clock set wrong, an NTP step) must
// not delete the runs that finished a moment ago, which the others keep
// for the seven days of the maximum age; a run idle for longer than that
// goes all the same.
func TestARelayWhoseClockRunsAheadDeletesNoRunTheOthersKeep(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	const week = 7 * 24 * time.Hour
	finished := func(id string, seen time.Time) {
		t.Helper()
		if _, err := s.AppendAfter(id, "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "x"), seen); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateRun(id, func(r *store.Run) { r.Done, r.SeenAt = true, seen }); err != nil {
			t.Fatal(err)
		}
	}
	finished("run-old", time.Now().Add(-week-time.Hour))
	finished("run-new", time.Now())
	gone, err := s.Retain(week, 0, time.Now().Add(week+24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range gone {
		ids = append(ids, r.ID)
	}
	if len(ids) != 1 || ids[0] != "run-old" {
		t.Errorf("retention by a relay eight days ahead deleted %v, want run-old only", ids)
	}
	if r, _ := s.Run("run-new"); r == nil {
		t.Error("a run finished a moment ago was deleted by a relay whose clock runs ahead")
	}
}

// TestARelayWhoseClockIsOffPingsUnhealthy: a relay whose clock runs a day
// behind the server's would stamp the runs it collects a day old, and
// every replica's retention would retire them a day early; its store's
// ping fails, naming the clock, so the replica leaves (as one whose store
// does not answer) until its clock is right. A clock a second off pings
// healthy.
func TestARelayWhoseClockIsOffPingsUnhealthy(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	for _, tc := range []struct {
		offset time.Duration
		ok     bool
	}{{-24 * time.Hour, false}, {24 * time.Hour, false}, {time.Second, true}} {
		s := open(t, postgres.Options{ConnString: conn, Schema: schema, Clock: clocktesting.NewFakeClock(time.Now().Add(tc.offset))})
		err := s.Ping(context.Background())
		if ok := err == nil; ok != tc.ok || !ok && !strings.Contains(err.Error(), "clock") {
			t.Errorf("a relay clock %s off the server's: ping %v, want healthy %v (or an error naming the clock)", tc.offset, err, tc.ok)
		}
	}
}
