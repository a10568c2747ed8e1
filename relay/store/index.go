package store

import (
	"encoding/json"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// runIndex holds every run's record decoded, beside the runs bucket, so
// listing runs decodes nothing: GET /v1/runs decoded every record, 125 ms
// over 10,000 runs (docs/benchmarks.md). Transactions still read records
// from the bucket, never from here, so a transaction that rolls back and
// is retried (bbolt's Batch) computes from what is committed.
//
// A record enters the index from its transaction's commit handler. bbolt
// runs those after the writer lock is released, so two transactions'
// handlers can run out of order: each entry keeps the transaction id
// that wrote it, and an older write (or one of a deleted run, kept as a
// tombstone for a while) never replaces a newer one.
type runIndex struct {
	mu         sync.RWMutex
	byID       map[string]indexed
	tombstones map[string]tombstone
}

type indexed struct {
	run  *Run
	txid int
}

type tombstone struct {
	txid int
	at   time.Time
}

// tombstoneTTL outlasts any commit handler still in flight by far.
const tombstoneTTL = time.Minute

func (x *runIndex) load(db *bolt.DB) error {
	x.byID, x.tombstones = map[string]indexed{}, map[string]tombstone{}
	return db.View(func(tx *bolt.Tx) error {
		txid := tx.ID()
		return tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			var r Run
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			x.byID[string(k)] = indexed{run: &r, txid: txid}
			return nil
		})
	})
}

// put records what transaction txid committed for run id.
func (x *runIndex) put(id string, v []byte, txid int) {
	var r Run
	if err := json.Unmarshal(v, &r); err != nil {
		return // it was marshalled from a Run a moment ago
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur, ok := x.byID[id]; ok && cur.txid > txid {
		return
	}
	if t, ok := x.tombstones[id]; ok && t.txid > txid {
		return
	}
	x.byID[id] = indexed{run: &r, txid: txid}
}

// remove records that transaction txid deleted the runs ids.
func (x *runIndex) remove(ids []string, txid int) {
	now := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, t := range x.tombstones {
		if now.Sub(t.at) > tombstoneTTL {
			delete(x.tombstones, id)
		}
	}
	for _, id := range ids {
		if cur, ok := x.byID[id]; ok && cur.txid > txid {
			continue // recreated after the deletion
		}
		delete(x.byID, id)
		x.tombstones[id] = tombstone{txid: txid, at: now}
	}
}

// runs returns copies of the records keep accepts (all when keep is nil).
func (x *runIndex) runs(keep func(*Run) bool) []Run {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []Run
	for _, e := range x.byID {
		if keep == nil || keep(e.run) {
			out = append(out, *e.run)
		}
	}
	return out
}

// get returns a copy of run id's record, or nil.
func (x *runIndex) get(id string) *Run {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e, ok := x.byID[id]
	if !ok {
		return nil
	}
	r := *e.run
	return &r
}
