package collect

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

func mirrorFixture(t *testing.T) (*store.Store, *Mirror) {
	s, _ := storetest.Open(t)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) {
		r.Namespace, r.Agent, r.Company, r.MainContainer = "ns", "agent-a", "acme", "agent"
	})
	// Not created yet, as on a fresh volume.
	return s, &Mirror{Dir: filepath.Join(t.TempDir(), "shared"), Store: s}
}

func readMirror(t *testing.T, m *Mirror) string {
	t.Helper()
	r, _ := m.Store.Run("run-1")
	b, err := os.ReadFile(m.Path(r))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMirrorWritesTheAgentsLinesInTheAdapterLayout(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = s.Append("run-1", "init", store.Cursor{TS: 1, Count: 1}, storetest.Lines("setup", "cloning"), time.Now())
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"type":"system"}`, `{"type":"result"}`), time.Now())
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Run("run-1")
	if want := "run-logs/acme/agent-a/run-1.pod.ndjson"; !strings.HasSuffix(m.Path(r), want) {
		t.Errorf("path %s, want …/%s", m.Path(r), want)
	}
	if got := readMirror(t, m); got != "{\"type\":\"system\"}\n{\"type\":\"result\"}\n" {
		t.Errorf("mirror %q: want only the agent container's lines", got)
	}
	// Later lines are appended, nothing twice.
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 3, Count: 1}, storetest.Lines("agent", `{"type":"late"}`), time.Now())
	_ = m.Sync("run-1")
	_ = m.Sync("run-1")
	if got := readMirror(t, m); strings.Count(got, "\n") != 3 || !strings.HasSuffix(got, "{\"type\":\"late\"}\n") {
		t.Errorf("mirror after append: %q", got)
	}
}

// TestMirrorRecoversFromACrashMidWrite: bytes written after the last
// recorded state (a crash between the write and the record) are cut and
// written again once, so the file holds every line exactly once.
func TestMirrorRecoversFromACrashMidWrite(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one", "two"), time.Now())
	_ = m.Sync("run-1")
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", "three"), time.Now())
	r, _ := s.Run("run-1")
	f, _ := os.OpenFile(m.Path(r), os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString("three\nfo") // written, then the relay died before recording it
	f.Close()
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	if got := readMirror(t, m); got != "one\ntwo\nthree\n" {
		t.Errorf("mirror after crash recovery %q", got)
	}
}

// TestMirrorRefusesPlantedPaths: an agent can write anywhere on the shared
// volume, so it can plant a symlink, hard link or FIFO where the mirror
// will write. The relay must then write nothing, leave the target alone,
// and say so; a legitimate run of the same volume still mirrors.
func TestMirrorRefusesPlantedPaths(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plant  func(t *testing.T, dir, victim string)
		reason string
	}{
		{name: "symlink as the file", plant: func(t *testing.T, dir, victim string) {
			mkdirs(t, dir, "run-logs/acme/agent-a")
			must(t, os.Symlink(victim, filepath.Join(dir, "run-logs/acme/agent-a/run-1.pod.ndjson")))
		}, reason: "a symlink"},
		{name: "symlink as a directory", plant: func(t *testing.T, dir, victim string) {
			mkdirs(t, dir, "run-logs")
			must(t, os.Symlink(filepath.Dir(victim), filepath.Join(dir, "run-logs/acme")))
		}, reason: "a symlink"},
		{name: "symlink as the top directory", plant: func(t *testing.T, dir, victim string) {
			must(t, os.Symlink(filepath.Dir(victim), filepath.Join(dir, "run-logs")))
		}, reason: "a symlink"},
		{name: "hard link as the file", plant: func(t *testing.T, dir, victim string) {
			mkdirs(t, dir, "run-logs/acme/agent-a")
			must(t, os.Link(victim, filepath.Join(dir, "run-logs/acme/agent-a/run-1.pod.ndjson")))
		}, reason: "a hard link"},
		{name: "FIFO as the file", plant: func(t *testing.T, dir, _ string) {
			mkdirs(t, dir, "run-logs/acme/agent-a")
			must(t, unix.Mkfifo(filepath.Join(dir, "run-logs/acme/agent-a/run-1.pod.ndjson"), 0o644))
		}, reason: "a FIFO"},
		{name: "file as a directory", plant: func(t *testing.T, dir, _ string) {
			mkdirs(t, dir, "run-logs/acme")
			must(t, os.WriteFile(filepath.Join(dir, "run-logs/acme/agent-a"), nil, 0o644))
		}, reason: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, m := mirrorFixture(t)
			// The victim sits on the same volume (a hard link needs that),
			// as Paperclip's own files do.
			victimDir := filepath.Join(m.Dir, "instances", "default")
			mkdirs(t, m.Dir, "instances/default")
			victim := filepath.Join(victimDir, "run-1.pod.ndjson")
			must(t, os.WriteFile(victim, []byte("the server's data\n"), 0o644))
			tc.plant(t, m.Dir, victim)
			_, _ = s.Append("run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"forged"}`), time.Now())

			err := m.Sync("run-1")
			var unsafe *UnsafePathError
			if !errors.As(err, &unsafe) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("want a refusal naming %q, got %v", tc.reason, err)
			}
			if b, _ := os.ReadFile(victim); string(b) != "the server's data\n" {
				t.Errorf("the planted path's target was changed: %q", b)
			}
		})
	}
}

