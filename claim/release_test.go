package claim

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
)

func TestReleaseOnlyTheHolder(t *testing.T) {
	ctx := context.Background()
	c, leases, jobs, _ := newLock()
	holder := agentJob("run-1", "agent-1")
	if err := c.Acquire(ctx, holder, nsScope, false); err != nil {
		t.Fatal(err)
	}
	jobs.put(holder)
	if ok, err := c.Release(ctx, agentJob("run-other", "agent-1"), nsScope); ok || err != nil {
		t.Fatalf("a Job that does not hold the claim released it (%v, %v)", ok, err)
	}
	if ok, err := c.Release(ctx, holder, nsScope); !ok || err != nil {
		t.Fatalf("holder did not release: %v %v", ok, err)
	}
	if len(leases.items) != 0 {
		t.Fatal("claim still there")
	}
	if err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false); err != nil {
		t.Errorf("agent not free after release: %v", err)
	}
}

func TestSweepRemovesStaleClaimsOnly(t *testing.T) {
	ctx := context.Background()
	c, leases, jobs, clk := newLock()
	running := agentJob("run-live", "agent-live")
	done := agentJob("run-done", "agent-done")
	ghost := agentJob("run-ghost", "agent-ghost") // admitted, never stored
	for _, j := range []*batchv1.Job{running, done, ghost} {
		if err := c.Acquire(ctx, j, nsScope, false); err != nil {
			t.Fatal(err)
		}
	}
	jobs.put(running)
	jobs.put(finish(done, batchv1.JobComplete))
	n, err := c.Sweep(ctx, 15*time.Second)
	if err != nil || n != 1 {
		t.Fatalf("first sweep released %d (%v), want 1 (the finished run)", n, err)
	}
	clk.Step(20 * time.Second)
	if n, _ := c.Sweep(ctx, 15*time.Second); n != 1 {
		t.Fatalf("second sweep released %d, want 1 (the run never stored)", n)
	}
	if len(leases.items) != 1 {
		t.Fatalf("%d claims left, want the running one", len(leases.items))
	}
}
