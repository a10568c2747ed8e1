package collect

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestLaterRetriesOnePerKey: a retry waits, tries again while it fails,
// gives up after its attempts; a second ask for the same key while one
// waits adds nothing (a run whose mirror stays locked asks at every
// commit), and a try may ask for a retry of its own (OnPod retrying a
// pod), which runs.
func TestLaterRetriesOnePerKey(t *testing.T) {
	c := &Collector{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx)
	defer c.Stop()

	var tries, gaveUp atomic.Int32
	// The asks come within the first wait (a tenth of a second).
	for range 5 {
		c.later("k", 100*time.Millisecond, 3, func() bool { tries.Add(1); return false }, func() { gaveUp.Add(1) })
	}
	waitFor(t, func() bool { return gaveUp.Load() == 1 }, "the retry did not give up")
	if got := tries.Load(); got != 3 {
		t.Errorf("five asks for one key tried %d times, want one retry's 3 attempts", got)
	}

	var again atomic.Int32
	var try func() bool
	try = func() bool {
		if again.Add(1) == 1 {
			c.later("pod", time.Millisecond, 1, try, nil) // OnPod failing again
		}
		return true
	}
	c.later("pod", time.Millisecond, 1, try, nil)
	waitFor(t, func() bool { return again.Load() == 2 }, "a retry asked for by a try never ran")
}
