package relay

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/internal/testing/poll"
	"github.com/paperclipai/clipjob/relay/collect"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// noPods is a pod cache with no pod.
type noPods struct{}

func (noPods) Pod(string, string) *corev1.Pod { return nil }
func (noPods) Pods() ([]corev1.Pod, error)    { return nil, nil }

// TestRetentionSweepsEveryIntervalOnTheRelaysClock: retention runs once
// every --retention-interval and ages runs by the relay's clock: a
// finished run idle longer than --retention-max-age goes at the first
// sweep, not before, and a finished run seen since stays.
func TestRetentionSweepsEveryIntervalOnTheRelaysClock(t *testing.T) {
	st, _ := storetest.Open(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC))
	for id, seen := range map[string]time.Time{"old": clk.Now().Add(-2 * time.Hour), "new": clk.Now()} {
		if _, err := st.UpdateRun(id, func(r *store.Run) { r.Phase, r.Done, r.SeenAt = "Succeeded", true, seen }); err != nil {
			t.Fatal(err)
		}
	}
	s := &service{opts: Options{RetentionMaxAge: time.Hour, RetentionInterval: time.Minute, Clock: clk}, store: st,
		coll: &collect.Collector{Store: st, Pods: noPods{}, Log: logr.Discard()}, log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.retainUntil(ctx, nil) }()
	defer func() { cancel(); <-done }()

	poll.WaitFor(t, clk.HasWaiters, "retention never waited for its interval")
	if r, _ := st.Run("old"); r == nil {
		t.Fatal("the old run was retired before the first interval passed")
	}
	clk.Step(time.Minute)
	poll.WaitFor(t, func() bool { r, _ := st.Run("old"); return r == nil }, "the old run was not retired one interval later")
	if r, _ := st.Run("new"); r == nil {
		t.Error("a run seen within --retention-max-age was retired")
	}
}
