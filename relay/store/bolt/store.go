// Package bolt keeps the relay's runs and lines in one bbolt file on the
// relay's volume: the default store.Backend, for one relay.
package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/relay/store"
)

// Why bbolt: one file on the relay's volume, pure Go, crash-safe without
// recovery, and ordered keys, so "lines of run R after sequence N" is a
// range scan. Freed pages are reused, so retention bounds the file.

var (
	bucketRuns    = []byte("runs")
	bucketLines   = []byte("lines") // one nested bucket per run: seq -> store.Line
	bucketCursors = []byte("cursors")
	bucketMirror  = []byte("mirror")  // run -> store.MirrorState
	bucketRetired = []byte("retired") // namespace/Job UID -> store.Retired
)

// Store is the relay's embedded store, the default store.Backend; the
// methods of the interface are documented there.
type Store struct {
	db *bbolt.DB
	// Clock stamps a run first seen with no line, and times the index's
	// tombstones. Open sets the real clock.
	Clock   clock.PassiveClock
	index   runIndex
	changes store.Changes
	// stopReleasing ends releasing what is mapped, and releasing is done
	// then (mapping.go).
	stopReleasing context.CancelFunc
	releasing     sync.WaitGroup
}

var _ store.Backend = (*Store)(nil)

// Open opens (or creates) the store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	db, err := bbolt.Open(filepath.Join(dir, "relay.db"), 0o640, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening store in %s: %w", dir, err)
	}
	// Concurrent appends of many streams share one commit (and fsync); a
	// lone stream waits at most this long for company.
	db.MaxBatchDelay = 2 * time.Millisecond
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketRuns, bucketLines, bucketCursors, bucketMirror, bucketRetired} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	st := &Store{db: db, Clock: clock.RealClock{}}
	if err := st.index.load(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("reading the runs of the store in %s: %w", dir, err)
	}
	var ctx context.Context
	ctx, st.stopReleasing = context.WithCancel(context.Background())
	st.releasing.Go(func() { wait.UntilWithContext(ctx, func(context.Context) { _ = st.releaseMapped() }, releaseInterval) })
	return st, nil
}

// Close flushes and closes the store.
func (s *Store) Close() error {
	s.stopReleasing()
	s.releasing.Wait()
	return s.db.Close()
}

// Size is the store file's size in bytes.
func (s *Store) Size() int64 {
	var n int64
	_ = s.db.View(func(tx *bbolt.Tx) error { n = tx.Size(); return nil })
	return n
}

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

func (s *Store) AppendAfter(run, stream string, prev, cur store.Cursor, lines []store.Line, now time.Time) (uint64, error) {
	var last uint64
	err := s.db.Batch(func(tx *bbolt.Tx) error {
		// Checked first, in the transaction that writes: the cursor cannot
		// move between the check and the commit.
		var stored store.Cursor
		if _, err := get(tx, bucketCursors, cursorKey(run, stream), &stored); err != nil {
			return err
		}
		if stored != prev {
			return &store.CursorConflict{Run: run, Stream: stream, Prev: prev, Stored: stored}
		}
		r, err := getRun(tx, run)
		if err != nil {
			return err
		}
		if r == nil {
			r = &store.Run{ID: run, Phase: "Unknown"}
		}
		lb, err := tx.Bucket(bucketLines).CreateBucketIfNotExists([]byte(run))
		if err != nil {
			return err
		}
		// Sequence keys only ever grow: fill pages whole, not half.
		lb.FillPercent = 1.0
		for i := range lines {
			r.LastSeq++
			lines[i].Seq = r.LastSeq
			v, err := lines[i].AppendJSON(nil)
			if err != nil {
				return err
			}
			if err := lb.Put(seqKey(r.LastSeq), v); err != nil {
				return err
			}
			r.Bytes += int64(len(lines[i].Line))
		}
		r.SeenAt = now
		if err := put(tx, bucketCursors, cursorKey(run, stream), cur); err != nil {
			return err
		}
		last = r.LastSeq
		return s.putRun(tx, r)
	})
	if err == nil {
		s.changes.Notify(run)
	}
	return last, err
}

// cursorKey keeps a run's cursors together, so retention removes them
// with the run.
func cursorKey(run, stream string) []byte { return []byte(run + "\x00" + stream) }

func (s *Store) Cursor(run, stream string) (store.Cursor, error) {
	var c store.Cursor
	err := s.db.View(func(tx *bbolt.Tx) error {
		_, err := get(tx, bucketCursors, cursorKey(run, stream), &c)
		return err
	})
	return c, err
}

func (s *Store) UpdateRun(id string, fn func(*store.Run)) (*store.Run, error) {
	var out *store.Run
	err := s.db.Batch(func(tx *bbolt.Tx) error {
		r, err := getRun(tx, id)
		if err != nil {
			return err
		}
		if r == nil {
			// Seen now, though nothing is stored yet: retention counts from
			// here for a run that never writes a line.
			r = &store.Run{ID: id, Phase: "Pending", SeenAt: s.Clock.Now()}
		}
		fn(r)
		out = r
		return s.putRun(tx, r)
	})
	if err == nil {
		s.changes.Notify(id)
	}
	return out, err
}

