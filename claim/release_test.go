package claim

import (
	"context"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/paperclipai/clipjob/config"
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
	n, err := c.Sweep(ctx, 15*time.Second, nil)
	if err != nil || n != 1 {
		t.Fatalf("first sweep released %d (%v), want 1 (the finished run)", n, err)
	}
	clk.Step(20 * time.Second)
	if n, _ := c.Sweep(ctx, 15*time.Second, nil); n != 1 {
		t.Fatalf("second sweep released %d, want 1 (the run never stored)", n)
	}
	if len(leases.items) != 1 {
		t.Fatalf("%d claims left, want the running one", len(leases.items))
	}
}

// TestASweepNarrowedToItsNamespacesLeavesOthersClaims: a release narrowed
// to its agent namespaces sweeps only there, so another release's stale
// claim (in a namespace this one's RBAC cannot write) is left to it, and
// asks the API server for those namespaces alone.
func TestASweepNarrowedToItsNamespacesLeavesOthersClaims(t *testing.T) {
	ctx := context.Background()
	c, leases, jobs, _ := newLock()
	mine, theirs := agentJob("run-mine", "agent-1"), agentJob("run-theirs", "agent-1")
	theirs.Namespace = "other-team"
	for _, j := range []*batchv1.Job{mine, theirs} {
		if err := c.Acquire(ctx, j, nsScope, false); err != nil {
			t.Fatal(err)
		}
		jobs.put(finish(j, batchv1.JobComplete))
	}
	n, err := c.Sweep(ctx, 15*time.Second, []string{mine.Namespace})
	if err != nil || n != 1 {
		t.Fatalf("sweep released %d (%v), want 1 (this release's finished run)", n, err)
	}
	if len(leases.items) != 1 {
		t.Fatalf("%d claims left, want the other release's", len(leases.items))
	}
	for _, l := range leases.items {
		if l.Namespace != "other-team" {
			t.Errorf("claim left in %s, want other-team's", l.Namespace)
		}
	}
	if !slices.Equal(leases.listed, []string{mine.Namespace}) {
		t.Errorf("listed namespaces %q, want only %q", leases.listed, mine.Namespace)
	}
}

// TestTheSweepOfAClusterScopeLooksWhereItsClaimsLive: under scope
// Cluster every agent's claim is in one namespace, which a narrowed
// release sweeps besides its agent namespaces; an unnarrowed release
// sweeps every namespace.
func TestTheSweepOfAClusterScopeLooksWhereItsClaimsLive(t *testing.T) {
	cluster := config.Concurrency{Scope: config.ScopeCluster, ClaimNamespace: "clipjob-system"}
	if got := sweptNamespaces([]string{"paperclip"}, cluster); !slices.Equal(got, []string{"paperclip", "clipjob-system"}) {
		t.Errorf("cluster scope: %q, want paperclip and clipjob-system", got)
	}
	if got := sweptNamespaces([]string{"paperclip", "clipjob-system"}, cluster); !slices.Equal(got, []string{"paperclip", "clipjob-system"}) {
		t.Errorf("claim namespace already listed: %q", got)
	}
	if got := sweptNamespaces([]string{"paperclip"}, nsScope); !slices.Equal(got, []string{"paperclip"}) {
		t.Errorf("namespace scope: %q, want paperclip", got)
	}
	if got := sweptNamespaces(nil, cluster); got != nil {
		t.Errorf("unnarrowed: %q, want nil (every namespace)", got)
	}
}
