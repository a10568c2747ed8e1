package integration

import (
	"context"

	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
)

// Relay replicas frozen (SIGSTOP: a node under pressure, a paused VM, a
// debugger) past their row in the table of replicas, between commits and
// inside one, and the relay's own token against the namespace's Leases.
// (Tenants naming their Jobs for one replica:
// replicas.TestRunNamesChosenKnowingThePodNamesSpread.)

// relaySA is the chart relay's ServiceAccount.
var relaySA = harness.Release.Name + "-relay"

// TestHostileRelayPausedReplicaLosesNoLine: a replica frozen
// (SIGSTOP, as a node under pressure or a debugger freezes it) mid-flood
// for longer than its row in the table of replicas lasts twice over. The
// others see its row lapse by the server's clock and take its runs over;
// thawed, it goes on for a moment with the runs it believed its own, from
// the cursors it read before (its commits refused where the others moved
// them), then sees it lapsed, renews and rejoins. Every line of every run
// is stored once, in order, read through each replica.
func TestHostileRelayPausedReplicaLosesNoLine(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	const paused = 1
	// A flood one run of which at least the frozen replica owns.
	prefix := ""
	for i := 0; prefix == ""; i++ {
		p := fmt.Sprintf("e2e-paused%d", i)
		for j := range 3 {
			if rs.owner(t, fmt.Sprintf("%s-%d", p, j)) == paused {
				prefix = p
			}
		}
	}
	f := startFlood(in, ctx, t, prefix, 3)
	owned := 0
	for _, r := range f.Runs {
		if rs.owner(t, r) == paused {
			owned++
		}
	}
	t.Logf("the paused replica %s owns %d of the flood's %d runs", rs.ids[paused], owned, len(f.Runs))
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(100), "before the pause")
	refusedBefore := refusals(t, rs.relays[paused])
	thaw := freeze(t, rs.relays[paused].PID())
	stopped := time.Now()
	defer thaw()
	rs.waitMembers(ctx, t, 0, 2)
	t.Logf("the others see the frozen replica gone %s after the freeze (lease %s, renewal %s)", time.Since(stopped).Round(100*time.Millisecond),
		relay.DefaultOptions().Replicas.LeaseDuration, relay.DefaultOptions().Replicas.RenewInterval)
	// The others collect its runs meanwhile.
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(100), "with the replica frozen")
	thaw()
	rs.waitMembers(ctx, t, 0, 1, 2)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(100), "after the thaw")
	f.end(ctx, t, rs)
	t.Logf("the thawed replica had %d commits refused after the thaw", refusals(t, rs.relays[paused])-refusedBefore)
}

// TestHostileRelayTokenCannotTouchLeases: the relay's replicas divide the
// runs through their store, so the chart grants the relay's
// ServiceAccount nothing on Leases: its token, stolen from a relay pod,
// can neither read, write nor delete any Lease of the release namespace
// (the webhook's election Lease among them), one by one or as a
// collection, dry run or not, and the Lease there stays.
func TestHostileRelayTokenCannotTouchLeases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := harness.ApplyChartRBAC(ctx, suite.cs); err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(suite.cluster.Config)
	var err error
	if rc.BearerToken, err = harness.ServiceAccountToken(ctx, suite.cluster, harness.Release.Namespace, relaySA, nil); err != nil {
		t.Fatal(err)
	}
	asRelay := kubernetes.NewForConfigOrDie(rc).CoordinationV1().Leases(harness.Release.Namespace)
	admin := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	const target = "e2e-relay-token-target"
	_ = admin.Delete(ctx, target, metav1.DeleteOptions{})
	t.Cleanup(func() { _ = admin.Delete(context.Background(), target, metav1.DeleteOptions{}) })
	l, err := admin.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: target},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("the relay's token: %s: want 403, got %v", what, err)
		}
	}
	_, err = asRelay.Get(ctx, target, metav1.GetOptions{})
	forbidden("get", err)
	_, err = asRelay.List(ctx, metav1.ListOptions{})
	forbidden("list", err)
	for _, dry := range [][]string{{metav1.DryRunAll}, nil} {
		_, err = asRelay.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "e2e-relay-token-made"}}, metav1.CreateOptions{DryRun: dry})
		forbidden(fmt.Sprintf("create (dry run %v)", dry), err)
		changed := l.DeepCopy()
		changed.Spec.HolderIdentity = ptr.To("relay")
		_, err = asRelay.Update(ctx, changed, metav1.UpdateOptions{DryRun: dry})
		forbidden(fmt.Sprintf("update (dry run %v)", dry), err)
		forbidden(fmt.Sprintf("delete (dry run %v)", dry), asRelay.Delete(ctx, target, metav1.DeleteOptions{DryRun: dry}))
		forbidden(fmt.Sprintf("deletecollection (dry run %v)", dry), asRelay.DeleteCollection(ctx, metav1.DeleteOptions{DryRun: dry}, metav1.ListOptions{}))
	}
	if got, err := admin.Get(ctx, target, metav1.GetOptions{}); err != nil || ptr.Deref(got.Spec.HolderIdentity, "") != "someone" {
		t.Errorf("the Lease %s after the relay's token tried it: %+v, %v", target, got, err)
	}
}

