package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/paperclipai/clipjob/relay/store"
)

// ReplicaTable is the schema's table of live relays, on a connection of
// its own: a renewal never waits for the pool, which a flood of commits
// may hold. Every time in it is the server's now(). Not safe for
// concurrent use: one replica's membership renews from one goroutine.
type ReplicaTable struct {
	s    *Store
	conn *pgx.Conn // nil until connected, and again after an error
}

var _ store.ReplicaTable = (*ReplicaTable)(nil)

// Replicas returns the schema's table of live relays.
func (s *Store) Replicas() *ReplicaTable { return &ReplicaTable{s: s} }

// Renew writes this relay's row live for ttl from the server's now() and
// returns every live member, this one included. A row counts for at most
// ttl after its renewal, whatever it was written to live until (a relay
// with a longer --lease-duration). It also deletes the rows of relays
// gone for another ttl, each by one relay only (SKIP LOCKED).
func (t *ReplicaTable) Renew(ctx context.Context, id, name string, ttl time.Duration) ([]store.Replica, error) {
	rows, err := t.query(ctx, `WITH renewed AS (
			INSERT INTO {schema}.replicas (id, name, renewed_at, expires_at) VALUES ($1, $2, now(), now() + $3 * interval '1 microsecond')
			ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at
			RETURNING id, name),
		gone AS (
			DELETE FROM {schema}.replicas WHERE id IN (
				SELECT id FROM {schema}.replicas WHERE LEAST(expires_at, renewed_at + $3 * interval '1 microsecond') < now() - $3 * interval '1 microsecond'
				FOR UPDATE SKIP LOCKED))
		SELECT id, name FROM renewed
		UNION ALL SELECT id, name FROM {schema}.replicas
			WHERE expires_at > now() AND renewed_at + $3 * interval '1 microsecond' > now() AND id <> $1`,
		id, name, ttl.Microseconds())
	if err != nil {
		return nil, err
	}
	live, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Replica, error) {
		var m store.Replica
		err := r.Scan(&m.ID, &m.Name)
		return m, err
	})
	if err != nil {
		t.Close()
	}
	return live, err
}

// Leave deletes this relay's row: the others take its runs over at their
// next renewal.
func (t *ReplicaTable) Leave(ctx context.Context, id string) error {
	conn, err := t.connect(ctx)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, t.s.sql(`DELETE FROM {schema}.replicas WHERE id = $1`), id); err != nil {
		t.Close()
		return err
	}
	return nil
}

// Close closes the table's connection.
func (t *ReplicaTable) Close() {
	if t.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = t.conn.Close(ctx)
		t.conn = nil
	}
}

// connect returns the table's connection, connecting first if needed.
// Each failed statement drops it, so the next starts from a fresh one
// (the server may have gone, or ended this session).
func (t *ReplicaTable) connect(ctx context.Context) (*pgx.Conn, error) {
	if t.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, t.s.connConfig.Copy())
		if err != nil {
			return nil, err
		}
		t.conn = conn
	}
	return t.conn, nil
}

// query runs q on the table's connection.
func (t *ReplicaTable) query(ctx context.Context, q string, args ...any) (pgx.Rows, error) {
	conn, err := t.connect(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, t.s.sql(q), args...)
	if err != nil {
		t.Close()
	}
	return rows, err
}