func (s *Store) Run(id string) (*store.Run, error) {
	var r *store.Run
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		r, err = getRun(tx, id)
		return err
	})
	return r, err
}

// RunsWhere implements store.Backend from the index (see runIndex):
// committed records, decoded once. Read a run whole with Run.
func (s *Store) RunsWhere(f store.Filter) ([]store.Summary, error) {
	out := s.index.runs(f.Match)
	sort.Slice(out, func(i, j int) bool { return out[i].SeenAt.After(out[j].SeenAt) })
	return out, nil
}

// Page implements store.Backend: a log stream sends the stored JSON
// as it is. Pages are bounded by the stored bytes.
func (s *Store) Page(run string, after uint64, limit int, each func(store.RawLine)) (lastSeq uint64, done, found bool, err error) {
	err = s.db.View(func(tx *bbolt.Tx) error {
		var r struct { // of the record, only these: its result may be megabytes
			LastSeq uint64 `json:"lastSeq"`
			Done    bool   `json:"done"`
		}
		if found, err = get(tx, bucketRuns, []byte(run), &r); !found || err != nil {
			return err
		}
		lastSeq, done = r.LastSeq, r.Done
		b := tx.Bucket(bucketLines).Bucket([]byte(run))
		if b == nil || after >= store.MaxSeq { // past every line (and after+1 would wrap to the first)
			return nil
		}
		c, lines, size := b.Cursor(), 0, 0
		for k, v := c.Seek(seqKey(after + 1)); k != nil; k, v = c.Next() {
			each(store.RawLine{Seq: binary.BigEndian.Uint64(k), JSON: v})
			if lines, size = lines+1, size+len(v); (limit > 0 && lines >= limit) || size >= store.PageBytes {
				break
			}
		}
		return nil
	})
	return lastSeq, done, found, err
}

func (s *Store) Changed(run string) <-chan struct{} { return s.changes.Changed(run) }

func (s *Store) Retain(maxAge time.Duration, maxBytes int64, now time.Time) ([]store.Run, error) {
	runs, err := s.RunsWhere(store.Filter{})
	if err != nil {
		return nil, err
	}
	var drop []string
	var dropped []store.Run
	for _, r := range store.Retirees(runs, maxAge, maxBytes, now) {
		drop = append(drop, r.ID)
		dropped = append(dropped, r.Run())
	}
	if len(drop) == 0 {
		return nil, nil
	}
	err = s.db.Update(func(tx *bbolt.Tx) error {
		txid := tx.ID()
		tx.OnCommit(func() { s.index.remove(drop, txid, s.Clock.Now()) })
		for _, id := range drop {
			// A record that does not decode is retired all the same, with
			// no Retired kept: it must not hold retention up for good.
			if r, err := getRun(tx, id); err == nil {
				if t := store.RetiredOf(r, now); t != nil {
					if err := putRetired(tx, t); err != nil {
						return err
					}
				}
			}
			if err := tx.Bucket(bucketRuns).Delete([]byte(id)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketLines).DeleteBucket([]byte(id)); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return err
			}
			if err := tx.Bucket(bucketMirror).Delete([]byte(id)); err != nil {
				return err
			}
			c := tx.Bucket(bucketCursors).Cursor()
			prefix := cursorKey(id, "")
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.changes.Notify(drop...) // followers of a deleted run re-read and find it gone
	return dropped, nil
}

func getRun(tx *bbolt.Tx, id string) (*store.Run, error) {
	var r store.Run
	if found, err := get(tx, bucketRuns, []byte(id), &r); !found || err != nil {
		return nil, err
	}
	return &r, nil
}

// putRun writes a run's record; the index learns it when, and only if,
// the transaction commits.
func (s *Store) putRun(tx *bbolt.Tx, r *store.Run) error {
	sum, txid := r.Summary(), tx.ID()
	if err := put(tx, bucketRuns, []byte(r.ID), r); err != nil {
		return err
	}
	tx.OnCommit(func() { s.index.put(sum, txid) })
	return nil
}

// get decodes the JSON at key in bucket into v; false if there is none.
func get(tx *bbolt.Tx, bucket, key []byte, v any) (bool, error) {
	data := tx.Bucket(bucket).Get(key)
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("%s %q: %w", bucket, key, err)
	}
	return true, nil
}

// put stores v at key in bucket as JSON.
func put(tx *bbolt.Tx, bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put(key, data)
}

func (s *Store) MirrorState(run string) (store.MirrorState, error) {
	var st store.MirrorState
	err := s.db.View(func(tx *bbolt.Tx) error {
		_, err := get(tx, bucketMirror, []byte(run), &st)
		return err
	})
	return st, err
}

func (s *Store) SetMirrorState(run string, st store.MirrorState) error {
	return s.db.Update(func(tx *bbolt.Tx) error { return put(tx, bucketMirror, []byte(run), st) })
}
