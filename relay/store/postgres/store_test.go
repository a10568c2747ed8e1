package postgres_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// open opens the store in a schema of t's own, closed when t ends.
func open(t *testing.T, o postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestPostgresConformance holds the PostgreSQL store to the behaviours
// every store must have (storetest.Conformance), each handle opened
// again being another relay's. Retention deletes 7 lines per batch, so a
// run is retired over several.
func TestPostgresConformance(t *testing.T) {
	storetest.Conformance(t, storetest.Backend{Replicas: true, Open: func(t *testing.T) (store.Backend, func() store.Backend) {
		conn, schema := pgtest.Schema(t)
		o := postgres.Options{ConnString: conn, Schema: schema, RetainBatch: 7}
		return open(t, o), func() store.Backend { return open(t, o) }
	}})
}

// TestPingFailsWhenWritesAreRefused: a server that answers but refuses
// every write (a standby, default_transaction_read_only) fails the ping
// the relay's readiness and membership go by, naming why; when it takes
// writes again the ping passes.
func TestPingFailsWhenWritesAreRefused(t *testing.T) {
	ctx := context.Background()
	conn, _ := pgtest.Schema(t)
	admin, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	const db = "ping_read_only"
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE "+db+" WITH (FORCE)") })
	s := open(t, postgres.Options{ConnString: strings.Replace(conn, "dbname=postgres", "dbname="+db, 1)})
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("a server taking writes: %v", err)
	}
	readOnly := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		// The setting applies to new sessions: end the store's.
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", db); err != nil {
			t.Fatal(err)
		}
	}
	readOnly("ALTER DATABASE " + db + " SET default_transaction_read_only = on")
	var pingErr error
	for range 300 { // the pool's first try may meet a terminated session
		if pingErr = s.Ping(ctx); pingErr != nil && strings.Contains(pingErr.Error(), "refuses writes") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pingErr == nil || !strings.Contains(pingErr.Error(), "refuses writes") {
		t.Errorf("a read-only server: ping %v, want an error saying it refuses writes", pingErr)
	}
	readOnly("ALTER DATABASE " + db + " RESET default_transaction_read_only")
	var okErr error
	for range 300 {
		if okErr = s.Ping(ctx); okErr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if okErr != nil {
		t.Errorf("writes taken again: ping %v", okErr)
	}
}

// TestARecordThatDoesNotDecodeIsRetiredAllTheSame: retention keeps a
// Retired from each run's record; one whose record does not decode
// (written by hand, or by a relay of another version) is deleted all the
// same, without one, and holds no later run's retention up.
func TestARecordThatDoesNotDecodeIsRetiredAllTheSame(t *testing.T) {
	ctx := context.Background()
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	old := time.Now().Add(-48 * time.Hour)
	for _, id := range []string{"garbled", "fine"} {
		if _, err := s.UpdateRun(id, func(r *store.Run) {
			r.Done, r.SeenAt, r.Namespace, r.JobUID = true, old, "agents", "0b6c3a2e-1f4d-4c8e-9a51-7d2f0e6b9c11"
		}); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `UPDATE `+pgx.Identifier{schema}.Sanitize()+`.runs SET record = '\x7b6e6f'::bytea WHERE id = 'garbled'`); err != nil {
		t.Fatal(err)
	}
	gone, err := s.Retain(24*time.Hour, 0, time.Now())
	if err != nil || len(gone) != 2 {
		t.Fatalf("retention deleted %v (%v), want both runs", gone, err)
	}
	if r, err := s.RetiredRun("agents", "0b6c3a2e-1f4d-4c8e-9a51-7d2f0e6b9c11"); err != nil || r == nil || r.Run != "fine" {
		t.Errorf("kept of the retired runs: %+v (%v), want the decodable run's", r, err)
	}
}

// TestPageIsTheRecordsLastSeqAndEnd: how far a run is, read with a page
// of its lines and without its record, agrees with the record through
// appends and its end, and a run never stored is not found.
func TestPageIsTheRecordsLastSeqAndEnd(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	var seqs []uint64
	each := func(l store.RawLine) { seqs = append(seqs, l.Seq) }
	if _, _, found, err := s.Page("run-1", 0, 10, each); found || err != nil {
		t.Fatalf("a run never stored: found %v, %v", found, err)
	}
	if _, err := s.AppendAfter("run-1", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "x", "y", "z"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if seq, done, found, err := s.Page("run-1", 1, 1, each); len(seqs) != 1 || seqs[0] != 2 || seq != 3 || done || !found || err != nil {
		t.Errorf("after three lines, one after the first: %v %d %v %v %v", seqs, seq, done, found, err)
	}
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { r.Done = true }); err != nil {
		t.Fatal(err)
	}
	for _, after := range []uint64{3, store.MaxSeq, math.MaxUint64} {
		seqs = nil
		if seq, done, found, err := s.Page("run-1", after, 10, each); len(seqs) != 0 || seq != 3 || !done || !found || err != nil {
			t.Errorf("after its end, after %d: %v %d %v %v %v", after, seqs, seq, done, found, err)
		}
	}
}