// TestHostileRelayReplicaFrozenMidCommitLosesNoRun: a replica frozen
// (SIGSTOP: a paused VM, a node cut off with its connections open) inside
// a transaction that wrote held that transaction's row locks, PostgreSQL
// keeping them until the connection died: the replicas that took its
// runs over could not write them, for as long as it stayed frozen. The
// server now ends a transaction whose client
// is quiet for 10 s: every line written before the freeze is stored by
// the others within a minute, and each line once after the thaw.
func TestHostileRelayReplicaFrozenMidCommitLosesNoRun(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-frozen-commit", 8)
	victim := rs.owner(t, f.Runs[0])
	survivor := rs.relays[(victim+1)%3]
	waitEach(ctx, t, survivor, rs.token, f.Runs, atLeast(100), "before the freeze")
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
	for _, run := range f.Runs {
		at[run] = f.Written(run)
	}
	t.Logf("replica %s frozen inside a transaction (%d open transactions with writes)", rs.ids[victim], held)
	storedNow := func(run string) int { return stored(t, survivor, rs.token, run) }
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, run := range f.Runs {
			if storedNow(run) < at[run] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, run := range f.Runs {
			if n := storedNow(run); n < at[run] {
				t.Errorf("run %s (collected by %s before the freeze): %d of the %d lines written before the freeze stored a minute after it",
					run, rs.ids[rs.owner(t, run)], n, at[run])
			}
		}
		t.FailNow()
	}
	t.Logf("every line written before the freeze stored %s after it, by the others", time.Since(frozen).Round(100*time.Millisecond))
	_ = syscall.Kill(pid, syscall.SIGCONT)
	f.end(ctx, t, rs)
}

// TestHostileRelayRunRetiredWhileItsOwnerWasFrozenStaysRetired: the
// replica collecting a run is frozen (SIGSTOP) after storing its lines;
// meanwhile the run ends, the others take it over, finish it, and
// retention (here any finished run beyond one byte, every second) deletes
// it, its pod remaining (a Job kept without a TTL). Thawed, the replica
// renews the row of the id it had, so the run is its own again, and its
// follower goes on: its stream's cursor is gone with the run. The run
// must stay gone, not come back whole, read again from the start. The
// replicas keep a schema of their own: retention this eager would delete
// the other tests' runs.
func TestHostileRelayRunRetiredWhileItsOwnerWasFrozenStaysRetired(t *testing.T) {
	in := newInstall(t)
	const schema = "e2e_retired_frozen"
	ctx, rs := readyReplicasWith(in, t, "--postgres-schema", schema, "--retention-max-bytes", "1", "--retention-interval", "1s")
	run := "e2e-hostile-retired-frozen"
	victim := rs.owner(t, run)
	pod, log := agentRun(in, ctx, t, run)
	if err := log.Write(`{"type":"assistant","n":1}`, `{"type":"assistant","n":2}`, `{"type":"assistant","n":3}`); err != nil {
		t.Fatal(err)
	}
	waitStoredAtLeast(ctx, t, rs.relays[victim], rs.token, run, 3, "before the freeze")
	thaw := freeze(t, rs.relays[victim].PID())
	defer thaw()
	var others []int
	for i := range rs.ids {
		if i != victim {
			others = append(others, i)
		}
	}
	rs.waitMembers(ctx, t, others...)
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	db, err := pgx.Connect(ctx, rs.pg.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	jobUID := string(metav1.GetControllerOf(pod).UID)
	retired := func() bool {
		var at int64
		_ = db.QueryRow(ctx, `SELECT retired_at FROM `+schema+`.retired_runs WHERE job_uid = $1`, jobUID).Scan(&at)
		return at != 0
	}
	gone := func() string {
		for _, i := range others {
			if _, code := rs.relays[i].Run(t, rs.token, run); code != http.StatusNotFound {
				return fmt.Sprintf("replica %s answers %d for the run", rs.ids[i], code)
			}
		}
		return ""
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return retired() && gone() == "", nil
	})
	if err != nil {
		t.Fatalf("the others did not finish the run and retention did not delete it while its owner was frozen: %v (%s)", err, gone())
	}
	thaw()
	rs.waitMembers(ctx, t, 0, 1, 2)
	// The thawed replica's follower reconnects within its backoff (200 ms);
	// the run stays gone for five retention intervals of the others.
	for range 10 {
		if why := gone(); why != "" {
			t.Fatalf("the retired run came back after its old owner thawed: %s", why)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the run's pod is gone (%v): the test proved nothing", err)
	}
}

// freeze stops process pid (SIGSTOP) and returns its thaw (SIGCONT),
// which acts once however often it is called.
func freeze(t *testing.T, pid int) (thaw func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
}
