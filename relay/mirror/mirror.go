// Package mirror keeps each run's agent output as NDJSON on the shared
// volume, where Paperclip's Claude adapter reads it, derived from the
// store exactly once (see Mirror).
package mirror

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Mirror writes each run's agent output as NDJSON on the shared volume, in
// the layout Paperclip's Claude adapter reads:
// <Dir>/<Base>/<company>/<agent>/<run>.pod.ndjson. The file appears as
// soon as the run's pod is seen (adapters give up on a file that does not
// appear); when the run ends, <run>.pod.ndjson.done beside it holds the
// end, and the mirror never touches either again, so a reader may remove
// them. Both go when retention drops the run.
//
// The file is derived from the store exactly once: after each sync the
// store records the last mirrored sequence and the file's size together,
// and a sync goes on from that record (adopt: keeping what a crash wrote
// after it). Relays sharing the store and the volume take turns on a lock
// on the file (flock), each reading the record under it.
type Mirror struct {
	Dir string
	// Base is the run-log directory under Dir (Paperclip's
	// RUN_LOG_BASE_PATH relative to the volume). Default "run-logs".
	Base  string
	Store store.Backend
	// Clock times the wait for a file's lock. Default the real clock.
	Clock clock.Clock

	mu     sync.Mutex
	perRun map[string]*sync.Mutex
}

// Path is where run's mirror file is.
func (m *Mirror) Path(r *store.Run) string {
	return filepath.Join(append([]string{m.Dir}, m.mirrorPath(r)...)...)
}

const (
	fileSuffix = ".pod.ndjson"
	doneSuffix = ".pod.ndjson.done"
)

// mirrorPath is the run's file's path under Dir, one element per
// component. Label values cannot hold a separator or be "..": safe as
// names; Base is the operator's, checked when the relay starts.
func (m *Mirror) mirrorPath(r *store.Run) []string {
	company := r.Company
	if company == "" {
		company = "_"
	}
	agent := r.Agent
	if agent == "" {
		agent = "_"
	}
	base := m.Base
	if base == "" {
		base = "run-logs"
	}
	return append(strings.Split(filepath.Clean(base), string(filepath.Separator)), company, agent, r.ID+fileSuffix)
}

// ValidBase says why base cannot be a run-log directory under Dir, or "".
func ValidBase(base string) string {
	clean := filepath.Clean(base)
	if base == "" || filepath.IsAbs(base) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return "want a relative path under the mirror directory, such as instances/default/data/run-logs"
	}
	return ""
}

// UnsafePathError refuses a mirror path that is not plain directories and
// a regular file: agents write to the volume too, and a symlink, hard link
// or FIFO planted on the path would make the relay write another file.
type UnsafePathError struct {
	Path   string
	Reason string
}

func (e *UnsafePathError) Error() string {
	return fmt.Sprintf("refusing to mirror to %s: %s", e.Path, e.Reason)
}

// openDir opens the directory of the run's files, creating what is
// missing, without following a symlink; it returns it with the file's path
// and name.
func (m *Mirror) openDir(r *store.Run) (dir int, path, name string, err error) {
	parts := m.mirrorPath(r)
	// Dir itself is the operator's (a mount point); only what is under it
	// is the agents' to plant things in.
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return -1, "", "", err
	}
	dir, err = unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", "", &os.PathError{Op: "open", Path: m.Dir, Err: err}
	}
	path = m.Dir
	for _, name := range parts[:len(parts)-1] {
		path = filepath.Join(path, name)
		next, err := openDirNoFollow(dir, name)
		if err != nil {
			err = unsafeOr(dir, name, path, err)
		}
		unix.Close(dir)
		if err != nil {
			return -1, "", "", err
		}
		dir = next
	}
	name = parts[len(parts)-1]
	return dir, filepath.Join(path, name), name, nil
}

