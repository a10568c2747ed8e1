package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

func connect(t *testing.T, conn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, c *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Relays that start at once on an empty server take turns: each opens,
// and every migration is applied once. Opening again applies nothing.
func TestMigrationsApplyOnceWhenRelaysStartTogether(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	o := postgres.Options{ConnString: conn, Schema: schema}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			<-start
			s, err := postgres.Open(context.Background(), o)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("relay %d: %v", i, err)
		}
	}
	c := connect(t, conn)
	q := fmt.Sprintf(`SELECT count(*) FROM %s.schema_migrations`, pgx.Identifier{schema}.Sanitize())
	applied := count(t, c, q)
	if d := count(t, c, fmt.Sprintf(`SELECT count(DISTINCT version) FROM %s.schema_migrations`, pgx.Identifier{schema}.Sanitize())); applied == 0 || d != applied {
		t.Errorf("%d migrations recorded, %d distinct: each must apply once", applied, d)
	}
	open(t, o)
	if again := count(t, c, q); again != applied {
		t.Errorf("opening again recorded %d migrations, then %d", applied, again)
	}
}

// A schema migrated by a newer relay is refused, not written to with an
// older idea of its tables.
func TestANewerSchemaIsRefused(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	o := postgres.Options{ConnString: conn, Schema: schema}
	open(t, o).Close()
	exec(t, connect(t, conn), fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, name) VALUES (9999, 'from the future')`, pgx.Identifier{schema}.Sanitize()))
	_, err := postgres.Open(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "at migration 9999") {
		t.Errorf("opening a newer schema: %v", err)
	}
}

// An operator may create the relay's schema for a role that may create
// nothing else on the database: the relay migrates inside it. Without the
// schema, that role's relay says why it cannot start.
func TestASchemaCreatedByTheOperatorNeedsNoMore(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	role := "role_" + schema
	c := connect(t, conn)
	exec(t, c, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN")
	exec(t, c, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{role}.Sanitize())
	asRole := strings.Replace(conn, "user=clipjob", "user="+role, 1)
	s := open(t, postgres.Options{ConnString: asRole, Schema: schema})
	if _, err := s.AppendAfter("run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "x"), time.Now()); err != nil {
		t.Errorf("writing as the schema's owner: %v", err)
	}
	_, err := postgres.Open(context.Background(), postgres.Options{ConnString: asRole, Schema: schema + "_other"})
	if err == nil || !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), schema+"_other") {
		t.Errorf("a role that may not create the schema: %v", err)
	}
}

// Retention deletes a run's lines in batches after the run is gone: a
// relay that stopped in between (the run retired, its lines not yet
// deleted) leaves them to the next relay's retention, which deletes them
// all.
func TestRetentionFinishesWhatAStoppedRelayLeft(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	o := postgres.Options{ConnString: conn, Schema: schema, RetainBatch: 3}
	s := open(t, o)
	texts := make([]string, 20)
	for i := range texts {
		texts[i] = fmt.Sprint(i)
	}
	if _, err := s.AppendAfter("run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", texts...), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { r.Done = true }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// What retire commits, and no more: the relay stopped there.
	c := connect(t, conn)
	sch := pgx.Identifier{schema}.Sanitize()
	exec(t, c, fmt.Sprintf(`WITH gone AS (DELETE FROM %[1]s.runs WHERE id = 'run-1' RETURNING num) INSERT INTO %[1]s.retired SELECT num FROM gone`, sch))
	lines := fmt.Sprintf(`SELECT count(*) FROM %s.lines`, sch)
	if n := count(t, c, lines); n != 20 {
		t.Fatalf("%d lines before, want 20", n)
	}
	next := open(t, o)
	gone, err := next.Retain(time.Hour, 0, time.Now())
	if err != nil || len(gone) != 0 {
		t.Fatalf("retention: %v (%v), want no run retired", gone, err)
	}
	if n := count(t, c, lines); n != 0 {
		t.Errorf("%d lines of the retired run remain", n)
	}
	if n := count(t, c, fmt.Sprintf(`SELECT count(*) FROM %s.retired`, sch)); n != 0 {
		t.Errorf("%d runs still marked retired", n)
	}
}
