package mirror

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

func mirrorFixture(t *testing.T) (*bolt.Store, *Mirror) {
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
	_, _ = storetest.Append(s, "run-1", "init", store.Cursor{TS: 1, Count: 1}, storetest.Lines("setup", "cloning"), time.Now())
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"type":"system"}`, `{"type":"result"}`), time.Now())
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
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 3, Count: 1}, storetest.Lines("agent", `{"type":"late"}`), time.Now())
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
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one", "two"), time.Now())
	_ = m.Sync("run-1")
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", "three"), time.Now())
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
			_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"forged"}`), time.Now())

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

	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"result"}`), time.Now())
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
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"system"}`), time.Now())
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
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"type":"late"}`), time.Now())
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
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"n":1}`), time.Now())
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
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"n":2}`), time.Now())
	done := make(chan error, 1)
	go func() { done <- m.Sync("run-1") }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLocked) {
			t.Errorf("sync of a file another holds locked: %v, want %v", err, ErrLocked)
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

// TestMirrorsOfTwoStoresOnOneVolumeNeverCutTheFileBack: a bbolt relay
// beside replicas on PostgreSQL (a release moving from one store to the
// other with a rolling update) mirror the same runs into one directory,
// each store recording how far it wrote. Each sync cut the file back to
// its own record, so a reader tailing it saw it shrink again and again
// (the second hostile review). Now a sync keeps the lines the file holds
// past its record that its store has too, and leaves lines its store has
// not yet: the file only grows, and ends with every line once.
func TestMirrorsOfTwoStoresOnOneVolumeNeverCutTheFileBack(t *testing.T) {
	sa, ma := mirrorFixture(t)
	sb, _ := storetest.Open(t)
	_, _ = sb.UpdateRun("run-1", func(r *store.Run) {
		r.Namespace, r.Agent, r.Company, r.MainContainer = "ns", "agent-a", "acme", "agent"
	})
	mb := &Mirror{Dir: ma.Dir, Store: sb}
	r, _ := sa.Run("run-1")
	var size int64
	grew := func(who string) {
		t.Helper()
		st, err := os.Stat(ma.Path(r))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() < size {
			t.Fatalf("%s's sync cut the file back from %d to %d bytes", who, size, st.Size())
		}
		size = st.Size()
	}
	appendTo := func(s *bolt.Store, from, to int) {
		var texts []string
		for i := from; i <= to; i++ {
			texts = append(texts, fmt.Sprintf(`{"n":%d}`, i))
		}
		_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: int64(to), Count: 1}, storetest.Lines("agent", texts...), time.Now())
	}
	// A runs ahead, then B, then A again; each syncs after its commits.
	steps := []struct {
		m        *Mirror
		s        *bolt.Store
		from, to int
	}{{ma, sa, 1, 5}, {mb, sb, 1, 2}, {mb, sb, 3, 4}, {ma, sa, 6, 7}, {mb, sb, 5, 9}, {ma, sa, 8, 8}, {ma, sa, 9, 12}, {mb, sb, 10, 12}}
	for i, st := range steps {
		appendTo(st.s, st.from, st.to)
		who := map[*Mirror]string{ma: "A", mb: "B"}[st.m]
		if err := st.m.Sync("run-1"); err != nil {
			t.Fatalf("step %d, %s: %v", i, who, err)
		}
		grew(who)
	}
	var want strings.Builder
	for i := 1; i <= 12; i++ {
		fmt.Fprintf(&want, "{\"n\":%d}\n", i)
	}
	if got := readMirror(t, ma); got != want.String() {
		t.Errorf("the file holds %q, want every line once", got)
	}
	for _, s := range []*bolt.Store{sa, sb} {
		if st, _ := s.MirrorState("run-1"); st.Size != int64(want.Len()) || st.Seq == 0 {
			t.Errorf("a store's record of the file: %+v, want all %d bytes", st, want.Len())
		}
	}
}

// TestMirrorKeepsLinesWrittenBeforeTheirRecord: a relay that died between
// writing lines and recording them wrote them again after cutting them
// off, so a reader tailing the file saw it shrink. Lines that match the
// store are kept as they are: the file is not written at all.
func TestMirrorKeepsLinesWrittenBeforeTheirRecord(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one", "two"), time.Now())
	must(t, m.Sync("run-1"))
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", "three", "four"), time.Now())
	r, _ := s.Run("run-1")
	f, err := os.OpenFile(m.Path(r), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, _ = f.WriteString("three\nfour\n") // written; the relay died before recording it
	f.Close()
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	must(t, os.Chtimes(m.Path(r), past, past))
	must(t, m.Sync("run-1"))
	info, err := os.Stat(m.Path(r))
	must(t, err)
	if !info.ModTime().Equal(past) {
		t.Errorf("the file was written again (modified %s)", info.ModTime())
	}
	if got := readMirror(t, m); got != "one\ntwo\nthree\nfour\n" {
		t.Errorf("mirror %q", got)
	}
	if st, _ := s.MirrorState("run-1"); st.Size != info.Size() || st.Seq != 4 {
		t.Errorf("recorded %+v, want the whole file and seq 4", st)
	}
	// Bytes past the record that are not the store's next line are cut
	// back and written from the store.
	f, err = os.OpenFile(m.Path(r), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, _ = f.WriteString("forged\n")
	f.Close()
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 3, Count: 1}, storetest.Lines("agent", "five"), time.Now())
	must(t, m.Sync("run-1"))
	if got := readMirror(t, m); got != "one\ntwo\nthree\nfour\nfive\n" {
		t.Errorf("after a forged line past the record, mirror %q", got)
	}
}

// TestMirrorCutsLinesAheadOfAFinishedRun: lines past the record that the
// store does not have are left for the store that wrote them to catch up
// with, but once the run has ended and this store holds all of it, no
// store is ahead: an agent's line appended after its output is cut back,
// and the done marker is written.
func TestMirrorCutsLinesAheadOfAFinishedRun(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one"), time.Now())
	must(t, m.Sync("run-1"))
	r, _ := s.Run("run-1")
	f, err := os.OpenFile(m.Path(r), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, _ = f.WriteString("{\"type\":\"result\",\"result\":\"forged\"}\n")
	f.Close()
	// With a done marker planted beside it: a sync that leaves the line
	// (another store's, perhaps) still removes the marker, the run being
	// not done.
	must(t, os.WriteFile(m.Path(r)+".done", []byte(`{"type":"end","phase":"Succeeded"}`), 0o644))
	must(t, m.Sync("run-1"))
	if got := readMirror(t, m); got != "one\n{\"type\":\"result\",\"result\":\"forged\"}\n" {
		t.Fatalf("mid-run, a line the store has not yet: %q, want it left (another store's, perhaps)", got)
	}
	if _, err := os.Stat(m.Path(r) + ".done"); !os.IsNotExist(err) {
		t.Errorf("a done marker planted mid-run stands beside a line the store has not: %v", err)
	}
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" })
	must(t, m.Sync("run-1"))
	if got := readMirror(t, m); got != "one\n" {
		t.Errorf("after the run ended the mirror holds %q, want the store's line only", got)
	}
	if _, err := os.Stat(m.Path(r) + ".done"); err != nil {
		t.Errorf("no done marker: %v", err)
	}
}

// retainedDuringSync is a store whose run another replica's retention
// deletes, files and all, while a sync is between its first read of the
// run and opening the run's file.
type retainedDuringSync struct {
	store.Backend
	retain func()
	done   bool
}

func (s *retainedDuringSync) MirrorState(run string) (store.MirrorState, error) {
	if !s.done {
		s.done = true
		s.retain()
	}
	return s.Backend.MirrorState(run)
}

// TestMirrorOfARunRetainedMidSyncIsNotLeft: another replica's retention
// deletes a finished run and removes its mirror file while this replica
// syncs it, after the sync read the run and before it opened (created)
// the file. The sync, finding the run gone once it holds the file, removes
// what it created: no replica would remove it later, and the run is gone.
func TestMirrorOfARunRetainedMidSyncIsNotLeft(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"type":"result"}`), time.Now())
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" }); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Run("run-1")
	other := &Mirror{Dir: m.Dir, Store: s}
	m.Store = &retainedDuringSync{Backend: s, retain: func() {
		gone, err := s.Retain(0, 1, time.Now())
		if err != nil || len(gone) != 1 {
			t.Fatalf("retention: %d runs (%v)", len(gone), err)
		}
		if err := other.Remove(&gone[0]); err != nil {
			t.Fatal(err)
		}
	}}
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{m.Path(r), m.Path(r) + ".done"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after its run was retained mid-sync: %v", p, err)
		}
	}
}
