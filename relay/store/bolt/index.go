package bolt

import (
	"encoding/json"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/paperclipai/clipjob/relay/store"
)

// runIndex holds a summary of every run's record (what lists filter, sort
// and retain by) in memory, so listing runs decodes nothing. Only the
// summary: a run's result is its agent's, and can be megabytes
// (TestHostileResultsArePinnedInTheHeapByTheIndex). Transactions read the
// bucket, never this, so a retried one computes from what is committed.
//
// A summary enters the index from its transaction's commit handler, which
// bbolt runs after releasing the writer lock, so handlers can run out of
// order: each entry keeps its transaction id, and an older write (or one
// of a deleted run, kept as a tombstone for a while) never replaces a
// newer one.
type runIndex struct {
	mu         sync.RWMutex
	byID       map[string]indexed
	tombstones map[string]tombstone
}

type indexed struct {
	run  store.Summary
	txid int
}

type tombstone struct {
	txid int
	at   time.Time
}

// tombstoneTTL outlasts any commit handler still in flight by far.
const tombstoneTTL = time.Minute

func (x *runIndex) load(db *bbolt.DB) error {
	x.byID, x.tombstones = map[string]indexed{}, map[string]tombstone{}
	return db.View(func(tx *bbolt.Tx) error {
		txid := tx.ID()
		return tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			var r store.Summary
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			x.byID[string(k)] = indexed{run: r, txid: txid}
			return nil
		})
	})
}

// put records what transaction txid committed for run r.ID.
func (x *runIndex) put(r store.Summary, txid int) {
	id := r.ID
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur, ok := x.byID[id]; ok && cur.txid > txid {
		return
	}
	if t, ok := x.tombstones[id]; ok && t.txid > txid {
		return
	}
	x.byID[id] = indexed{run: r, txid: txid}
}

// remove records that transaction txid deleted the runs ids at now.
func (x *runIndex) remove(ids []string, txid int, now time.Time) {
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

// runs returns the summaries keep accepts (all when keep is nil).
func (x *runIndex) runs(keep func(*store.Summary) bool) []store.Summary {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []store.Summary
	for _, e := range x.byID {
		if keep == nil || keep(&e.run) {
			out = append(out, e.run)
		}
	}
	return out
}