func openFile(dir int, path, name string) (*os.File, error) {
	// O_NONBLOCK: opening a FIFO for writing would otherwise block forever.
	// O_RDWR: a sync reads what the file holds past its record (adopt).
	fd, err := unix.Openat(dir, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, unsafeOr(dir, name, path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFIFO, st.Mode&unix.S_IFMT == unix.S_IFCHR, st.Mode&unix.S_IFMT == unix.S_IFBLK:
		unix.Close(fd)
		return nil, &UnsafePathError{Path: path, Reason: "a FIFO or device"}
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

// Remove deletes the run's files (retention dropped the run). unlinkat in
// the directory opened without following symlinks removes a planted
// symlink itself, never what it points to.
func (m *Mirror) Remove(r *store.Run) error {
	if m == nil || m.Dir == "" || r.Agent == "" {
		return nil
	}
	defer m.lock(r.ID)()
	dir, path, name, err := m.openDir(r)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	return removeFiles(dir, path, name)
}

// removeFiles removes a run's file and its done marker from dir.
func removeFiles(dir int, path, name string) error {
	for _, f := range []entry{{path, name}, markerOf(path, name)} {
		if err := f.remove(dir); err != nil {
			return err
		}
	}
	return nil
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

// mirrorLockWait bounds how long a sync waits for the mirror file's lock.
// Another relay holds it for one append; anything longer is someone else
// (any agent can open the file, and flock locks one opened for reading),
// and a sync runs in a follower's commit path: it gives up, and a later
// sync catches the file up.
const mirrorLockWait = 200 * time.Millisecond

// ErrLocked: someone held the mirror file's lock past mirrorLockWait.
var ErrLocked = errors.New("locked by another process past " + mirrorLockWait.String() + " (an agent holding flock on it?): not mirrored this time; the store has every line")

// lockFile takes f's exclusive lock, waiting at most mirrorLockWait. A
// volume without locks (NFS without lockd, some FUSE) is no error: this
// relay's own syncs of a run are one at a time anyway.
func (m *Mirror) lockFile(f *os.File) error {
	clk := m.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	deadline := clk.Now().Add(mirrorLockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil, errors.Is(err, unix.ENOLCK), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
			return nil
		case !errors.Is(err, unix.EWOULDBLOCK):
			return err
		case clk.Now().After(deadline):
			return ErrLocked
		}
		clk.Sleep(10 * time.Millisecond)
	}
}

// Sync appends what the store has of run and the file does not. Only the
// agent (first app) container's lines are mirrored, as the adapter's tee
// captured only the agent's output. A path an agent planted something on
// is refused (an *UnsafePathError), and counted.
func (m *Mirror) Sync(run string) error {
	if m == nil || m.Dir == "" {
		return nil
	}
	err := m.sync(run)
	var unsafe *UnsafePathError
	if errors.As(err, &unsafe) {
		refused.Inc()
	}
	return err
}

func (m *Mirror) sync(run string) error {
	defer m.lock(run)()
	r, err := m.Store.Run(run)
	if err != nil || r == nil || r.Agent == "" {
		return err
	}
	st, err := m.Store.MirrorState(run)
	if err != nil {
		return err
	}
	if st.Done && r.Done {
		return nil // written and marked: the reader's now, even to remove
	}
	// One walk down the directories for the file and its marker: this
	// runs after every committed batch.
	dir, path, name, err := m.openDir(r)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	marker := markerOf(path, name)
	f, err := openFile(dir, path, name)
	if err != nil {
		return err
	}
	defer f.Close()
	// Replicas that both own the run for a moment sync it one at a time
	// (a lock on the file, released when it closes), each from what the
	// other recorded, so the file is never cut back under a reader.
	if err := m.lockFile(f); err != nil {
		return &os.PathError{Op: "lock", Path: path, Err: err}
	}
	if r, err = m.Store.Run(run); err != nil || r == nil {
		if err == nil {
			// Retention dropped the run meanwhile, perhaps another
			// replica's, whose Remove may have come before this sync
			// opened (created) the file: nobody else removes it now.
			return removeFiles(dir, path, name)
		}
		return err
	}
	if st, err = m.Store.MirrorState(run); err != nil {
		return err
	}
	info, err := f.Stat()
	if err != nil {
		return err
	}
	inode := uint64(0)
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		inode = sys.Ino
	}
	if st.Done && r.Done {
		// The other relay finished it meanwhile, and the reader may have
		// removed the file since: one this sync created is not left.
		if st.Inode != 0 && st.Inode != inode && info.Size() == 0 {
			return entry{path, name}.remove(dir)
		}
		return nil
	}
	// Not done (or a retry of the Job continues a finished run): no done
	// marker may stand, whoever planted it, even while this store is
	// behind another's lines (below).
	if err := marker.remove(dir); err != nil {
		return err
	}
	st.Done = false
	if info.Size() < st.Size || (st.Inode != 0 && st.Inode != inode) {
		// The file lost content, or another file was swapped in under its
		// name: rebuild it from the store (keeping what it holds of it).
		st = store.MirrorState{}
	}
	st.Inode = inode
	if info.Size() > st.Size {
		var ahead bool
		if st, ahead, err = m.adopt(f, run, r, st, info.Size()); err != nil {
			return err
		}
		if ahead && !(r.Done && st.Seq >= r.LastSeq) {
			// Lines this store has not yet: another store's relay wrote
			// them. Left, and met again when this store has them. Once
			// this store has the whole run, nothing is ahead of it: such
			// lines are someone else's (an agent's), cut back below, or
			// the run would never get its done marker.
			return m.Store.SetMirrorState(run, st)
		}
	}
	if info.Size() != st.Size {
		// Only then: a truncation, even to the same size, marks the file
		// modified for a reader watching it.
		if err := f.Truncate(st.Size); err != nil {
			return err
		}
	}
	if _, err := f.Seek(st.Size, 0); err != nil {
		return err
	}
	size := st.Size
	if err := store.EachLine(m.Store, run, st.Seq, func(l store.Line) (bool, error) {
		if r.MainContainer == "" || l.Container == r.MainContainer {
			n, err := fmt.Fprintln(f, l.Line)
			if err != nil {
				return false, err
			}
			size += int64(n)
		}
		st.Seq = l.Seq
		return true, nil
	}); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	st.Size = size
	if r.Done && st.Seq >= r.LastSeq {
		if err := marker.write(dir, r); err != nil {
			return err
		}
		st.Done = true
	}
	return m.Store.SetMirrorState(run, st)
}

// adopt reads what the file holds past the recorded size, up to end, and
// keeps what the store would write there: lines written before a crash
// could record them, or by a relay of another store on the same volume
// (during a move from bbolt to PostgreSQL). It returns the state after
// the kept lines; the caller cuts the file back to it, from where its
// bytes differ from the store's. ahead: the file holds more than the
// store has yet, left alone.
func (m *Mirror) adopt(f *os.File, run string, r *store.Run, st store.MirrorState, end int64) (_ store.MirrorState, ahead bool, err error) {
	in := bufio.NewReader(io.NewSectionReader(f, st.Size, end-st.Size))
	var got []byte
	ranOut := true // the store's lines ended before the file's bytes
	err = store.EachLine(m.Store, run, st.Seq, func(l store.Line) (bool, error) {
		if r.MainContainer != "" && l.Container != r.MainContainer {
			st.Seq = l.Seq
			return true, nil
		}
		want := len(l.Line) + 1
		got = slices.Grow(got[:0], want)[:want]
		n, err := io.ReadFull(in, got)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return false, err
		}
		if n < want || string(got[:want-1]) != l.Line || got[want-1] != '\n' {
			ranOut = false // cut short or another line: cut back from here
			return false, nil
		}
		st.Size += int64(want)
		st.Seq = l.Seq
		ranOut = st.Size < end
		return ranOut, nil
	})
	if err != nil || !ranOut {
		return st, false, err
	}
	// Whole lines left are another store's, ahead of this one; a line
	// without its newline is a write a crash cut short: cut back. The
	// newline is looked for so far only: an agent can write a line of any
	// length to the file.
	ahead, err = hasNewline(io.LimitReader(in, maxAheadScan))
	return st, ahead, err
}

// maxAheadScan bounds how far adopt reads for the end of a line another
// store wrote: four stored lines at the relay's default --max-line-bytes.
const maxAheadScan = 4 << 20

// hasNewline reads r in chunks, keeping none, until a newline or its end.
func hasNewline(r io.Reader) (bool, error) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if slices.Contains(buf[:n], '\n') {
			return true, nil
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// entry is a file in a run's directory: its file, or its done marker.
type entry struct{ path, name string }

// markerOf is the done marker beside the run's file.
func markerOf(filePath, fileName string) entry {
	base := strings.TrimSuffix(fileName, fileSuffix)
	return entry{path: strings.TrimSuffix(filePath, fileName) + base + doneSuffix, name: base + doneSuffix}
}

// write writes <run>.pod.ndjson.done: the run's end, one JSON line.
func (mk entry) write(dir int, r *store.Run) error {
	end, err := json.Marshal(struct {
		Type       string     `json:"type"`
		Run        string     `json:"run"`
		Phase      string     `json:"phase"`
		ExitCode   *int32     `json:"exitCode,omitempty"`
		Reason     string     `json:"reason,omitempty"`
		LastSeq    uint64     `json:"lastSeq"`
		FinishedAt *time.Time `json:"finishedAt,omitempty"`
	}{"end", r.ID, r.Phase, r.ExitCode, r.Reason, r.LastSeq, r.FinishedAt})
	if err != nil {
		return err
	}
	f, err := openFile(dir, mk.path, mk.name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.Write(append(end, '\n')); err != nil {
		return err
	}
	return f.Sync()
}

// remove deletes the entry, never what a symlink planted there points to.
func (mk entry) remove(dir int) error {
	if err := unix.Unlinkat(dir, mk.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: mk.path, Err: err}
	}
	return nil
}

var refused = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "clipjob_relay_mirror_refused_total",
	Help: "Mirror writes refused because the path on the shared volume was a symlink, hard link or other non-regular file.",
})

// Collectors returns the mirror's metrics, for the relay to register.
func Collectors() []prometheus.Collector { return []prometheus.Collector{refused} }
