package bolt

import (
	"encoding/json"

	bbolt "go.etcd.io/bbolt"

	"github.com/paperclipai/clipjob/relay/store"
)

var bucketRetired = []byte("retired")

// retiredKey keys a Retired: namespaces hold no "/".
func retiredKey(namespace, jobUID string) []byte { return []byte(namespace + "/" + jobUID) }

// putRetired records t in tx (Retain's transaction).
func putRetired(tx *bbolt.Tx, t *store.Retired) error {
	b, err := tx.CreateBucketIfNotExists(bucketRetired)
	if err != nil {
		return err
	}
	if old := b.Get(retiredKey(t.Namespace, t.JobUID)); old != nil {
		var prev store.Retired
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
func (s *Store) RetiredRun(namespace, jobUID string) (*store.Retired, error) {
	var out *store.Retired
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketRetired)
		if b == nil {
			return nil
		}
		if v := b.Get(retiredKey(namespace, jobUID)); v != nil {
			out = &store.Retired{}
			return json.Unmarshal(v, out)
		}
		return nil
	})
	return out, err
}

// RetiredRuns returns everything kept of retired runs.
func (s *Store) RetiredRuns() ([]store.Retired, error) {
	var out []store.Retired
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketRetired)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			var t store.Retired
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
func (s *Store) ForgetRetired(gone ...store.Retired) error {
	if len(gone) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
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
