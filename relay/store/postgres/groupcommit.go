package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paperclipai/clipjob/relay/store"
)

// Group commit. A followed stream that has caught up commits each line as
// it comes, and one-line transactions cost three times the CPU per line.
// So appends that arrive while others commit wait and then commit
// together: one transaction and one WAL flush for the group, each append
// still checked against its own stream's cursor. There is no timer: an
// append that finds a flight free commits at once, and a busy relay's
// groups grow with the load.

// appendSQL is the statements of an append, and a follower's page (see
// pages), named for the store's schema once (Open), not on every append
// of every group.
type appendSQL struct {
	cursorFirst, cursorNext, lines, runAdvance, runInsert, runLock, runUpdate, page string
}

func newAppendSQL(s *Store) appendSQL {
	return appendSQL{
		cursorFirst: s.sql(`INSERT INTO {schema}.cursors AS c (run, stream, ts, count) VALUES ($1, $2, $3, $4)
			ON CONFLICT (run, stream) DO UPDATE SET ts = excluded.ts, count = excluded.count WHERE c.ts = 0 AND c.count = 0`),
		cursorNext: s.sql(`UPDATE {schema}.cursors SET ts = $3, count = $4
			WHERE run = $1 AND stream = $2 AND ts = $5 AND count = $6`),
		lines: s.sql(`INSERT INTO {schema}.lines (run, seq, size, data)
			SELECT u.run, u.seq, u.size, u.data FROM unnest($1::bigint[], $2::bigint[], $3::integer[], $4::bytea[]) AS u(run, seq, size, data)`),
		// An append changes only the run's three counters, in their
		// columns (the record's copies of them are not kept: reads take
		// the columns), and no indexed column, so that PostgreSQL updates
		// the row in place (a HOT update: no index entry per append).
		runAdvance: s.sql(`INSERT INTO {schema}.runs AS r (` + runColumns + `) VALUES ($1, '', '', '', '', '', 'Unknown', false, $2, $3, $4, $5)
			ON CONFLICT (id) DO UPDATE SET last_seq = r.last_seq + excluded.last_seq, bytes = r.bytes + excluded.bytes,
				seen_at = greatest(r.seen_at, excluded.seen_at)
			RETURNING num, last_seq`),
		runInsert: s.sql(`INSERT INTO {schema}.runs (` + runColumns + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
			ON CONFLICT (id) DO NOTHING`),
		runLock:   s.sql(`SELECT ` + recordColumns + ` FROM {schema}.runs WHERE id = $1 FOR UPDATE`),
		runUpdate: s.sql(updateRun),
		page: s.sql(`SELECT r.last_seq, r.done, p.seq, p.data FROM {schema}.runs r LEFT JOIN LATERAL (
				SELECT seq, data FROM (
					SELECT seq, data, sum(size) OVER (ORDER BY seq) - size AS before FROM {schema}.lines
					WHERE run = r.num AND seq > $2 ORDER BY seq LIMIT $3) page
				WHERE before < $4) p ON true
			WHERE r.id = $1 ORDER BY p.seq`),
	}
}

// appendReq is one AppendAfter waiting for its group's commit.
type appendReq struct {
	run, stream string
	prev, cur   store.Cursor
	lines       []store.Line
	now         time.Time

	last uint64
	err  error
	// json is the committed lines' JSON, for the tails and the other
	// relays (tails.go); nil if more than carryBytes.
	json [][]byte
	done chan struct{}
}

func (r *appendReq) key() streamKey { return streamKey{r.run, r.stream} }

type streamKey struct{ run, stream string }

// committer holds the appends waiting for a flight, and counts the
// flights: goroutines that each commit one group at a time until none is
// waiting.
type committer struct {
	mu      sync.Mutex
	pending []*appendReq
	flights int
	// alone holds the streams whose last append failed on its own data
	// (appendDataError): each commits on its caller's goroutine until one
	// commits, so that it neither fails every group it joins nor holds a
	// flight.
	alone map[streamKey]bool
}

// take removes the next group from the pending appends: up to max, at most
// one per stream (a stream's second append waits for its first, whose
// cursor it names as prev, to commit). With nothing pending the flight
// ends and take returns nil.
func (c *committer) take(max int) []*appendReq {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		c.flights--
		return nil
	}
	group := make([]*appendReq, 0, min(max, len(c.pending)))
	in := make(map[streamKey]bool, cap(group))
	rest := c.pending[:0]
	for _, r := range c.pending {
		if len(group) < max && !in[r.key()] {
			in[r.key()] = true
			group = append(group, r)
			continue
		}
		rest = append(rest, r)
	}
	clear(c.pending[len(rest):])
	c.pending = rest
	return group
}

// setAlone marks the stream of a group of one that failed on its data to
// commit alone, and clears the mark of a stream that committed.
func (c *committer) setAlone(group []*appendReq, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case len(group) == 1 && err != nil && appendDataError(err):
		if c.alone == nil {
			c.alone = map[streamKey]bool{}
		}
		c.alone[group[0].key()] = true
	case err == nil && len(c.alone) > 0:
		for _, r := range group {
			if r.err == nil {
				delete(c.alone, r.key())
			}
		}
	}
}

// appendDataError says whether err is an append's own: PostgreSQL refused
// its data (class 22, data exception; 23, integrity constraint), or a row
// it needs is held locked past the lock_timeout (55P03: another, perhaps
// a replica frozen mid-commit, holds that run).
func appendDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23") || pgErr.Code == "55P03")
}

// enqueue adds r to the pending appends and says whether a flight must
// start for it, or says that r's stream commits alone (then r is not
// queued).
func (c *committer) enqueue(r *appendReq, maxFlights int) (alone, fly bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.alone[r.key()] {
		return true, false
	}
	c.pending = append(c.pending, r)
	if c.flights < maxFlights {
		c.flights++
		return false, true
	}
	return false, false
}

// AppendAfter implements store.Backend: the stream's lines and cursor
// commit in one transaction, if the stored cursor is prev, perhaps with
// other streams' appends (group commit, above). The stream's cursor row is
// written first, on the condition that it holds prev: that is the check,
// and its row lock makes a second writer of the stream wait for the
// first's commit and then find the cursor moved.
func (s *Store) AppendAfter(run, stream string, prev, cur store.Cursor, lines []store.Line, now time.Time) (uint64, error) {
	r := &appendReq{run: run, stream: stream, prev: prev, cur: cur, lines: lines, now: now, done: make(chan struct{})}
	switch alone, fly := s.commits.enqueue(r, s.opts.CommitFlights); {
	case alone:
		// On the caller's goroutine: a stream whose run's row another
		// holds locked waits out its lock_timeout, and must not keep a
		// flight's other appends waiting with it.
		s.commitGroup([]*appendReq{r})
	case fly:
		go s.fly()
	}
	<-r.done
	return r.last, r.err
}

// fly commits groups until no append waits.
func (s *Store) fly() {
	for {
		group := s.commits.take(s.opts.MaxGroup)
		if group == nil {
			return
		}
		s.commitGroup(group)
	}
}

// commitGroup commits group and answers each of its appends. If the
// transaction fails on one append's data, each append is tried again
// alone, so that the failure is that append's own, and its stream then
// commits alone until it commits. Any other failure (a timeout, a lost
// connection) is every append's at once, and their followers go on from
// the stored cursors, rather than each waiting out another timeout.
func (s *Store) commitGroup(group []*appendReq) {
	err := s.appendGroup(group)
	if err != nil && len(group) > 1 && appendDataError(err) {
		for _, r := range group {
			s.commitGroup([]*appendReq{r})
		}
		return
	}
	s.commits.setAlone(group, err)
	appendsPerCommit.Observe(float64(len(group)))
	for _, r := range group {
		if err != nil {
			r.err, r.last = err, 0
		}
		if r.err == nil {
			s.committed(r.run, r.last+1-uint64(len(r.lines)), r.json)
		}
		close(r.done)
	}
}

// appendGroup writes group in one transaction. An append whose stream's
// cursor is not its prev gets its CursorConflict and writes nothing; the
// others commit. Rows are locked in one order by every group, every
// cursor (by run, then stream, bytewise: COLLATE "C", as retire locks a
// run's) before any run (by id), so two relays' groups, or a group and
// retention, never wait for each other in a cycle.
func (s *Store) appendGroup(group []*appendReq) error {
	ordered := append([]*appendReq(nil), group...)
	sort.Slice(ordered, func(i, j int) bool {
		a, b := ordered[i], ordered[j]
		return a.run < b.run || a.run == b.run && a.stream < b.stream
	})
	for _, r := range ordered {
		r.last, r.err, r.json = 0, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(s.opts.CommitTimeout, s.opts.Timeout))
	defer cancel()
	defer func() {
		if ctx.Err() == context.DeadlineExceeded {
			// Its connection went silent, and the pool's idle ones likely
			// with it (one network path): each would hold the next reader
			// for the whole Timeout. The pool closes them all, the busy
			// ones as they are given back, and dials afresh.
			s.pool.Reset()
		}
	}()
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		moved, err := s.advanceCursors(ctx, tx, ordered)
		if err != nil {
			return err
		}
		if err := s.conflicts(ctx, tx, moved); err != nil {
			return err
		}
		return s.writeLines(ctx, tx, ordered)
	})
}

// advanceCursors moves each append's stream cursor from prev to cur and
// returns the appends whose stored cursor was not prev.
func (s *Store) advanceCursors(ctx context.Context, tx pgx.Tx, ordered []*appendReq) ([]*appendReq, error) {
	b := &pgx.Batch{}
	for _, r := range ordered {
		if r.prev == (store.Cursor{}) {
			b.Queue(s.q.cursorFirst, r.run, r.stream, r.cur.TS, r.cur.Count)
		} else {
			b.Queue(s.q.cursorNext, r.run, r.stream, r.cur.TS, r.cur.Count, r.prev.TS, r.prev.Count)
		}
	}
	br := tx.SendBatch(ctx, b)
	var moved []*appendReq
	for _, r := range ordered {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return nil, err
		}
		if tag.RowsAffected() == 0 {
			moved = append(moved, r)
		}
	}
	return moved, br.Close()
}

// conflicts answers each append in moved with the cursor its stream has.
func (s *Store) conflicts(ctx context.Context, tx pgx.Tx, moved []*appendReq) error {
	for _, r := range moved {
		stored, err := s.cursor(ctx, tx, r.run, r.stream)
		if err != nil {
			return err
		}
		r.err = &store.CursorConflict{Run: r.run, Stream: r.stream, Prev: r.prev, Stored: stored}
	}
	return nil
}

// writeLines numbers the lines of every append whose cursor moved, run by
// run from the run's counters as it advances them (which locks its row),
// and writes them.
func (s *Store) writeLines(ctx context.Context, tx pgx.Tx, ordered []*appendReq) error {
	type runRows struct {
		lines, bytes int64
		seen         time.Time
		num, next    int64 // next: the seq of the run's next line in this group
	}
	runs := map[string]*runRows{}
	var ids []string
	for _, r := range ordered {
		if r.err != nil {
			continue
		}
		rr := runs[r.run]
		if rr == nil {
			rr = &runRows{}
			runs[r.run] = rr
			ids = append(ids, r.run) // in run order: ordered is sorted
		}
		rr.lines += int64(len(r.lines))
		for i := range r.lines {
			rr.bytes += int64(len(r.lines[i].Line))
		}
		if r.now.After(rr.seen) {
			rr.seen = r.now
		}
	}
	if len(ids) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, id := range ids {
		rr := runs[id]
		b.Queue(s.q.runAdvance, id, rr.lines, rr.bytes, nanos(rr.seen), freshRecord(id))
	}
	br := tx.SendBatch(ctx, b)
	for _, id := range ids {
		rr := runs[id]
		var last int64
		if err := br.QueryRow().Scan(&rr.num, &last); err != nil {
			br.Close()
			return err
		}
		rr.next = last - rr.lines + 1
	}
	if err := br.Close(); err != nil {
		return err
	}
	// The lines go as the four arrays of one INSERT, in PostgreSQL's
	// binary format written here as they are numbered and encoded (pgx
	// would encode a bytea[] an element at a time). Not by COPY, though it
	// takes about the same bytes: the server ends a transaction whose
	// client went quiet only while it waits for the client's next
	// statement (IdleInTransaction), and a COPY FROM STDIN waits for its
	// data for good, neither statement_timeout nor a cancel reaching it. A
	// relay frozen mid-COPY kept its runs' rows locked, from the replicas
	// that took them over, for as long as it stayed frozen. This statement
	// goes with its parameters and its Sync in one write, after which the
	// server needs nothing more from the client.
	a := lineArrayPool.Get().(*lineArrays)
	defer a.release()
	a.reset()
	for _, r := range ordered {
		if r.err != nil {
			continue
		}
		rr := runs[r.run]
		at := len(a.data)
		for i := range r.lines {
			r.lines[i].Seq = uint64(rr.next)
			rr.next++
			if err := a.add(rr.num, &r.lines[i]); err != nil {
				return err
			}
		}
		r.last = uint64(rr.next - 1)
		r.json = a.carried(at, len(r.lines))
	}
	if a.n == 0 {
		return nil
	}
	sd, err := tx.Conn().Prepare(ctx, s.q.lines, s.q.lines)
	if err != nil {
		return err
	}
	_, err = tx.Conn().PgConn().ExecPrepared(ctx, sd.Name, a.values(), binaryParams, nil).Close()
	return err
}

// freshRecord is the record of a run whose lines come before anything
// else of it: its id, its phase Unknown.
func freshRecord(id string) []byte {
	rec, _ := json.Marshal(&store.Run{ID: id, Phase: "Unknown"})
	return rec
}

// lineArrays are a group's lines as the lines INSERT's four parameters,
// one-dimensional arrays without nulls in PostgreSQL's binary format: the
// runs' keys, the lines' sequence numbers, their JSON's sizes and their
// JSON.
type lineArrays struct {
	n                    int
	run, seq, size, data []byte
}

// The element types' OIDs: bigint, integer, bytea.
const (
	oidInt8  = 20
	oidInt4  = 23
	oidBytea = 17
)

var binaryParams = []int16{1, 1, 1, 1}

// lineArrayPool holds the arrays of groups that committed, for the next,
// which grows them only past the largest group so far. Arrays over
// lineArrayMax (a long line's) are not kept.
var lineArrayPool = sync.Pool{New: func() any { return new(lineArrays) }}

const lineArrayMax = 1 << 20

// arrayHeader starts an array of elem: one dimension, no nulls, its
// length (set by values) and lower bound 1.
func arrayHeader(b []byte, elem uint32) []byte {
	for _, v := range [...]uint32{1, 0, elem, 0, 1} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	return b
}

func (a *lineArrays) reset() {
	a.n = 0
	a.run, a.seq = arrayHeader(a.run[:0], oidInt8), arrayHeader(a.seq[:0], oidInt8)
	a.size, a.data = arrayHeader(a.size[:0], oidInt4), arrayHeader(a.data[:0], oidBytea)
}

// add appends the line l of the run keyed num, its JSON encoded in place.
func (a *lineArrays) add(num int64, l *store.Line) error {
	a.run = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(a.run, 8), uint64(num))
	a.seq = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(a.seq, 8), l.Seq)
	at := len(a.data)
	data, err := l.AppendJSON(append(a.data, 0, 0, 0, 0))
	if err != nil {
		return err
	}
	size := uint32(len(data) - at - 4)
	binary.BigEndian.PutUint32(data[at:], size)
	a.data = data
	a.size = binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(a.size, 4), size)
	a.n++
	return nil
}

// carried copies the JSON of the n lines added since data held at bytes,
// for the tails and the notifications (tails.go); nil if none, or more
// than carryBytes.
func (a *lineArrays) carried(at, n int) [][]byte {
	if n == 0 || len(a.data)-at-4*n > carryBytes {
		return nil
	}
	region := bytes.Clone(a.data[at:]) // each line's size, then its JSON
	out := make([][]byte, n)
	for i := range out {
		size := int(binary.BigEndian.Uint32(region))
		out[i], region = region[4:4+size:4+size], region[4+size:]
	}
	return out
}

// values are the four parameters, each array's length set.
func (a *lineArrays) values() [][]byte {
	out := [][]byte{a.run, a.seq, a.size, a.data}
	for _, v := range out {
		binary.BigEndian.PutUint32(v[12:], uint32(a.n))
	}
	return out
}

// release gives the arrays back to the pool, unless one grew past
// lineArrayMax.
func (a *lineArrays) release() {
	if max(cap(a.run), cap(a.seq), cap(a.size), cap(a.data)) <= lineArrayMax {
		lineArrayPool.Put(a)
	}
}

var appendsPerCommit = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "clipjob_relay_store_appends_per_commit",
	Help:    "Appends (each a stream's lines and cursor) committed in one PostgreSQL transaction.",
	Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
})

// Collectors returns the store's metrics, for the relay to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{appendsPerCommit}
}
