// Package postgres keeps the relay's runs and log lines in PostgreSQL, in
// a schema of their own on an existing server, so that several relays can
// share one store. It holds the guarantees of the embedded bbolt store
// (package store): a stream's lines and its cursor commit in one
// transaction, and a write commits only from the cursor its writer read
// (store.CursorConflict otherwise), so a line is stored exactly once even
// when two writers follow one stream. Migrations are embedded and applied
// by Open; retention deletes lines in short batches; every relay hears of
// the others' commits (LISTEN/NOTIFY), so Changed wakes for another
// relay's lines.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/relay/store"
)

// DefaultSchema holds the relay's tables unless Options.Schema says
// otherwise.
const DefaultSchema = "clipjob_relay"

// Options configure Open. Each field's comment gives its default.
type Options struct {
	// ConnString reaches the server: a libpq keyword/value string or a
	// postgres:// URL (pool settings such as pool_max_conns included).
	// Required.
	ConnString string
	// Schema holds the relay's tables, created if missing (the role then
	// needs CREATE on the database; an operator may create it beforehand
	// instead). Default DefaultSchema.
	Schema string
	// RetainBatch is how many lines one retention statement deletes: each
	// is its own short transaction, so retiring a large run never holds
	// locks for long. Default 5000.
	RetainBatch int
	// Timeout bounds each store operation. Default 30s.
	Timeout time.Duration
	// CommitTimeout bounds one transaction of appends (and Timeout, if
	// shorter). Default DefaultCommitTimeout, twice LockTimeout's: its
	// statements each wait at most that for a row, so a commit much longer
	// waits on a connection gone silent (packets dropped, nothing closed),
	// and with both flights waiting out Timeout the replica's runs went
	// uncollected for 30 s while new connections got through. Given up,
	// the appends fail, the pool's connections are closed (the idle ones
	// went silent too), and the followers go on from the stored cursors on
	// new connections; an append that did commit is found in the cursor.
	CommitTimeout time.Duration
	// CommitFlights is how many transactions of appends may be in flight
	// at once; appends arriving while all are busy wait and commit
	// together (groupcommit.go). Default 2.
	CommitFlights int
	// MaxGroup is the most appends one transaction commits. Default 256.
	MaxGroup int
	// LockTimeout bounds how long a statement waits for a row another
	// transaction holds (lock_timeout), and IdleInTransaction how long the
	// server keeps a transaction whose client went quiet
	// (idle_in_transaction_session_timeout): a replica frozen mid-commit
	// must not hold its runs' rows from the replicas that took them over.
	// Defaults 5s and 10s, unless the connection string sets them.
	LockTimeout, IdleInTransaction time.Duration
	// Clock stamps a run first seen with no line, and times the
	// notifications' backoff. Default the real clock; the server's clock
	// is never this.
	Clock clock.WithTicker
}

// idlePingTimeout bounds the round trip the pool makes on a connection
// idle a second or more before handing it out. Unbounded, it had the
// caller's deadline (Timeout): a replica whose idle connections went
// silent held a read, the mirror's after each commit, for 30 s on each.
// Given up, the connection is closed and the next one tried; but pgx
// keeps a closing connection's place in the pool until the server
// answers its close or 15 s pass, so with every place silent a read
// still waited 17 s (TestAReadOnASilentIdleConnectionGivesUpSoon), not 30.
const idlePingTimeout = 2 * time.Second

// DefaultCommitTimeout is Options.CommitTimeout's default.
const DefaultCommitTimeout = 10 * time.Second

// Store is the PostgreSQL store: a store.Backend; the methods of the
// interface are documented there.
type Store struct {
	pool    *pgxpool.Pool
	schema  string
	names   *strings.Replacer // {schema} -> the quoted schema
	opts    Options
	changes store.Changes
	tails   tails
	commits committer
	q       appendSQL
	// poolConfig opens the table of replicas' own pool.
	poolConfig *pgxpool.Config
	// out holds the runs this store changed for the other relays to hear
	// of; stopNotifying ends the listener and the sender (see notify.go),
	// and notifying is done once both have.
	out           outbox
	stopNotifying context.CancelFunc
	notifying     sync.WaitGroup
}

var _ store.Backend = (*Store)(nil)

