package bolt

import (
	"encoding/json"

	bbolt "go.etcd.io/bbolt"

	"github.com/paperclipai/clipjob/relay/store"
)

var bucketMirror = []byte("mirror")

// MirrorState returns what the run's mirror holds; zero if nothing.
func (s *Store) MirrorState(run string) (store.MirrorState, error) {
	var st store.MirrorState
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketMirror)
		if b == nil {
			return nil
		}
		if v := b.Get([]byte(run)); v != nil {
			return json.Unmarshal(v, &st)
		}
		return nil
	})
	return st, err
}

// SetMirrorState records what the run's mirror holds.
func (s *Store) SetMirrorState(run string, st store.MirrorState) error {
	v, _ := json.Marshal(st)
	return s.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMirror)
		if err != nil {
			return err
		}
		return b.Put([]byte(run), v)
	})
}