func mkdirs(t *testing.T, dir, rel string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(dir, rel), 0o755))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The mirror's life as a reader sees it: the file exists before any line
// (adapters give up on a file that does not appear); when the run ends a
// done marker with the end is written beside it; after that the files are
// the reader's — removed, they are not written again; retention removes
// them with the run.
func TestMirrorLifecycle(t *testing.T) {
	s, m := mirrorFixture(t)
	m.Base = "instances/default/data/run-logs"
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Run("run-1")
	if want := "instances/default/data/run-logs/acme/agent-a/run-1.pod.ndjson"; !strings.HasSuffix(m.Path(r), want) {
		t.Errorf("path %s, want …/%s", m.Path(r), want)
	}
	if got := readMirror(t, m); got != "" {
		t.Errorf("before any line the file holds %q", got)
	}
	marker := m.Path(r) + ".done"
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a done marker before the end: %v", err)
	}

	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"result"}`), time.Now())
	exit := int32(0)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase, r.ExitCode = true, "Succeeded", &exit })
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	end, err := os.ReadFile(marker)
	if err != nil || !strings.Contains(string(end), `"phase":"Succeeded"`) || !strings.Contains(string(end), `"exitCode":0`) ||
		!strings.Contains(string(end), `"lastSeq":`) {
		t.Fatalf("done marker %q (%v)", end, err)
	}

	// The reader took the file away: it stays away.
	if err := os.Remove(m.Path(r)); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.Path(r)); !os.IsNotExist(err) {
		t.Errorf("a finished run's file was written again after the reader removed it: %v", err)
	}

	if err := m.Remove(r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("retention left the done marker: %v", err)
	}
}

// Remove never follows a planted symlink: it removes the link itself.
func TestMirrorRemoveDoesNotFollowSymlinks(t *testing.T) {
	s, m := mirrorFixture(t)
	_ = m.Sync("run-1")
	r, _ := s.Run("run-1")
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(m.Path(r))
	if err := os.Symlink(victim, m.Path(r)); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(r); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep me" {
		t.Errorf("the symlink's target was touched: %q %v", b, err)
	}
}

func TestValidBase(t *testing.T) {
	for base, ok := range map[string]bool{"run-logs": true, "instances/default/data/run-logs": true, "": false, "/abs": false, "..": false, "../out": false, ".": false} {
		if got := ValidBase(base) == ""; got != ok {
			t.Errorf("ValidBase(%q) ok=%v, want %v", base, got, ok)
		}
	}
}

// What an agent plants on the shared volume does not stand: a done marker
// written mid-run is removed, and a file swapped in under the run's name
// (even a larger one) is rebuilt from the store.
func TestMirrorUndoesForgeries(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"system"}`), time.Now())
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Run("run-1")
	marker := m.Path(r) + ".done"
	if err := os.WriteFile(marker, []byte(`{"type":"end","phase":"Succeeded"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	forged := filepath.Join(filepath.Dir(m.Path(r)), "forged")
	if err := os.WriteFile(forged, []byte(strings.Repeat(`{"type":"result","result":"forged"}`+"\n", 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(forged, m.Path(r)); err != nil {
		t.Fatal(err)
	}
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"type":"late"}`), time.Now())
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Error("a done marker planted mid-run still stands")
	}
	if got := readMirror(t, m); got != "{\"type\":\"system\"}\n{\"type\":\"late\"}\n" {
		t.Errorf("after a swap the mirror holds %q, want the store's lines only", got)
	}
}

// TestMirrorGivesUpOnALockHeldByAnother: every agent can open every
// mirror file, and flock locks a file opened for reading. A sync finding
// the lock held past mirrorLockWait returns an error naming it instead of
// waiting (it runs in the follower's commit path: waiting stopped the
// run's collection); once the lock is let go, the next sync writes every
// line once.
func TestMirrorGivesUpOnALockHeldByAnother(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"n":1}`), time.Now())
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Run("run-1")
	held, err := os.Open(m.Path(r)) // read only, as any agent may
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"n":2}`), time.Now())
	done := make(chan error, 1)
	go func() { done <- m.Sync("run-1") }()
	select {
	case err := <-done:
		if !errors.Is(err, errMirrorLocked) {
			t.Errorf("sync of a file another holds locked: %v, want %v", err, errMirrorLocked)
		}
	case <-time.After(time.Minute):
		t.Fatal("the sync waited on the lock another holds")
	}
	_ = unix.Flock(int(held.Fd()), unix.LOCK_UN)
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	if got := readMirror(t, m); got != "{\"n\":1}\n{\"n\":2}\n" {
		t.Errorf("mirror after the lock was let go: %q", got)
	}
}
