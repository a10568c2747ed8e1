package postgres_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// ids are the members' ids, sorted.
func ids(ms []replicas.Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	slices.Sort(out)
	return out
}

// TestReplicaRowsLiveByTheServersClock: relays sharing a schema see each
// other live while their rows are renewed; one that stops renewing drops
// out once the server's now() passes its row, and its row is deleted once
// it has been gone another duration; one that leaves drops out at once.
// A row written to live an hour counts for at most the reader's own
// duration after its renewal. Another schema's relays are not members.
func TestReplicaRowsLiveByTheServersClock(t *testing.T) {
	ctx := context.Background()
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	a, b, c := table(t, s), table(t, s), table(t, s)
	other := table(t, open(t, postgres.Options{ConnString: conn, Schema: schema + "_other"}))
	// Long enough for the statements between two checks on a busy machine.
	const ttl = 5 * time.Second
	if _, err := other.Renew(ctx, "o", "other-0", time.Hour); err != nil {
		t.Fatal(err)
	}
	// A relay started with an hour's duration, renewed once, then killed.
	if _, err := c.Renew(ctx, "long", "relay-long", time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		t  *postgres.ReplicaTable
		id string
	}{{a, "a"}, {b, "b"}, {c, "c"}} {
		if _, err := r.t.Renew(ctx, r.id, "relay-"+r.id, ttl); err != nil {
			t.Fatal(err)
		}
	}
	live, err := a.Renew(ctx, "a", "relay-a", ttl)
	if err != nil || !slices.Equal(ids(live), []string{"a", "b", "c", "long"}) {
		t.Fatalf("live after four renewed: %v (%v)", live, err)
	}
	if i := slices.IndexFunc(live, func(m replicas.Member) bool { return m.ID == "b" }); live[i].Name != "relay-b" {
		t.Errorf("member b named %q", live[i].Name)
	}

	// c leaves: gone at once. b stops renewing: gone once its row lapses.
	if err := c.Leave(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if live, err = a.Renew(ctx, "a", "relay-a", ttl); err != nil || !slices.Contains(ids(live), "b") || slices.Contains(ids(live), "c") {
		t.Fatalf("live after c left: %v (%v)", live, err)
	}
	// b, and the row written to live an hour, lapse for a after its own
	// duration.
	waitLive(t, a, []string{"a"}, ttl)

	// b's row stays until it has been gone another duration, then the
	// next renewal deletes it.
	db, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	rows := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema}.Sanitize()+`.replicas`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Both, and the hour's, are deleted once gone another duration.
	deadline := time.Now().Add(time.Minute)
	for rows() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a minute on, %d rows: the lapsed replica's row is never deleted", rows())
		}
		if _, err := a.Renew(ctx, "a", "relay-a", ttl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// b comes back (a frozen relay thawed): it writes its row again.
	if _, err := b.Renew(ctx, "b", "relay-b", ttl); err != nil {
		t.Fatal(err)
	}
	if live, err = a.Renew(ctx, "a", "relay-a", ttl); err != nil || !slices.Equal(ids(live), []string{"a", "b"}) {
		t.Fatalf("live after b came back: %v (%v)", live, err)
	}
}

// TestAReplicaRowOutlivesNoConnection: the table's connection killed by
// the server (a restart, a cut network, an operator's
// pg_terminate_backend) fails one renewal, and the next reconnects.
func TestAReplicaRowOutlivesNoConnection(t *testing.T) {
	ctx := context.Background()
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	a := table(t, s)
	if _, err := a.Renew(ctx, "a", "relay-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	// Every other session of the database ends, the table's among them.
	if _, err := db.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		live, err := a.Renew(ctx, "a", "relay-a", time.Minute)
		if err == nil && slices.Equal(ids(live), []string{"a"}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after its connection was killed, the renewal: %v %v", live, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// table is s's table of replicas, closed when the test ends.
func table(t *testing.T, s *postgres.Store) *postgres.ReplicaTable {
	t.Helper()
	tab, err := s.Replicas()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tab.Close)
	return tab
}

// waitLive renews a as "a" until the live members are want.
func waitLive(t *testing.T, a *postgres.ReplicaTable, want []string, ttl time.Duration) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		live, err := a.Renew(context.Background(), "a", "relay-a", ttl)
		if err == nil && slices.Equal(ids(live), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute on, live %v (%v), want %v", live, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
