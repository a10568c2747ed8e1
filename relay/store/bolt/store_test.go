package bolt

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func openTestStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func lines(container string, texts ...string) []store.Line {
	var out []store.Line
	for i, x := range texts {
		out = append(out, store.Line{TS: at(i), Container: container, Line: x})
	}
	return out
}

func TestAppendAssignsSequenceAcrossStreams(t *testing.T) {
	s, _ := openTestStore(t)
	now := time.Now()
	if _, err := s.Append("run-1", "pod/a/1", store.Cursor{TS: 5, Count: 1}, lines("a", "a1", "a2"), now); err != nil {
		t.Fatal(err)
	}
	last, err := s.Append("run-1", "pod/b/1", store.Cursor{TS: 7, Count: 2}, lines("b", "b1"), now)
	if err != nil || last != 3 {
		t.Fatalf("last seq %d (%v), want 3", last, err)
	}
	got, _ := store.Lines(s, "run-1", 1, 0)
	if len(got) != 2 || got[0].Seq != 2 || got[0].Line != "a2" || got[1].Seq != 3 || got[1].Container != "b" {
		t.Errorf("lines after 1: %+v", got)
	}
	if c, _ := s.Cursor("run-1", "pod/b/1"); c != (store.Cursor{TS: 7, Count: 2}) {
		t.Errorf("cursor %+v", c)
	}
	r, _ := s.Run("run-1")
	if r.LastSeq != 3 || r.Bytes != 6 {
		t.Errorf("run %+v", r)
	}
	if got, _ := store.Lines(s, "run-1", 0, 2); len(got) != 2 {
		t.Errorf("limit not applied: %d", len(got))
	}
	if r, _ := s.Run("never"); r != nil {
		t.Error("a run never seen exists")
	}
}

func TestStoreSurvivesReopen(t *testing.T) {
	s, dir := openTestStore(t)
	if _, err := s.Append("run-1", "st", store.Cursor{TS: 9, Count: 1}, lines("c", "x", "y"), time.Now()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if c, _ := s2.Cursor("run-1", "st"); c.TS != 9 {
		t.Errorf("cursor lost: %+v", c)
	}
	if got, _ := store.Lines(s2, "run-1", 0, 0); len(got) != 2 {
		t.Errorf("lines lost: %d", len(got))
	}
}

func TestConcurrentAppendsKeepSequenceDense(t *testing.T) {
	s, _ := openTestStore(t)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				if _, err := s.Append("run-1", fmt.Sprintf("s%d", w), store.Cursor{TS: int64(i + 1), Count: 1}, lines("c", "l"), time.Now()); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	got, _ := store.Lines(s, "run-1", 0, 0)
	for i, l := range got {
		if l.Seq != uint64(i+1) {
			t.Fatalf("line %d has seq %d", i, l.Seq)
		}
	}
	if len(got) != 200 {
		t.Errorf("%d lines, want 200", len(got))
	}
}

func TestChangedFiresOnAppendAndUpdate(t *testing.T) {
	s, _ := openTestStore(t)
	ch := s.Changed("run-1")
	select {
	case <-ch:
		t.Fatal("fired before any change")
	default:
	}
	_, _ = s.Append("run-1", "st", store.Cursor{TS: 1, Count: 1}, lines("c", "x"), time.Now())
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatal("append did not signal")
	}
	ch = s.Changed("run-1")
	_, _ = s.UpdateRun("run-1", func(r *store.Run) { r.Phase = "Running" })
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatal("update did not signal")
	}
}

func TestRetain(t *testing.T) {
	s, _ := openTestStore(t)
	now := time.Now()
	old := now.Add(-48 * time.Hour)
	mk := func(id string, seen time.Time, done bool, n int) {
		_, _ = s.Append(id, id, store.Cursor{TS: 1, Count: 1}, lines("c", make([]string, n)...), seen)
		_, _ = s.UpdateRun(id, func(r *store.Run) { r.Done = done; r.SeenAt = seen; r.Bytes = int64(n * 100) })
	}
	mk("old-done", old, true, 1)
	mk("old-running", old, false, 1)
	mk("new-done-a", now.Add(-2*time.Minute), true, 5)
	mk("new-done-b", now.Add(-time.Minute), true, 5)
	gone, err := s.Retain(24*time.Hour, 0, now)
	if err != nil || len(gone) != 1 || gone[0].ID != "old-done" {
		t.Fatalf("age retention deleted %v (%v), want old-done", gone, err)
	}
	if r, _ := s.Run("old-running"); r == nil {
		t.Error("a running run was deleted")
	}
	// Size: 1100 bytes stored, limit 700: the oldest finished run goes.
	gone, _ = s.Retain(0, 700, now)
	if len(gone) != 1 {
		t.Fatalf("size retention deleted %d, want 1", len(gone))
	}
	if r, _ := s.Run("new-done-a"); r != nil {
		t.Error("size retention kept the older run")
	}
	if got, _ := store.Lines(s, "new-done-a", 0, 0); len(got) != 0 {
		t.Error("lines of a deleted run remain")
	}
	if c, _ := s.Cursor("new-done-a", "new-done-a"); c.TS != 0 {
		t.Error("cursors of a deleted run remain")
	}
	if c, _ := s.Cursor("new-done-b", "new-done-b"); c.TS == 0 {
		t.Error("cursors of a kept run were deleted")
	}
}
