package store

import (
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"
)

var bucketRetired = []byte("retired")

// Retired is what is kept of a run retention deleted while its pods may
// remain, so that no relay collects those pods again and rewrites what
// retention removed. It is keyed by the run's namespace and Job (a pod
// names its controller itself, so one elsewhere may claim another
// namespace's Job UID), and forgotten once no pod of that Job remains.
type Retired struct {
	JobUID string `json:"jobUid"`
	// Namespace is the Job's (its pods'): a relay watching other
	// namespaces cannot tell whether its pods remain.
	Namespace string `json:"namespace"`
	// Run is the retired run's key, for logs and operators.
	Run string `json:"run"`
	// PodCreated is the run's newest pod's creation: a pod of the Job
	// created later is a new attempt of the run, and is collected.
	PodCreated time.Time `json:"podCreated"`
	RetiredAt  time.Time `json:"retiredAt"`
}

// Covers says whether a pod of the Job created at created is one of the
// retired run's pods.
func (r *Retired) Covers(created time.Time) bool {
	return r != nil && !created.After(r.PodCreated)
}

// RetiredOf returns what retention keeps of run r, retired at now: nil
// when the record names no Job (a record from before runs were bound to
// one), whose pods then cannot be told apart.
func RetiredOf(r *Run, now time.Time) *Retired {
	if r == nil || !ValidJobUID(r.JobUID) {
		return nil
	}
	t := &Retired{JobUID: r.JobUID, Namespace: r.Namespace, Run: r.ID, RetiredAt: now}
	if r.PodCreated != nil {
		t.PodCreated = *r.PodCreated
	}
	return t
}

// retiredKey keys a Retired: namespaces hold no "/".
func retiredKey(namespace, jobUID string) []byte { return []byte(namespace + "/" + jobUID) }

// putRetired records t in tx (Retain's transaction).
func putRetired(tx *bolt.Tx, t *Retired) error {
	b, err := tx.CreateBucketIfNotExists(bucketRetired)
	if err != nil {
		return err
	}
	if old := b.Get(retiredKey(t.Namespace, t.JobUID)); old != nil {
		var prev Retired
		if json.Unmarshal(old, &prev) == nil && prev.PodCreated.After(t.PodCreated) {
			return nil // a later attempt of the Job's run was retired already
		}
	}
	v, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return b.Put(retiredKey(t.Namespace, t.JobUID), v)
}

// RetiredRun returns what is kept of the retired run of Job jobUID in
// namespace, or nil if none.
func (s *Store) RetiredRun(namespace, jobUID string) (*Retired, error) {
	var out *Retired
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRetired)
		if b == nil {
			return nil
		}
		if v := b.Get(retiredKey(namespace, jobUID)); v != nil {
			out = &Retired{}
			return json.Unmarshal(v, out)
		}
		return nil
	})
	return out, err
}

// RetiredRuns returns everything kept of retired runs.
func (s *Store) RetiredRuns() ([]Retired, error) {
	var out []Retired
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRetired)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			var t Retired
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}

// ForgetRetired deletes what is kept of the retired runs given.
func (s *Store) ForgetRetired(gone ...Retired) error {
	if len(gone) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRetired)
		if b == nil {
			return nil
		}
		for _, r := range gone {
			if err := b.Delete(retiredKey(r.Namespace, r.JobUID)); err != nil {
				return err
			}
		}
		return nil
	})
}
