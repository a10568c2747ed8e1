package store

import (
	"encoding/json"

	bolt "go.etcd.io/bbolt"
)

var bucketMirror = []byte("mirror")

// MirrorState is how much of a run's log its NDJSON mirror file holds: up
// to sequence Seq, Size bytes. It is committed after the file is written,
// so a crash between the two is found (the file is longer) and repaired.
type MirrorState struct {
	Seq  uint64 `json:"seq"`
	Size int64  `json:"size"`
	// Inode of the file written: another file swapped in under the name
	// is rebuilt from the store, whatever its size.
	Inode uint64 `json:"inode,omitempty"`
	// Done: the run ended and its file and done marker were written; the
	// mirror never touches them again, so a reader may remove them.
	Done bool `json:"done,omitempty"`
}

// MirrorState returns what the run's mirror holds; zero if nothing.
func (s *Store) MirrorState(run string) (MirrorState, error) {
	var st MirrorState
	err := s.db.View(func(tx *bolt.Tx) error {
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
func (s *Store) SetMirrorState(run string, st MirrorState) error {
	v, _ := json.Marshal(st)
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMirror)
		if err != nil {
			return err
		}
		return b.Put([]byte(run), v)
	})
}