// Open connects, applies the schema's migrations (one relay at a time,
// see migrate) and returns the store.
func Open(ctx context.Context, o Options) (*Store, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	orDefault(&o.Timeout, 30*time.Second)
	orDefault(&o.LockTimeout, 5*time.Second)
	orDefault(&o.IdleInTransaction, 10*time.Second)
	orDefault(&o.CommitTimeout, DefaultCommitTimeout)
	orDefault(&o.RetainBatch, 5000)
	orDefault(&o.CommitFlights, 2)
	orDefault(&o.MaxGroup, 256)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.ConnString == "" {
		return nil, errors.New("postgres store: no connection string")
	}
	if len(o.Schema) > maxIdentifier {
		return nil, fmt.Errorf("postgres store: schema %q is longer than PostgreSQL's %d-byte names", o.Schema, maxIdentifier)
	}
	cfg, err := pgxpool.ParseConfig(o.ConnString)
	if err != nil {
		return nil, fmt.Errorf("postgres store: the connection string: %w", err)
	}
	for param, d := range map[string]time.Duration{"lock_timeout": o.LockTimeout, "idle_in_transaction_session_timeout": o.IdleInTransaction} {
		if _, set := cfg.ConnConfig.RuntimeParams[param]; !set {
			cfg.ConnConfig.RuntimeParams[param] = fmt.Sprint(d.Milliseconds())
		}
	}
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = idlePingTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	s := &Store{pool: pool, schema: o.Schema, opts: o, poolConfig: cfg,
		names: strings.NewReplacer("{schema}", pgx.Identifier{o.Schema}.Sanitize())}
	s.q = newAppendSQL(s)
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres store: schema %q: %w", o.Schema, err)
	}
	if err := s.startNotifying(ctx, cfg.ConnConfig); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres store: listening for other relays' changes: %w", err)
	}
	return s, nil
}

// orDefault sets *v to d unless it is positive.
func orDefault[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// maxIdentifier is the longest name PostgreSQL keeps whole (NAMEDATALEN-1).
const maxIdentifier = 63

// Close stops listening and notifying, and closes the connections.
// Closing again does nothing.
func (s *Store) Close() error {
	s.stopNotifying()
	s.notifying.Wait()
	s.pool.Close()
	return nil
}

// sql names the store's tables in q: "{schema}.runs".
func (s *Store) sql(q string) string { return s.names.Replace(q) }

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.opts.Timeout)
}

// nanos keeps a time exact (the record's JSON is; timestamptz keeps
// microseconds), and the zero time as 0.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// runColumns are a run's row but its num, in the order runArgs gives them.
const runColumns = "id, namespace, pod, pod_uid, agent, company, phase, done, last_seq, bytes, seen_at, record"

func runArgs(id string, r *store.Run) ([]any, error) {
	rec, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return []any{id, r.Namespace, r.Pod, r.PodUID, r.Agent, r.Company, r.Phase, r.Done, int64(r.LastSeq), r.Bytes, nanos(r.SeenAt), rec}, nil
}

const updateRun = `UPDATE {schema}.runs SET namespace = $2, pod = $3, pod_uid = $4, agent = $5, company = $6, phase = $7,
	done = $8, last_seq = $9, bytes = $10, seen_at = $11, record = $12 WHERE id = $1`

// execBatch sends b and returns the first statement's error.
func execBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	br := tx.SendBatch(ctx, b)
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
	}
	return br.Close()
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) cursor(ctx context.Context, q querier, run, stream string) (store.Cursor, error) {
	var c store.Cursor
	err := q.QueryRow(ctx, s.sql(`SELECT ts, count FROM {schema}.cursors WHERE run = $1 AND stream = $2`), run, stream).Scan(&c.TS, &c.Count)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Cursor{}, nil
	}
	return c, err
}

func (s *Store) Cursor(run, stream string) (store.Cursor, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	return s.cursor(ctx, s.pool, run, stream)
}

func (s *Store) UpdateRun(id string, fn func(*store.Run)) (*store.Run, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var out *store.Run
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Seen now, though nothing is stored yet: retention counts from
		// here for a run that never writes a line. The row stays locked
		// until tx ends: appends of a run's streams and updates of its
		// record take turns on it.
		args, err := runArgs(id, &store.Run{ID: id, Phase: "Pending", SeenAt: s.opts.Clock.Now()})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q.runInsert, args...); err != nil {
			return err
		}
		r, err := scanRecord(id, tx.QueryRow(ctx, s.q.runLock, id))
		if err != nil {
			return err
		}
		fn(r)
		if args, err = runArgs(id, r); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q.runUpdate, args...); err != nil {
			return err
		}
		out = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.changed(id)
	return out, nil
}

