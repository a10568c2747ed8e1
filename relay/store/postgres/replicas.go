package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paperclipai/clipjob/relay/store"
)

// ReplicaTable is the schema's table of live relays, on a pool of one
// connection of its own: a renewal never waits for the store's pool, which
// a flood of commits may hold. Every time in it is the server's now().
type ReplicaTable struct {
	s    *Store
	pool *pgxpool.Pool
}

var _ store.ReplicaTable = (*ReplicaTable)(nil)

// Replicas returns the schema's table of live relays; it connects at its
// first statement.
func (s *Store) Replicas() (*ReplicaTable, error) {
	cfg := s.poolConfig.Copy()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	// Renewed twice a second: a ping before each would double its trips.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	return &ReplicaTable{s: s, pool: pool}, err
}

// Renew writes this relay's row live for ttl from the server's now() and
// returns every live member, this one included. A row counts for at most
// ttl after its renewal, whatever it was written to live until (a relay
// with a longer --lease-duration). It also deletes the rows of relays
// gone for another ttl, each by one relay only (SKIP LOCKED).
func (t *ReplicaTable) Renew(ctx context.Context, id, name string, ttl time.Duration) ([]store.Replica, error) {
	rows, err := t.pool.Query(ctx, t.s.sql(`WITH renewed AS (
			INSERT INTO {schema}.replicas (id, name, renewed_at, expires_at) VALUES ($1, $2, now(), now() + $3 * interval '1 microsecond')
			ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at
			RETURNING id, name),
		gone AS (
			DELETE FROM {schema}.replicas WHERE id IN (
				SELECT id FROM {schema}.replicas WHERE LEAST(expires_at, renewed_at + $3 * interval '1 microsecond') < now() - $3 * interval '1 microsecond'
				FOR UPDATE SKIP LOCKED))
		SELECT id, name FROM renewed
		UNION ALL SELECT id, name FROM {schema}.replicas
			WHERE expires_at > now() AND renewed_at + $3 * interval '1 microsecond' > now() AND id <> $1`),
		id, name, ttl.Microseconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Replica, error) {
		var m store.Replica
		err := r.Scan(&m.ID, &m.Name)
		return m, err
	})
}

// Leave deletes this relay's row: the others take its runs over at their
// next renewal.
func (t *ReplicaTable) Leave(ctx context.Context, id string) error {
	_, err := t.pool.Exec(ctx, t.s.sql(`DELETE FROM {schema}.replicas WHERE id = $1`), id)
	return err
}

// Close closes the table's connection.
func (t *ReplicaTable) Close() { t.pool.Close() }
