package bolt

import (
	"encoding/json"

	bbolt "go.etcd.io/bbolt"

	"github.com/paperclipai/clipjob/relay/store"
)

// retiredKey keys a Retired: namespaces hold no "/".
func retiredKey(namespace, jobUID string) []byte { return []byte(namespace + "/" + jobUID) }

// putRetired records t in tx (Retain's transaction).
func putRetired(tx *bbolt.Tx, t *store.Retired) error {
	var prev store.Retired
	if found, err := get(tx, bucketRetired, retiredKey(t.Namespace, t.JobUID), &prev); found && err == nil && prev.PodCreated.After(t.PodCreated) {
		return nil // a later attempt of the Job's run was retired already
	}
	return put(tx, bucketRetired, retiredKey(t.Namespace, t.JobUID), t)
}

func (s *Store) RetiredRun(namespace, jobUID string) (*store.Retired, error) {
	var out *store.Retired
	err := s.db.View(func(tx *bbolt.Tx) error {
		var t store.Retired
		found, err := get(tx, bucketRetired, retiredKey(namespace, jobUID), &t)
		if found && err == nil {
			out = &t
		}
		return err
	})
	return out, err
}

func (s *Store) RetiredRuns() ([]store.Retired, error) {
	var out []store.Retired
	err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketRetired).ForEach(func(_, v []byte) error {
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

func (s *Store) ForgetRetired(gone ...store.Retired) error {
	if len(gone) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		for _, r := range gone {
			if err := tx.Bucket(bucketRetired).Delete(retiredKey(r.Namespace, r.JobUID)); err != nil {
				return err
			}
		}
		return nil
	})
}