// recordColumns are what scanRecord reads: the record and the counters
// that appends keep in their columns only.
const recordColumns = "record, last_seq, bytes, seen_at"

// scanRecord decodes a run's record from its recordColumns.
func scanRecord(id string, row pgx.Row) (*store.Run, error) {
	var rec []byte
	var lastSeq, bytes, seen int64
	if err := row.Scan(&rec, &lastSeq, &bytes, &seen); err != nil {
		return nil, err
	}
	var r store.Run
	if err := json.Unmarshal(rec, &r); err != nil {
		return nil, fmt.Errorf("run %s: its record: %w", id, err)
	}
	r.LastSeq, r.Bytes, r.SeenAt = uint64(lastSeq), bytes, fromNanos(seen)
	return &r, nil
}

func (s *Store) Run(id string) (*store.Run, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	r, err := scanRecord(id, s.pool.QueryRow(ctx, s.sql(`SELECT `+recordColumns+` FROM {schema}.runs WHERE id = $1`), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return r, err
}

// RunsWhere implements store.Backend from the summary columns (no record
// is read or decoded): the filter is the query's, so only the runs it
// selects are read, by an index for an agent, a company or the unfinished
// runs (migrations 0002 and 0006).
func (s *Store) RunsWhere(f store.Filter) ([]store.Summary, error) {
	var conds []string
	var args []any
	for _, c := range []struct{ column, value string }{{"agent", f.Agent}, {"company", f.Company}, {"phase", f.Phase}} {
		if c.value != "" {
			args = append(args, c.value)
			conds = append(conds, fmt.Sprintf("%s = $%d", c.column, len(args)))
		}
	}
	if f.Unfinished {
		conds = append(conds, "NOT done")
	}
	where := ""
	if len(conds) > 0 {
		where = "WHERE " + strings.Join(conds, " AND ")
	}
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, s.sql(`SELECT id, namespace, pod, pod_uid, agent, company, phase, done, last_seq, bytes, seen_at
		FROM {schema}.runs `+where+` ORDER BY seen_at DESC`), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Summary
	for rows.Next() {
		var r store.Summary
		var lastSeq, seen int64
		if err := rows.Scan(&r.ID, &r.Namespace, &r.Pod, &r.PodUID, &r.Agent, &r.Company, &r.Phase, &r.Done, &lastSeq, &r.Bytes, &seen); err != nil {
			return nil, err
		}
		r.LastSeq, r.SeenAt = uint64(lastSeq), fromNanos(seen)
		out = append(out, r)
	}
	return out, rows.Err()
}

// pageRows bounds the lines one query reads; a page is then cut at
// store.PageBytes by the lines' sizes, so the lines past the cut are
// never read whole (their data stays a TOAST pointer).
const pageRows = 1000

// Page implements store.Backend: at most pageRows lines, read in one
// query with the run's progress (one snapshot). A line's JSON is the
// connection's buffer: a log's follower copies it once, into its
// response's.
func (s *Store) Page(run string, after uint64, limit int, each func(store.RawLine)) (lastSeq uint64, done, found bool, err error) {
	if after >= store.MaxSeq {
		after = store.MaxSeq - 1 // past every line (none reaches MaxSeq); int64(after) would be negative
	}
	if limit <= 0 || limit > pageRows {
		limit = pageRows
	}
	if lines, last, ok := s.tails.page(run, after, limit, s.opts.Clock.Now()); ok {
		for _, l := range lines {
			each(l)
		}
		return last, false, true, nil
	}
	held := s.tails.held(run)
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, s.q.page, run, int64(after), limit, store.PageBytes)
	if err != nil {
		return 0, false, false, err
	}
	var last int64
	var seq pgtype.Int8         // null: no line after
	var data pgtype.DriverBytes // the connection's buffer, until the next row
	_, err = pgx.ForEachRow(rows, []any{&last, &done, &seq, &data}, func() error {
		if lastSeq, found = uint64(last), true; seq.Valid {
			each(store.RawLine{Seq: uint64(seq.Int64), JSON: data})
		}
		return nil
	})
	if err == nil && found && !done {
		s.tails.confirm(run, held)
	}
	return lastSeq, done, found, err
}

// Changed implements store.Backend: changes committed by any relay on the
// schema (see notify.go).
func (s *Store) Changed(run string) <-chan struct{} { return s.changes.Changed(run) }

// Retain implements store.Backend. A run leaves in one short transaction
// (its record, cursors and mirror state), which marks its lines retired;
// they are then deleted RetainBatch at a time, each batch its own
// transaction. A relay stopped half way finishes at its next Retain.
//
// now is the calling relay's clock, and the relays sharing the store each
// run retention: one whose clock runs ahead of the others' would delete
// the finished runs they keep (every one, were it ahead by the maximum
// age). So retention counts to the earlier of now and the server's now().
func (s *Store) Retain(maxAge time.Duration, maxBytes int64, now time.Time) ([]store.Run, error) {
	if err := s.deleteRetiredLines(); err != nil {
		return nil, err
	}
	server, err := s.serverNow()
	if err != nil {
		return nil, err
	}
	if server.Before(now) {
		now = server
	}
	runs, err := s.RunsWhere(store.Filter{})
	if err != nil {
		return nil, err
	}
	var gone []store.Run
	for _, r := range store.Retirees(runs, maxAge, maxBytes, now) {
		ok, err := s.retire(r.ID, now)
		if err != nil {
			return gone, err
		}
		if ok {
			gone = append(gone, r.Run())
			s.changed(r.ID) // followers of a deleted run re-read and find it gone
		}
	}
	return gone, s.deleteRetiredLines()
}

// serverNow is the server's clock.
func (s *Store) serverNow() (time.Time, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var now time.Time
	err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// retire deletes a finished run's record, cursors and mirror state,
// marks its lines for deletion and keeps its store.Retired; false if the
// run is gone or not finished. The cursors go first: writers lock a
// stream's cursor before its run.
func (s *Store) retire(id string, now time.Time) (bool, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	found := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The run's cursors locked first, in the byte order a group of
		// appends locks them in (appendGroup), whatever the database's
		// collation: in another order a group still appending to the run
		// (a Job's retry, a stale owner) and this could wait on each other.
		if _, err := tx.Exec(ctx, s.sql(`SELECT 1 FROM {schema}.cursors WHERE run = $1 ORDER BY stream COLLATE "C" FOR UPDATE`), id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql(`DELETE FROM {schema}.cursors WHERE run = $1`), id); err != nil {
			return err
		}
		var num int64
		var record []byte
		err := tx.QueryRow(ctx, s.sql(`DELETE FROM {schema}.runs WHERE id = $1 AND done RETURNING num, record`), id).Scan(&num, &record)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNotRetired
		}
		if err != nil {
			return err
		}
		// A record that does not decode is retired all the same, with no
		// Retired kept: it must not hold retention up for good.
		var r store.Run
		decoded := json.Unmarshal(record, &r) == nil
		b := &pgx.Batch{}
		b.Queue(s.sql(`DELETE FROM {schema}.mirror WHERE run = $1`), id)
		b.Queue(s.sql(`INSERT INTO {schema}.retired (num) VALUES ($1)`), num)
		if t := store.RetiredOf(&r, now); decoded && t != nil {
			// A later attempt of the Job's run, retired before, stays.
			b.Queue(s.sql(`INSERT INTO {schema}.retired_runs (job_uid, namespace, run, pod_created, retired_at) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (namespace, job_uid) DO UPDATE SET run = excluded.run, pod_created = excluded.pod_created, retired_at = excluded.retired_at
				WHERE {schema}.retired_runs.pod_created <= excluded.pod_created`),
				t.JobUID, t.Namespace, t.Run, nanos(t.PodCreated), nanos(t.RetiredAt))
		}
		if err := execBatch(ctx, tx, b); err != nil {
			return err
		}
		found = true
		return nil
	})
	if errors.Is(err, errNotRetired) {
		return false, nil
	}
	return found, err
}

