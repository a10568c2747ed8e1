package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/paperclipai/clipjob/internal/testing/poll"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// woken waits for ch, for a minute at most: a bound far above any stall
// of a loaded machine, reached only when the wake never comes.
func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(time.Minute):
		return false
	}
}

// TestChangesReachOtherRelays: a reader of a run on one relay wakes when
// another relay commits the run's lines, its record, or its retirement.
// When the server restarts, the listening connection is lost: once it is
// listening again every reader is woken to re-read what it may have
// missed, and later commits wake readers again.
func TestChangesReachOtherRelays(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	o := postgres.Options{ConnString: srv.ConnString("postgres")}
	writer, reader := open(t, o), open(t, o)

	ch := reader.Changed("run-1")
	if _, err := writer.AppendAfter("run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "x"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if !woken(ch) {
		t.Fatal("lines another relay committed did not wake the reader")
	}
	ch, other := reader.Changed("run-1"), reader.Changed("run-2")
	if _, err := writer.UpdateRun("run-1", func(r *store.Run) { r.Phase, r.Done = "Succeeded", true }); err != nil {
		t.Fatal(err)
	}
	if !woken(ch) {
		t.Fatal("a record another relay committed did not wake the reader")
	}
	select {
	case <-other:
		t.Error("a change of run-1 woke the reader of run-2")
	default:
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if !woken(other) {
		t.Fatal("the reader was not woken once listening again after the server restarted")
	}
	ch = reader.Changed("run-1")
	// The writer's pool finds its connections dead first: retry until a
	// commit goes through.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := writer.Retain(time.Nanosecond, 0, time.Now().Add(time.Hour))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention after the restart: %v", err)
		}
	}
	if !woken(ch) {
		t.Fatal("a retirement another relay committed after the restart did not wake the reader")
	}
	if r, _ := reader.Run("run-1"); r != nil {
		t.Error("the run was not retired")
	}
}

// TestALongSchemaNameIsRefused: PostgreSQL cuts names at 63 bytes, which
// would make the schema the relay creates another than the one it checks.
func TestALongSchemaNameIsRefused(t *testing.T) {
	conn, _ := pgtest.Schema(t)
	long := strings.Repeat("s", 64)
	if _, err := postgres.Open(context.Background(), postgres.Options{ConnString: conn, Schema: long}); err == nil || !strings.Contains(err.Error(), "63-byte") {
		t.Errorf("schema of %d bytes: %v", len(long), err)
	}
}

// TestTheListenerReconnectsOnTheStoresClock: a relay whose listening
// connection is cut connects again after a backoff timed by the store's
// clock, doubling while the server refuses it, and once listening wakes
// every reader to re-read what it may have missed. With a fake clock that
// does not move, it does not reconnect at all.
func TestTheListenerReconnectsOnTheStoresClock(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.ConnString("template1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	reader := open(t, postgres.Options{ConnString: srv.ConnString("postgres"), Clock: clk})
	ch := reader.Changed("run-1")

	// The server refuses new connections to the database, then ends the
	// listener's.
	if _, err := admin.Exec(ctx, "ALTER DATABASE postgres ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'postgres' AND query LIKE 'LISTEN %'"); err != nil {
		t.Fatal(err)
	}
	waiting := func(what string) {
		t.Helper()
		poll.WaitFor(t, clk.HasWaiters, what)
	}
	waiting("the listener never waited to reconnect after its connection was cut")
	clk.Step(100 * time.Millisecond) // the first backoff: the attempt is refused
	waiting("the listener never waited again after a refused attempt")
	if _, err := admin.Exec(ctx, "ALTER DATABASE postgres ALLOW_CONNECTIONS true"); err != nil {
		t.Fatal(err)
	}
	clk.Step(100 * time.Millisecond) // half of the doubled backoff
	select {
	case <-ch:
		t.Fatal("the reader was woken before the listener's doubled backoff had passed")
	default:
	}
	if !clk.HasWaiters() {
		t.Fatal("the listener stopped waiting before its doubled backoff (200 ms) had passed")
	}
	clk.Step(100 * time.Millisecond)
	if !woken(ch) {
		t.Fatal("the reader was not woken once the listener was listening again")
	}
}

// TestOwnChangesWakeReadersOnce: a relay's readers wake at its own commit,
// and not again when the server hands the relay its own notification (a
// second read that found nothing, for every commit of every run a client
// follows on the relay that collects it).
func TestOwnChangesWakeReadersOnce(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	o := postgres.Options{ConnString: conn, Schema: schema}
	s, other := open(t, o), open(t, o)
	prev := store.Cursor{}
	for i := range 3 {
		ch, heard := s.Changed("run-1"), other.Changed("run-1")
		cur := store.Cursor{TS: int64(i + 1), Count: 1}
		if _, err := s.AppendAfter("run-1", "st", prev, cur, storetest.Lines("agent", "x"), time.Now()); err != nil {
			t.Fatal(err)
		}
		prev = cur
		again := s.Changed("run-1")
		if !woken(ch) || !woken(heard) {
			t.Fatal("a commit woke neither the relay's readers nor the other relay's")
		}
		select {
		case <-again:
			t.Fatalf("commit %d woke the committing relay's reader again, at its own notification", i+1)
		case <-time.After(300 * time.Millisecond):
		}
	}
}
