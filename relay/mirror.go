package relay

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Mirror writes each run's agent output as NDJSON on the shared volume, in
// the layout Paperclip's Claude adapter reads:
// <Dir>/run-logs/<company>/<agent>/<run>.pod.ndjson. Readers that tail
// that file keep working.
//
// The file is derived from the store, exactly once: after each sync the
// store records (last mirrored sequence, file size) together; a sync first
// cuts the file back to the recorded size, dropping whatever a crash left
// after the last record, then appends from the recorded sequence.
type Mirror struct {
	Dir   string
	Store *Store

	mu     sync.Mutex
	perRun map[string]*sync.Mutex
}

var bucketMirror = []byte("mirror")

type mirrorState struct {
	Seq  uint64 `json:"seq"`
	Size int64  `json:"size"`
}

// Path is where run's mirror file is.
func (m *Mirror) Path(r *Run) string {
	company := r.Company
	if company == "" {
		company = "_"
	}
	agent := r.Agent
	if agent == "" {
		agent = "_"
	}
	// Label values cannot hold a path separator or be "..": safe as names.
	return filepath.Join(m.Dir, "run-logs", company, agent, r.ID+".pod.ndjson")
}

func (m *Mirror) lock(run string) func() {
	m.mu.Lock()
	if m.perRun == nil {
		m.perRun = map[string]*sync.Mutex{}
	}
	l, ok := m.perRun[run]
	if !ok {
		l = &sync.Mutex{}
		m.perRun[run] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Sync appends what the store has of run and the file does not. Only the
// agent (first app) container's lines are mirrored, as the adapter's tee
// captured only the agent's output.
func (m *Mirror) Sync(run string) error {
	if m == nil || m.Dir == "" {
		return nil
	}
	defer m.lock(run)()
	r, err := m.Store.Run(run)
	if err != nil || r == nil || r.Agent == "" {
		return err
	}
	st, err := m.Store.mirrorState(run)
	if err != nil {
		return err
	}
	path := m.Path(r)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.Size() < st.Size {
		st = mirrorState{} // the file lost content (replaced by hand): rebuild it
	}
	if err := f.Truncate(st.Size); err != nil {
		return err
	}
	if _, err := f.Seek(st.Size, 0); err != nil {
		return err
	}
	size := st.Size
	for {
		lines, err := m.Store.Lines(run, st.Seq, 1000)
		if err != nil {
			return err
		}
		if len(lines) == 0 {
			break
		}
		for _, l := range lines {
			if r.MainContainer == "" || l.Container == r.MainContainer {
				n, err := fmt.Fprintln(f, l.Line)
				if err != nil {
					return err
				}
				size += int64(n)
			}
			st.Seq = l.Seq
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	st.Size = size
	return m.Store.setMirrorState(run, st)
}

func (s *Store) mirrorState(run string) (mirrorState, error) {
	var st mirrorState
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

func (s *Store) setMirrorState(run string, st mirrorState) error {
	v, _ := json.Marshal(st)
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMirror)
		if err != nil {
			return err
		}
		return b.Put([]byte(run), v)
	})
}
