package integration

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/replicas"
)

// The relay's replicas attacked a third time: members made up with a
// stolen relay token.

// readyReplicasInChartGroup is readyReplicas with the three replicas in
// the chart's relay group (relayGroup), under the chart's relay Lease
// policy (clipjob-relay-leases), as an install with relay.store=postgres
// runs them.
func readyReplicasInChartGroup(in *harness.Install, t *testing.T) (context.Context, *relayReplicas) {
	t.Helper()
	ctx := replicasContext(t)
	if err := harness.ApplyChartRBAC(ctx, suite.cs); err != nil {
		t.Fatal(err)
	}
	_ = deleteRelayLeasePolicy(ctx)
	if err := applyRelayLeasePolicy(ctx); err != nil {
		t.Fatal(err)
	}
	leases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	cleanLeases := func(ctx context.Context) {
		l, err := leases.List(ctx, metav1.ListOptions{LabelSelector: replicas.LabelGroup + "=" + relayGroup})
		if err == nil {
			for _, x := range l.Items {
				_ = leases.Delete(ctx, x.Name, metav1.DeleteOptions{})
			}
		}
	}
	cleanLeases(ctx)
	t.Cleanup(func() {
		_ = deleteRelayLeasePolicy(context.Background())
		cleanLeases(context.Background())
	})
	return ctx, startRelayReplicas(in, ctx, t, relayGroup)
}

// TestHostileRelayStolenTokenMakesUpNoMember: the relay Lease policy lets
// the relay's ServiceAccount create any Lease named <group>.<anything>
// with its group's label, and the replicas counted every such Lease that
// was renewed as a live member: whoever held a stolen relay token (or any
// other Lease rights in the namespace) made members up and renewed them,
// and the runs the hash gave them were collected by nobody, two thirds of
// all runs with six (the third hostile review). A member is now a Lease
// signed with the group's secret, which lives in the store: the six
// phantoms, renewed every second for more than a Lease's duration, are
// counted by no replica, and every run is collected.
func TestHostileRelayStolenTokenMakesUpNoMember(t *testing.T) {
	// Alone: the chart's relay Lease policy confines every relay.
	in := addInstall(t)
	ctx, rs := readyReplicasInChartGroup(in, t)
	token, err := harness.ServiceAccountToken(ctx, suite.cluster, harness.Release.Namespace, relaySA, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(suite.cluster.Config)
	rc.BearerToken = token
	asRelay := kubernetes.NewForConfigOrDie(rc).CoordinationV1().Leases(harness.Release.Namespace)
	// The policy is in force once a Lease without the group's label is
	// refused to the relay's token.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "e2e-review3-probe"}}
		_, err := asRelay.Create(ctx, l, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the relay Lease policy is not enforced: %v", err)
	}

	ghosts := []string{"ghost-0", "ghost-1", "ghost-2", "ghost-3", "ghost-4", "ghost-5"}
	for _, g := range ghosts {
		now := metav1.NowMicro()
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: replicas.LeaseName(relayGroup, g), Labels: map[string]string{replicas.LabelGroup: relayGroup}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(g), LeaseDurationSeconds: ptr.To[int32](10), AcquireTime: &now, RenewTime: &now}}
		if _, err := asRelay.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the stolen relay token creating phantom member %s: %v", l.Name, err)
		}
	}
	stopRenew := make(chan struct{})
	var renewing sync.WaitGroup
	renewing.Go(func() {
		for {
			select {
			case <-stopRenew:
				return
			case <-time.After(time.Second):
			}
			for _, g := range ghosts {
				l, err := asRelay.Get(ctx, replicas.LeaseName(relayGroup, g), metav1.GetOptions{})
				if err != nil {
					continue
				}
				l.Spec.RenewTime = ptr.To(metav1.NowMicro())
				_, _ = asRelay.Update(ctx, l, metav1.UpdateOptions{})
			}
		}
	})
	defer func() {
		close(stopRenew)
		renewing.Wait()
	}()

	// Runs started while the phantoms are renewed, some of which the hash
	// would give them, were they members.
	members := append(append([]string{}, rs.ids...), ghosts...)
	var runs, jobs []string
	toPhantoms := 0
	for i := range 6 {
		pod, log := agentRun(in, ctx, t, fmt.Sprintf("e2e-review3-ghost-%d", i))
		run := pod.Labels[contract.LabelRunID]
		runs, jobs = append(runs, run), append(jobs, pod.Labels["batch.kubernetes.io/job-name"])
		if replicas.Pick(rs.secret, members, run)[:1] == "g" {
			toPhantoms++
		}
		var lines []string
		for n := range 20 {
			lines = append(lines, fmt.Sprintf(`{"type":"assistant","run":%q,"n":%d}`, run, n))
		}
		if err := log.WriteAt(time.Now(), lines...); err != nil {
			t.Fatal(err)
		}
	}
	// Over more than a Lease's duration of renewed phantoms, every
	// replica counts the three relays alone.
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for i, r := range rs.relays {
			if n, err := r.Counter("clipjob_relay_replicas "); err == nil && int(n) != len(rs.ids) {
				t.Fatalf("replica %s counts %v live replicas with %d phantoms renewed by a stolen token", rs.ids[i], n, len(ghosts))
			}
		}
	}
	for _, run := range runs {
		waitStoredAtLeast(ctx, t, rs.relays[0], rs.token, run, 20, "with phantom members renewed")
	}
	t.Logf("%d phantom Leases renewed by the stolen relay token: counted by no replica; all %d runs collected (%d the hash would have given the phantoms)", len(ghosts), len(runs), toPhantoms)
	for _, job := range jobs {
		in.FinishRun(ctx, t, job, "0")
	}
}

