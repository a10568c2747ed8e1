package store

import (
	"encoding/json"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
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
	run  Summary
	txid int
}

// Summary is the part of a run's record lists and retention read.
type Summary struct {
	ID        string    `json:"id"`
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod,omitempty"`
	PodUID    string    `json:"podUid,omitempty"`
	Agent     string    `json:"agent,omitempty"`
	Company   string    `json:"company,omitempty"`
	Phase     string    `json:"phase"`
	Done      bool      `json:"done"`
	LastSeq   uint64    `json:"lastSeq"`
	Bytes     int64     `json:"bytes"`
	SeenAt    time.Time `json:"seenAt"`
}

// summaryOf is the summary of a record being written.
func summaryOf(r *Run) Summary {
	return Summary{ID: r.ID, Namespace: r.Namespace, Pod: r.Pod, PodUID: r.PodUID, Agent: r.Agent, Company: r.Company,
		Phase: r.Phase, Done: r.Done, LastSeq: r.LastSeq, Bytes: r.Bytes, SeenAt: r.SeenAt}
}

// Run is the summary as a Run record with only those fields set.
func (s Summary) Run() Run {
	return Run{ID: s.ID, Namespace: s.Namespace, Pod: s.Pod, PodUID: s.PodUID, Agent: s.Agent, Company: s.Company, Phase: s.Phase,
		Done: s.Done, LastSeq: s.LastSeq, Bytes: s.Bytes, SeenAt: s.SeenAt}
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
			var r Summary
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			x.byID[string(k)] = indexed{run: r, txid: txid}
			return nil
		})
	})
}

// put records what transaction txid committed for run r.ID.
func (x *runIndex) put(r Summary, txid int) {
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

// runs returns the summaries keep accepts (all when keep is nil).
func (x *runIndex) runs(keep func(*Summary) bool) []Summary {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []Summary
	for _, e := range x.byID {
		if keep == nil || keep(&e.run) {
			out = append(out, e.run)
		}
	}
	return out
}
