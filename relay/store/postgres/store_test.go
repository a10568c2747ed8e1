package postgres_test

import (
	"context"
	"testing"

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