// errNotRetired rolls back a retirement whose run is gone or running.
var errNotRetired = errors.New("run not retired")

// deleteRetiredLines deletes the lines of retired runs in batches. Each
// statement has its own Timeout: the lines of a large run take many.
func (s *Store) deleteRetiredLines() error {
	exec := func(sql string, args ...any) (pgconn.CommandTag, error) {
		ctx, cancel := s.ctx()
		defer cancel()
		return s.pool.Exec(ctx, s.sql(sql), args...)
	}
	ctx, cancel := s.ctx()
	rows, err := s.pool.Query(ctx, s.sql(`SELECT num FROM {schema}.retired`))
	if err != nil {
		cancel()
		return err
	}
	nums, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	cancel()
	if err != nil {
		return err
	}
	for _, num := range nums {
		for {
			tag, err := exec(`DELETE FROM {schema}.lines WHERE run = $1 AND seq IN
				(SELECT seq FROM {schema}.lines WHERE run = $1 ORDER BY seq LIMIT $2)`, num, s.opts.RetainBatch)
			if err != nil {
				return err
			}
			if tag.RowsAffected() < int64(s.opts.RetainBatch) {
				break
			}
		}
		if _, err := exec(`DELETE FROM {schema}.retired WHERE num = $1`, num); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) RetiredRun(namespace, jobUID string) (*store.Retired, error) {
	got, err := s.retired(`WHERE namespace = $1 AND job_uid = $2`, namespace, jobUID)
	if err != nil || len(got) == 0 {
		return nil, err
	}
	return &got[0], nil
}

func (s *Store) RetiredRuns() ([]store.Retired, error) { return s.retired("") }

// retired reads the retired runs where selects.
func (s *Store) retired(where string, args ...any) ([]store.Retired, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, s.sql(`SELECT job_uid, namespace, run, pod_created, retired_at FROM {schema}.retired_runs `+where), args...)
	if err != nil {
		return nil, err
	}
	var out []store.Retired
	var t store.Retired
	var created, retired int64
	_, err = pgx.ForEachRow(rows, []any{&t.JobUID, &t.Namespace, &t.Run, &created, &retired}, func() error {
		t.PodCreated, t.RetiredAt = fromNanos(created), fromNanos(retired)
		out = append(out, t)
		return nil
	})
	return out, err
}

