package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// TestAppendsAdvanceTheirRunInPlace: an append writes its run's counters
// (last_seq, bytes, seen_at) and nothing indexed, so PostgreSQL updates
// the row in place (HOT) rather than adding an entry to each of the run's
// indexes per append; and the record, whose own copies of the counters an
// append leaves behind, is read with the columns' values, by Run and by
// UpdateRun's function.
func TestAppendsAdvanceTheirRunInPlace(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { r.Agent, r.Company, r.Phase = "agent-1", "acme", "Running" }); err != nil {
		t.Fatal(err)
	}
	const appends = 200
	start := time.Now().Add(time.Hour).Truncate(time.Second) // after UpdateRun's seen-at
	prev := store.Cursor{}
	for i := range appends {
		cur := store.Cursor{TS: int64(i + 1), Count: 1}
		lines := []store.Line{{TS: time.Unix(0, int64(i)), Container: "agent", Line: "ab"}, {TS: time.Unix(0, int64(i)), Container: "agent", Line: "cde"}}
		last, err := s.AppendAfter("run-1", "agent", prev, cur, lines, start.Add(time.Duration(i)*time.Second))
		if err != nil || last != uint64(2*i+2) {
			t.Fatalf("append %d: last %d (%v), want %d", i, last, err, 2*i+2)
		}
		prev = cur
	}
	wantSeen := start.Add((appends - 1) * time.Second)
	check := func(what string, r *store.Run) {
		t.Helper()
		if r == nil || r.LastSeq != 2*appends || r.Bytes != 5*appends || !r.SeenAt.Equal(wantSeen) || r.Agent != "agent-1" || r.Phase != "Running" {
			t.Fatalf("%s: %+v, want lastSeq %d, bytes %d, seen at %s, agent-1 Running", what, r, 2*appends, 5*appends, wantSeen)
		}
	}
	got, err := s.Run("run-1")
	if err != nil {
		t.Fatal(err)
	}
	check("Run", got)
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { check("UpdateRun's function", r); r.Phase = "Succeeded" }); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Run("run-1"); err != nil || got.Phase != "Succeeded" || got.LastSeq != 2*appends {
		t.Fatalf("after UpdateRun: %+v (%v)", got, err)
	}

	// A backend's statistics reach pg_stat_user_tables when it ends (or
	// idles a while): the store's connections are closed first.
	s.Close()
	c := connect(t, conn)
	var upd, hot int
	deadline := time.Now().Add(time.Minute)
	for {
		if err := c.QueryRow(context.Background(), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'runs'`, schema).Scan(&upd, &hot); err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if upd >= appends || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if upd < appends {
		t.Fatalf("%d updates of runs counted, want at least the %d appends'", upd, appends)
	}
	// A page that fills forces one update out of it now and then.
	if hot < upd*9/10 {
		t.Errorf("%d of %d updates of the run's row were in place (HOT): appends write an indexed column", hot, upd)
	}
	t.Logf("%d of %d updates in place", hot, upd)
}

// TestARelayFromBeforeTheCountersInPlaceCannotSetARunBack: in a rolling
// upgrade a relay of the previous version still runs beside this one. It
// keeps a run's counters in the record, which this version's appends no
// longer write, and writes them back to the columns with every update of
// the run (a pod's status, its end). Were last_seq set back, this
// version's next append would number lines that exist and fail for good,
// leaving the run's later lines unstored.
func TestARelayFromBeforeTheCountersInPlaceCannotSetARunBack(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	prev := store.Cursor{}
	appendLine := func(i int) {
		t.Helper()
		cur := store.Cursor{TS: int64(i), Count: 1}
		if _, err := s.AppendAfter("run-1", "agent", prev, cur, []store.Line{{TS: time.Unix(0, int64(i)), Container: "agent", Line: "x"}}, time.Now()); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		prev = cur
	}
	for i := 1; i <= 5; i++ {
		appendLine(i)
	}
	// The previous version's update of the run (its updateRun), from a
	// record it read when the run had one line.
	c := connect(t, conn)
	exec(t, c, `UPDATE `+pgx.Identifier{schema}.Sanitize()+`.runs SET phase = 'Running', last_seq = 1, bytes = 1, record = '{"id":"run-1","phase":"Running","lastSeq":1,"bytes":1}' WHERE id = 'run-1'`)
	appendLine(6)
	var seqs []uint64
	if _, _, _, err := s.Page("run-1", 0, 100, func(l store.RawLine) { seqs = append(seqs, l.Seq) }); err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 6 || seqs[5] != 6 {
		t.Fatalf("lines %v, want seqs 1 to 6", seqs)
	}
}