// TestHostileRelayReplicaFrozenMidCommitLosesNoRun: a replica frozen
// (SIGSTOP: a paused VM, a node cut off with its connections open) inside
// a transaction that wrote held that transaction's row locks, PostgreSQL
// keeping them until the connection died: the replicas that took its
// runs over could not write them, for as long as it stayed frozen (the
// third hostile review). The server now ends a transaction whose client
// is quiet for 10 s: every line written before the freeze is stored by
// the others within a minute, and each line once after the thaw.
func TestHostileRelayReplicaFrozenMidCommitLosesNoRun(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-review3-freeze", 8)
	victim := rs.owner(f.runs[0])
	survivor := rs.relays[(victim+1)%3]
	waitEach(ctx, t, survivor, rs.token, f.runs, atLeast(100), "before the freeze")
	pid := rs.relays[victim].PID()
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	db, err := pgx.Connect(ctx, rs.pg.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	// Freeze it until caught inside a transaction that wrote (an xid).
	var held int
	for attempt := 0; attempt < 200 && held == 0; attempt++ {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL
			AND xact_start < now() - interval '250 milliseconds' AND pid <> pg_backend_pid()`).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held == 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			time.Sleep(time.Duration(20+attempt*7%60) * time.Millisecond)
		}
	}
	if held == 0 {
		t.Fatal("never caught the replica inside a transaction in 200 tries")
	}
	frozen := time.Now()
	at := map[string]int{}
	for _, run := range f.runs {
		at[run] = f.written(run)
	}
	t.Logf("replica %s frozen inside a transaction (%d open transactions with writes)", rs.ids[victim], held)
	storedNow := func(run string) int { return stored(t, survivor, rs.token, run) }
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, run := range f.runs {
			if storedNow(run) < at[run] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, run := range f.runs {
			if n := storedNow(run); n < at[run] {
				t.Errorf("run %s (collected by %s before the freeze): %d of the %d lines written before the freeze stored a minute after it",
					run, rs.ids[rs.owner(run)], n, at[run])
			}
		}
		t.FailNow()
	}
	t.Logf("every line written before the freeze stored %s after it, by the others", time.Since(frozen).Round(100*time.Millisecond))
	_ = syscall.Kill(pid, syscall.SIGCONT)
	f.end(ctx, t, rs)
}
