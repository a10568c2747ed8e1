package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The schema's migrations, applied in order of their number (the file
// name's prefix) and recorded in {schema}.schema_migrations. A released
// migration is never edited: a change is a new file.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

func migrations() ([]migration, error) {
	paths, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, p := range paths {
		name := strings.TrimSuffix(path.Base(p), ".sql")
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: the name must start with its number and an underscore", p)
		}
		b, err := migrationFiles.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(b)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share a number", out[i-1].name, out[i].name)
		}
	}
	return out, nil
}

// migrate brings the schema to the newest migration in one transaction:
// all of it applies, or none. Relays starting at once take turns on a
// transaction-scoped advisory lock (it cannot outlive a relay that dies
// half way): the first migrates, the others then find nothing to do.
// A schema a newer relay migrated further is refused, not run against.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "clipjob-relay migrations "+s.schema); err != nil {
			return err
		}
		// CREATE SCHEMA IF NOT EXISTS would need CREATE on the database
		// even when the schema exists: an operator may create it for a
		// role that has no more.
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, s.schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, s.sql(`CREATE SCHEMA {schema}`)); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, s.sql(`CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.sql(`SELECT version FROM {schema}.schema_migrations`))
		if err != nil {
			return err
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		if n := len(ms); len(applied) > 0 && int(slices.Max(applied)) > ms[n-1].version {
			return fmt.Errorf("the schema is at migration %d, this relay knows up to %d: run a relay as new as the one that migrated it", slices.Max(applied), ms[n-1].version)
		}
		for _, m := range ms {
			if slices.Contains(applied, int32(m.version)) {
				continue
			}
			if _, err := tx.Exec(ctx, s.sql(m.sql)); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, s.sql(`INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2)`), m.version, m.name); err != nil {
				return err
			}
		}
		return nil
	})
}