func (s *Store) ForgetRetired(gone ...store.Retired) error {
	if len(gone) == 0 {
		return nil
	}
	namespaces, uids := make([]string, len(gone)), make([]string, len(gone))
	for i, r := range gone {
		namespaces[i], uids[i] = r.Namespace, r.JobUID
	}
	ctx, cancel := s.ctx()
	defer cancel()
	_, err := s.pool.Exec(ctx, s.sql(`DELETE FROM {schema}.retired_runs
		WHERE (namespace, job_uid) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), namespaces, uids)
	return err
}

func (s *Store) MirrorState(run string) (store.MirrorState, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var st store.MirrorState
	var v []byte
	err := s.pool.QueryRow(ctx, s.sql(`SELECT state FROM {schema}.mirror WHERE run = $1`), run).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(v, &st)
}

func (s *Store) SetMirrorState(run string, st store.MirrorState) error {
	ctx, cancel := s.ctx()
	defer cancel()
	v, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, s.sql(`INSERT INTO {schema}.mirror (run, state) VALUES ($1, $2)
		ON CONFLICT (run) DO UPDATE SET state = excluded.state`), run, v)
	return err
}

// Size implements store.Backend: the schema's tables with their indexes
// and TOAST (0 if the server does not answer).
func (s *Store) Size() int64 {
	ctx, cancel := s.ctx()
	defer cancel()
	var n int64
	_ = s.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'`, s.schema).Scan(&n)
	return n
}

// MaxClockSkew is how far the relay's clock (Options.Clock) may be from
// the server's before Ping fails. The relays stamp the runs' times by
// their own clocks and every replica applies retention to every run, so
// one whose clock ran a day behind would have the others retire the runs
// it collects a day early.
const MaxClockSkew = time.Minute

// Ping says whether the server answers and takes writes, within ctx (a
// standby, or a database with default_transaction_read_only, stores no
// line either), and whether the relay's clock agrees with the server's.
func (s *Store) Ping(ctx context.Context) error {
	var readOnly string
	var server time.Time
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('transaction_read_only'), now()`).Scan(&readOnly, &server); err != nil {
		return err
	}
	if readOnly == "on" {
		return errors.New("PostgreSQL refuses writes (transaction_read_only is on: a standby, or default_transaction_read_only set): no line can be stored")
	}
	if skew := s.opts.Clock.Since(server); skew > MaxClockSkew || skew < -MaxClockSkew {
		return fmt.Errorf("this relay's clock is %s from PostgreSQL's (more than %s): the run times it stamps would be wrong for the other replicas; set the node's time right (NTP)", skew.Round(time.Second), MaxClockSkew)
	}
	return nil
}
