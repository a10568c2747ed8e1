package collect

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/paperclipai/clipjob/relay/store"
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
	Store *store.Store

	mu     sync.Mutex
	perRun map[string]*sync.Mutex
}

// Path is where run's mirror file is.
func (m *Mirror) Path(r *store.Run) string {
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
	st, err := m.Store.MirrorState(run)
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
		st = store.MirrorState{} // the file lost content (replaced by hand): rebuild it
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
	return m.Store.SetMirrorState(run, st)
}
