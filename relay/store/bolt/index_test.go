package bolt

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// The index lists what is committed: after appends and updates from many
// goroutines (batched into shared transactions), after retention, and
// after a reopen, Runs agrees record for record with the bucket.
func TestRunsIndexAgreesWithTheBucket(t *testing.T) {
	s, dir := openTestStore(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			run := fmt.Sprintf("run-%02d", i)
			for j := range 5 {
				if _, err := s.Append(run, "pod/a/1", store.Cursor{TS: int64(j + 1), Count: 1}, lines("a", "x"), time.Now()); err != nil {
					t.Error(err)
				}
				if _, err := s.UpdateRun(run, func(r *store.Run) { r.Agent, r.Phase, r.Done = "agent", "Succeeded", j == 4 }); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if _, err := s.Retain(0, 1, time.Now()); err != nil { // drops every done run but the last within 1 byte: all
		t.Fatal(err)
	}
	if _, err := s.UpdateRun("run-new", func(r *store.Run) { r.Phase = "Running" }); err != nil {
		t.Fatal(err)
	}
	assertIndexMatchesBucket(t, s)
	s.Close()
	reopened, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	assertIndexMatchesBucket(t, reopened)
}

func assertIndexMatchesBucket(t *testing.T, s *Store) {
	t.Helper()
	// The bucket's record, cut down to what the index keeps.
	summary := func(r *store.Run) string {
		full, _ := json.Marshal(r)
		var sum store.Summary
		_ = json.Unmarshal(full, &sum)
		b, _ := json.Marshal(sum)
		return string(b)
	}
	want := map[string]string{}
	for _, id := range []string{"run-new"} {
		r, _ := s.Run(id)
		want[id] = summary(r)
	}
	for i := range 20 {
		id := fmt.Sprintf("run-%02d", i)
		if r, _ := s.Run(id); r != nil {
			want[id] = summary(r)
		}
	}
	runs, _ := s.RunsWhere(store.Filter{})
	got := map[string]string{}
	for _, r := range runs {
		b, _ := json.Marshal(r)
		got[r.ID] = string(b)
	}
	if len(got) != len(want) {
		t.Fatalf("index lists %d runs, the bucket holds %d", len(got), len(want))
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("run %s: index %s, bucket %s", id, got[id], w)
		}
	}
}

// Commit handlers can run out of order: an older write never replaces a
// newer one, nor brings back a run a newer transaction deleted; a run
// written again after its deletion is back.
func TestRunIndexKeepsTheNewestTransaction(t *testing.T) {
	var x runIndex
	x.byID, x.tombstones = map[string]indexed{}, map[string]tombstone{}
	rec := func(phase string) store.Summary { return store.Summary{ID: "r", Phase: phase} }
	phase := func() string {
		runs := x.runs(nil)
		if len(runs) == 0 {
			return "(none)"
		}
		return runs[0].Phase
	}
	x.put(rec("Running"), 5)
	x.put(rec("Pending"), 4) // an older commit's handler, late
	if got := phase(); got != "Running" {
		t.Fatalf("after a late older write: %s, want Running", got)
	}
	x.remove([]string{"r"}, 7, time.Now())
	x.put(rec("Succeeded"), 6) // late, older than the deletion
	if got := phase(); got != "(none)" {
		t.Fatalf("a write older than the deletion brought the run back: %s", got)
	}
	x.put(rec("Pending"), 8) // the run id seen again after the deletion
	if got := phase(); got != "Pending" {
		t.Fatalf("a write after the deletion: %s, want Pending", got)
	}
}
