package collect

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

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
	return filepath.Join(append([]string{m.Dir}, mirrorPath(r)...)...)
}

// mirrorPath is the file's path under Dir, one element per component.
// Label values cannot hold a path separator or be "..": safe as names.
func mirrorPath(r *store.Run) []string {
	company := r.Company
	if company == "" {
		company = "_"
	}
	agent := r.Agent
	if agent == "" {
		agent = "_"
	}
	return []string{"run-logs", company, agent, r.ID + ".pod.ndjson"}
}

// UnsafePathError refuses a mirror path that is not plain directories and
// a regular file: Dir is on the volume agents write to, and a symlink (or
// hard link, or FIFO) planted on the path would make the relay truncate
// and write a file it was never meant to touch.
type UnsafePathError struct {
	Path   string
	Reason string
}

func (e *UnsafePathError) Error() string {
	return fmt.Sprintf("refusing to mirror to %s: %s", e.Path, e.Reason)
}

// open opens the run's mirror file for writing, creating what is missing.
// Every component under Dir is opened relative to its parent with
// O_NOFOLLOW, so no symlink is followed even if one is swapped in while
// this runs; the file must be a regular file with one link.
func (m *Mirror) open(r *store.Run) (*os.File, error) {
	parts := mirrorPath(r)
	// Dir itself is the operator's (a mount point); only what is under it
	// is the agents' to plant things in.
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return nil, err
	}
	dir, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: m.Dir, Err: err}
	}
	path := m.Dir
	for _, name := range parts[:len(parts)-1] {
		path = filepath.Join(path, name)
		next, err := openDirNoFollow(dir, name)
		if err != nil {
			err = unsafeOr(dir, name, path, err)
		}
		unix.Close(dir)
		if err != nil {
			return nil, err
		}
		dir = next
	}
	defer unix.Close(dir)
	path = filepath.Join(path, parts[len(parts)-1])
	// O_NONBLOCK: opening a FIFO for writing would otherwise block forever.
	fd, err := unix.Openat(dir, parts[len(parts)-1], unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, unsafeOr(dir, parts[len(parts)-1], path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		unix.Close(fd)
		return nil, &UnsafePathError{Path: path, Reason: "not a regular file"}
	case st.Nlink > 1:
		unix.Close(fd)
		return nil, &UnsafePathError{Path: path, Reason: "a hard link to another file"}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openDirNoFollow opens (creating it if missing) the directory name under
// dir, refusing a symlink.
func openDirNoFollow(dir int, name string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(dir, name, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		fd, err = unix.Openat(dir, name, flags, 0)
	}
	return fd, err
}

// unsafeOr names what O_NOFOLLOW and O_DIRECTORY refused of name in dir.
func unsafeOr(dir int, name, path string, err error) error {
	var st unix.Stat_t
	isLink := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
	switch {
	case isLink || errors.Is(err, unix.ELOOP):
		return &UnsafePathError{Path: path, Reason: "a symlink"}
	case errors.Is(err, unix.ENOTDIR):
		return &UnsafePathError{Path: path, Reason: "not a directory"}
	case errors.Is(err, unix.ENXIO):
		return &UnsafePathError{Path: path, Reason: "a FIFO or device"}
	}
	return &os.PathError{Op: "open", Path: path, Err: err}
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
	f, err := m.open(r)
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
