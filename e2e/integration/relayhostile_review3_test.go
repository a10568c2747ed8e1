package integration

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The relay's replicas attacked a third time: a replica frozen inside a
// transaction.

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
	victim := rs.owner(t, f.runs[0])
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
					run, rs.ids[rs.owner(t, run)], n, at[run])
			}
		}
		t.FailNow()
	}
	t.Logf("every line written before the freeze stored %s after it, by the others", time.Since(frozen).Round(100*time.Millisecond))
	_ = syscall.Kill(pid, syscall.SIGCONT)
	f.end(ctx, t, rs)
}
