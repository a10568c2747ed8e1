package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// Backend is a store implementation under the conformance suite.
type Backend struct {
	// Open opens a new, empty store for t, and returns it with a function
	// that opens the same store again. Every handle is closed when t ends
	// (closing twice is harmless).
	Open func(t *testing.T) (s store.Backend, again func() store.Backend)
	// Replicas: handles opened again may be open at the same time, as
	// separate relays' are. Without it (bbolt's file lock) a handle is
	// closed before the next is opened, and concurrent writers share one.
	Replicas bool
}

// Conformance runs the behaviours every store.Backend must have, as
// subtests of t: the relay's exactly-once collection, its API and its
// retention rely on each.
func Conformance(t *testing.T, b Backend) {
	for _, c := range []struct {
		name string
		test func(*testing.T, Backend)
	}{
		{"AppendCommitsLinesWithTheCursor", appendCommitsLinesWithTheCursor},
		{"RetryOfACommittedAppendStoresNothingTwice", retryStoresNothingTwice},
		{"ResumeFromTheCursorAfterACrash", resumeAfterCrash},
		{"LinesKeepTheirBytesAndPagesAreBounded", linesKeepTheirBytes},
		{"RunsListAgreesWithTheRecords", runsListAgreesWithRecords},
		{"ARunsResult", aRunsResult},
		{"RetentionDeletesFinishedRunsWhole", retention},
		{"RetentionKeepsWhatItRetiredOfEachJob", retentionKeepsRetired},
		{"ChangedFiresOnAppendUpdateAndRetention", changedFires},
		{"ConcurrentWritersOfTwoStreams", concurrentWritersOfTwoStreams},
		{"TwoWritersOfOneStreamStoreEachLineOnce", twoWritersOfOneStream},
		{"NoLineIsAfterAHugeCursor", noLineAfterAHugeCursor},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, b) })
	}
}

var t0 = time.Date(2026, 11, 21, 10, 0, 5, 0, time.UTC)

// burstyLog is a container's log of n lines whose timestamps repeat in
// bursts of up to 3, as a fast writer's do: only the cursor's count makes
// a resume exact.
func burstyLog(container string, n int) []store.Line {
	out := make([]store.Line, n)
	for i := range out {
		out[i] = store.Line{TS: t0.Add(time.Duration(i/3) * time.Millisecond), Container: container, Line: fmt.Sprintf("line %04d", i)}
	}
	return out
}

// after is what a writer resuming from c sends of log, and the cursor
// after each line it sends (as relay/collect's resume: lines before the
// cursor's timestamp, and the first Count lines at it, are stored).
func after(log []store.Line, c store.Cursor) (rest []store.Line, curs []store.Cursor) {
	seenAt := 0
	cur := c
	for _, l := range log {
		n := l.TS.UnixNano()
		if n < c.TS {
			continue
		}
		if n == c.TS {
			if seenAt++; seenAt <= c.Count {
				continue
			}
		}
		if n == cur.TS {
			cur.Count++
		} else {
			cur = store.Cursor{TS: n, Count: 1}
		}
		rest, curs = append(rest, l), append(curs, cur)
	}
	return rest, curs
}

func mustAppend(t *testing.T, s store.Backend, run, stream string, prev, cur store.Cursor, lines []store.Line) uint64 {
	t.Helper()
	last, err := s.AppendAfter(run, stream, prev, cur, lines, time.Now())
	if err != nil {
		t.Fatalf("append to %s/%s from %+v: %v", run, stream, prev, err)
	}
	return last
}

// storedTexts is every stored line of run as "container: text", in order.
func storedTexts(t *testing.T, s store.Backend, run string) []string {
	t.Helper()
	var out []string
	var seq uint64
	for {
		page, err := store.Lines(s, run, seq, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return out
		}
		for _, l := range page {
			if l.Seq != seq+1 {
				t.Fatalf("run %s: line %d follows %d: the sequence has a gap", run, l.Seq, seq)
			}
			seq = l.Seq
			out = append(out, l.Container+": "+l.Line)
		}
	}
}

func texts(lines []store.Line) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.Container + ": " + l.Line
	}
	return out
}

func appendCommitsLinesWithTheCursor(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	a := []store.Cursor{{TS: 5, Count: 1}, {TS: 7, Count: 2}}
	mustAppend(t, s, "run-1", "pod/a/1", store.Cursor{}, a[0], Lines("a", "a1", "a2"))
	if last := mustAppend(t, s, "run-1", "pod/b/1", store.Cursor{}, a[1], Lines("b", "b1")); last != 3 {
		t.Errorf("last seq %d, want 3: one sequence across a run's streams", last)
	}
	if last := mustAppend(t, s, "run-1", "pod/a/1", a[0], store.Cursor{TS: 9, Count: 1}, Lines("a", "a3")); last != 4 {
		t.Errorf("last seq %d, want 4", last)
	}
	got, err := store.Lines(s, "run-1", 1, 0)
	if err != nil || len(got) != 3 || got[0].Seq != 2 || got[0].Line != "a2" || got[1].Seq != 3 || got[1].Container != "b" {
		t.Errorf("lines after 1: %+v (%v)", got, err)
	}
	if got, _ := store.Lines(s, "run-1", 0, 2); len(got) != 2 {
		t.Errorf("limit 2 returned %d lines", len(got))
	}
	if c, _ := s.Cursor("run-1", "pod/b/1"); c != a[1] {
		t.Errorf("cursor %+v, want %+v", c, a[1])
	}
	if c, _ := s.Cursor("run-1", "pod/c/1"); c != (store.Cursor{}) {
		t.Errorf("a stream never written has cursor %+v", c)
	}
	r, err := s.Run("run-1")
	if err != nil || r == nil || r.LastSeq != 4 || r.Bytes != 8 || r.Phase != "Unknown" || r.SeenAt.IsZero() {
		t.Errorf("run %+v (%v)", r, err)
	}
	if r, err := s.Run("never"); r != nil || err != nil {
		t.Errorf("a run never seen: %+v (%v)", r, err)
	}
	if s.Size() <= 0 {
		t.Error("Size is not positive after writes")
	}
}

// A writer whose commit's outcome was lost (a crash after the commit, a
// connection cut before its answer) retries from the cursor it had: the
// store refuses, and nothing is stored twice nor any record touched.
func retryStoresNothingTwice(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	log := burstyLog("agent", 6)
	rest, curs := after(log, store.Cursor{})
	mustAppend(t, s, "run-1", "st", store.Cursor{}, curs[2], rest[:3])
	before, _ := s.Run("run-1")
	_, err := s.AppendAfter("run-1", "st", store.Cursor{}, curs[2], rest[:3], time.Now())
	var conflict *store.CursorConflict
	if !errors.As(err, &conflict) || !errors.Is(err, store.ErrCursorConflict) {
		t.Fatalf("a retried append: %v, want a *store.CursorConflict", err)
	}
	if conflict.Stored != curs[2] || conflict.Prev != (store.Cursor{}) {
		t.Errorf("conflict %+v: want the stored cursor %+v and the writer's zero one", conflict, curs[2])
	}
	// A writer holding a cursor the store never had is refused as well.
	if _, err := s.AppendAfter("run-1", "st", curs[1], curs[5], rest[2:], time.Now()); !errors.Is(err, store.ErrCursorConflict) {
		t.Fatalf("an append from a stale cursor: %v, want a conflict", err)
	}
	after, _ := s.Run("run-1")
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("refused appends changed the run's record (-before +after):\n%s", diff)
	}
	// Resumed from the stored cursor, the rest goes in once.
	mustAppend(t, s, "run-1", "st", conflict.Stored, curs[5], rest[3:])
	if diff := cmp.Diff(texts(log), storedTexts(t, s, "run-1")); diff != "" {
		t.Errorf("stored lines (-log +stored):\n%s", diff)
	}
}

// A relay that dies holding lines it read but did not commit resumes, once
// restarted, from the cursor committed with the last stored line: every
// line of the log is stored once.
func resumeAfterCrash(t *testing.T, b Backend) {
	s, again := b.Open(t)
	log := burstyLog("agent", 20)
	rest, curs := after(log, store.Cursor{})
	mustAppend(t, s, "run-1", "st", store.Cursor{}, curs[6], rest[:7]) // ends mid-burst: lines 6, 7, 8 share a timestamp
	// Read, never committed: gone with the process.
	_ = rest[7:12]
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = again()
	c, err := s.Cursor("run-1", "st")
	if err != nil || c != curs[6] {
		t.Fatalf("cursor after the restart %+v (%v), want %+v", c, err, curs[6])
	}
	// The log is read again from the cursor's second, as the API serves it.
	var reread []store.Line
	for _, l := range log {
		if !l.TS.Before(c.SinceTime()) {
			reread = append(reread, l)
		}
	}
	rest, curs = after(reread, c)
	mustAppend(t, s, "run-1", "st", c, curs[len(curs)-1], rest)
	if diff := cmp.Diff(texts(log), storedTexts(t, s, "run-1")); diff != "" {
		t.Errorf("stored lines after the resume (-log +stored):\n%s", diff)
	}
}

// A line is any bytes a container printed: stored and served as the JSON
// of its Line, byte for byte; a page ends at about store.PageBytes.
func linesKeepTheirBytes(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	odd := store.Line{TS: t0, Container: "agent", Line: "nul \x00, invalid \xff\xfe, quote \", emoji \u2603, tab\t"}
	mustAppend(t, s, "run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, []store.Line{odd})
	raw, err := RawLines(s, "run-1", 0, 0)
	if err != nil || len(raw) != 1 {
		t.Fatalf("raw lines %d (%v)", len(raw), err)
	}
	odd.Seq = 1
	want := mustJSON(t, odd)
	if string(raw[0].JSON) != want {
		t.Errorf("stored JSON %s, want %s", raw[0].JSON, want)
	}
	big := strings.Repeat("x", 1<<20)
	var lines []store.Line
	for i := range 10 {
		lines = append(lines, store.Line{TS: t0.Add(time.Duration(i)), Container: "agent", Line: big})
	}
	mustAppend(t, s, "run-1", "st", store.Cursor{TS: 1, Count: 1}, store.Cursor{TS: 2, Count: 1}, lines)
	page, err := RawLines(s, "run-1", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The shortest prefix holding PageBytes, as bbolt's store has always cut.
	size, want4 := 0, 0
	for _, l := range lines {
		want4++
		if size += len(mustJSON(t, l)); size >= store.PageBytes {
			break
		}
	}
	if len(page) != want4 {
		t.Errorf("a page of 1 MiB lines holds %d, want %d (store.PageBytes %d)", len(page), want4, store.PageBytes)
	}
	if got, _ := RawLines(s, "run-1", 1, 2); len(got) != 2 || got[1].Seq != 3 {
		t.Errorf("limit 2: %d lines", len(got))
	}
}

// Runs lists, newest first, a summary of every committed record (what GET
// /v1/runs filters by, what retention decides by), after writes from many
// goroutines and after a restart.
func runsListAgreesWithRecords(t *testing.T, b Backend) {
	s, again := b.Open(t)
	var wg sync.WaitGroup
	base := time.Now()
	for i := range 12 {
		wg.Go(func() {
			run := fmt.Sprintf("run-%02d", i)
			prev := store.Cursor{}
			for j := range 4 {
				cur := store.Cursor{TS: int64(j + 1), Count: 1}
				if _, err := s.AppendAfter(run, "pod/a/1", prev, cur, Lines("a", "x"), base.Add(time.Duration(i)*time.Second)); err != nil {
					t.Error(err)
				}
				prev = cur
				if _, err := s.UpdateRun(run, func(r *store.Run) {
					r.Namespace, r.Agent, r.Company, r.Pod, r.PodUID = "ns", fmt.Sprintf("agent-%d", i%3), "acme", run+"-pod", "uid-"+run
					// Every third run's last update finishes it.
					r.Phase, r.Done = "Running", j == 3 && i%3 == 0
				}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	const finished = 4 // runs 0, 3, 6, 9
	check := func(s store.Backend) {
		t.Helper()
		runs, err := s.RunsWhere(store.Filter{})
		if err != nil || len(runs) != 12 {
			t.Fatalf("%d runs listed (%v), want 12", len(runs), err)
		}
		for i, sum := range runs {
			if i > 0 && sum.SeenAt.After(runs[i-1].SeenAt) {
				t.Errorf("run %s listed after an older one", sum.ID)
			}
			rec, err := s.Run(sum.ID)
			if err != nil || rec == nil {
				t.Fatalf("listed run %s has no record (%v)", sum.ID, err)
			}
			want := summaryOf(rec)
			if diff := cmp.Diff(want, sum); diff != "" {
				t.Errorf("run %s: the list's summary differs from the record's (-record +list):\n%s", sum.ID, diff)
			}
		}
		if one, _ := s.RunsWhere(store.Filter{Agent: "agent-1"}); len(one) != 4 {
			t.Errorf("runs of agent-1: %d, want 4", len(one))
		}
		// A filter selects where the runs are kept what Match selects.
		all, _ := s.RunsWhere(store.Filter{})
		for _, f := range []store.Filter{{Agent: "agent-1"}, {Agent: "agent-2", Phase: "Running"}, {Company: "acme"},
			{Company: "other"}, {Phase: "Succeeded"}, {Unfinished: true}, {Agent: "agent-0", Unfinished: true}} {
			got, err := s.RunsWhere(f)
			if err != nil {
				t.Fatalf("RunsWhere(%+v): %v", f, err)
			}
			var want []store.Summary
			for _, r := range all {
				if f.Match(&r) {
					want = append(want, r)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("RunsWhere(%+v) differs from the runs Match selects (-Match +RunsWhere):\n%s", f, diff)
			}
		}
		if got, _ := s.RunsWhere(store.Filter{Unfinished: true}); len(got) != 12-finished {
			t.Errorf("%d unfinished runs, want %d", len(got), 12-finished)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(again())
}

// summaryOf is the record's summary, with times compared as instants.
func summaryOf(r *store.Run) store.Summary {
	s := store.Summary{ID: r.ID, Namespace: r.Namespace, Pod: r.Pod, PodUID: r.PodUID, Agent: r.Agent, Company: r.Company,
		Phase: r.Phase, Done: r.Done, LastSeq: r.LastSeq, Bytes: r.Bytes, SeenAt: r.SeenAt}
	return s
}

// A run's record keeps its result whole; RunOfJob finds a Job's run.
func aRunsResult(t *testing.T, b Backend) {
	s, again := b.Open(t)
	cost := 0.42
	exit := int32(1)
	started := time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC)
	res := &result.Result{Format: "claude-stream-json", SessionID: "sess-1", Model: "m", Subtype: "error_max_turns", IsError: true,
		Text: "stopped \x00 here", CostUSD: &cost, Outcome: "failed", Errors: []string{"too many turns", strings.Repeat("e", 100_000)},
		Usage: &result.Usage{InputTokens: 10, OutputTokens: 20}}
	const job = "0b7e7c2a-1f5d-4c1e-9a3e-6d2f8b9c0a11"
	if _, err := s.UpdateRun("run-1", func(r *store.Run) {
		r.Namespace, r.Job, r.JobUID, r.Containers, r.MainContainer = "ns", "job-1", job, []string{"agent"}, "agent"
		r.Phase, r.Done, r.ExitCode, r.Reason, r.StartedAt, r.Result = "Failed", true, &exit, "Error", &started, res
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = again()
	got, err := s.Run("run-1")
	if err != nil || got == nil {
		t.Fatalf("run: %v", err)
	}
	if diff := cmp.Diff(res, got.Result); diff != "" {
		t.Errorf("result (-written +read):\n%s", diff)
	}
	if got.ExitCode == nil || *got.ExitCode != 1 || !got.StartedAt.Equal(started) || got.JobUID != job {
		t.Errorf("record %+v", got)
	}
	if r, _ := store.RunOfJob(s, "run-1", job); r == nil || r.ID != "run-1" {
		t.Errorf("RunOfJob of the run's own Job: %+v", r)
	}
	other := "1c8f8d3b-2a6e-4d2f-8b4f-7e3a9c0d1b22"
	if r, _ := store.RunOfJob(s, "run-1", other); r != nil {
		t.Errorf("RunOfJob of another Job found %s", r.ID)
	}
	if _, err := s.UpdateRun(store.RunKey("run-1", other), func(r *store.Run) { r.JobUID = other }); err != nil {
		t.Fatal(err)
	}
	if r, _ := store.RunOfJob(s, "run-1", other); r == nil || r.ID != store.RunKey("run-1", other) {
		t.Errorf("RunOfJob of the Job kept apart: %+v", r)
	}
}

func retention(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	now := time.Now()
	old := now.Add(-48 * time.Hour)
	mk := func(id string, seen time.Time, done bool, n int) {
		texts := make([]string, n)
		for i := range texts {
			texts[i] = fmt.Sprintf("%d", i)
		}
		mustAppend(t, s, id, id, store.Cursor{}, store.Cursor{TS: 1, Count: 1}, Lines("c", texts...))
		if _, err := s.UpdateRun(id, func(r *store.Run) { r.Done = done; r.SeenAt = seen; r.Bytes = int64(n * 100) }); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMirrorState(id, store.MirrorState{Seq: uint64(n), Size: 10}); err != nil {
			t.Fatal(err)
		}
	}
	mk("old-done", old, true, 23) // more lines than a deletion batch of the PostgreSQL store under test
	mk("old-running", old, false, 1)
	mk("new-done-a", now.Add(-2*time.Minute), true, 5)
	mk("new-done-b", now.Add(-time.Minute), true, 5)
	gone, err := s.Retain(24*time.Hour, 0, now)
	if err != nil || len(gone) != 1 || gone[0].ID != "old-done" {
		t.Fatalf("age retention deleted %v (%v), want old-done", gone, err)
	}
	if gone[0].Bytes != 2300 || !gone[0].Done {
		t.Errorf("retired run %+v: want its summary", gone[0])
	}
	if r, _ := s.Run("old-running"); r == nil {
		t.Error("a running run was deleted")
	}
	// 1100 bytes remain, limit 700: the oldest finished run goes.
	gone, err = s.Retain(0, 700, now)
	if err != nil || len(gone) != 1 || gone[0].ID != "new-done-a" {
		t.Fatalf("size retention deleted %v (%v), want new-done-a", gone, err)
	}
	for _, id := range []string{"old-done", "new-done-a"} {
		if r, _ := s.Run(id); r != nil {
			t.Errorf("%s: the record remains", id)
		}
		if got, _ := store.Lines(s, id, 0, 0); len(got) != 0 {
			t.Errorf("%s: %d lines remain", id, len(got))
		}
		if c, _ := s.Cursor(id, id); c != (store.Cursor{}) {
			t.Errorf("%s: the cursor remains", id)
		}
		if m, _ := s.MirrorState(id); m != (store.MirrorState{}) {
			t.Errorf("%s: the mirror state remains", id)
		}
	}
	if c, _ := s.Cursor("new-done-b", "new-done-b"); c.TS == 0 {
		t.Error("the cursor of a kept run was deleted")
	}
	if m, _ := s.MirrorState("new-done-b"); m.Seq != 5 {
		t.Error("the mirror state of a kept run was deleted")
	}
	if got, _ := store.Lines(s, "new-done-b", 0, 0); len(got) != 5 {
		t.Errorf("a kept run has %d lines, want 5", len(got))
	}
	runs, _ := s.RunsWhere(store.Filter{})
	if len(runs) != 2 {
		t.Errorf("%d runs listed after retention, want 2", len(runs))
	}
	// A run id seen again after its run was retired starts afresh.
	mustAppend(t, s, "old-done", "old-done", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, Lines("c", "again"))
	if got := storedTexts(t, s, "old-done"); len(got) != 1 || got[0] != "c: again" {
		t.Errorf("a retired run id written again holds %v", got)
	}
}

func changedFires(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	fired := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}
	ch := s.Changed("run-1")
	select {
	case <-ch:
		t.Fatal("fired before any change")
	default:
	}
	mustAppend(t, s, "run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 1}, Lines("c", "x"))
	if !fired(ch) {
		t.Fatal("an append did not signal")
	}
	ch = s.Changed("run-1")
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { r.Phase, r.Done = "Succeeded", true }); err != nil {
		t.Fatal(err)
	}
	if !fired(ch) {
		t.Fatal("an update did not signal")
	}
	ch = s.Changed("run-1")
	if _, err := s.Retain(time.Nanosecond, 0, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !fired(ch) {
		t.Fatal("retiring the run did not signal its followers")
	}
}

// Two writers (relays, when the store has replicas) append two streams of
// one run at once: one dense sequence, each stream's lines in order, each
// stream's cursor its last line's.
func concurrentWritersOfTwoStreams(t *testing.T, b Backend) {
	s, again := b.Open(t)
	writers := []store.Backend{s, s}
	if b.Replicas {
		writers[1] = again()
	}
	const n = 300
	logs := [][]store.Line{burstyLog("a", n), burstyLog("b", n)}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			<-start
			rest, curs := after(logs[w], store.Cursor{})
			prev := store.Cursor{}
			for i := 0; i < n; i += 7 {
				j := min(i+7, n)
				if _, err := writers[w].AppendAfter("run-1", fmt.Sprintf("pod/%d", w), prev, curs[j-1], rest[i:j], time.Now()); err != nil {
					t.Error(err)
					return
				}
				prev = curs[j-1]
			}
		})
	}
	close(start)
	wg.Wait()
	stored := storedTexts(t, s, "run-1")
	if len(stored) != 2*n {
		t.Fatalf("%d lines stored, want %d", len(stored), 2*n)
	}
	for w, log := range logs {
		var mine []string
		for _, l := range stored {
			if strings.HasPrefix(l, log[0].Container+": ") {
				mine = append(mine, l)
			}
		}
		if diff := cmp.Diff(texts(log), mine); diff != "" {
			t.Errorf("stream %d (-log +stored):\n%s", w, diff)
		}
		_, curs := after(log, store.Cursor{})
		if c, _ := s.Cursor("run-1", fmt.Sprintf("pod/%d", w)); c != curs[n-1] {
			t.Errorf("stream %d cursor %+v, want %+v", w, c, curs[n-1])
		}
	}
	if r, _ := s.Run("run-1"); r == nil || r.LastSeq != 2*n {
		t.Errorf("run record %+v, want last seq %d", r, 2*n)
	}
}

// Two writers (two relays, when the store has replicas) both believe they
// own one stream: they read the same log from the same cursor, in batches
// of different sizes, and each commits only from the cursor it last saw.
// A refused writer resumes from the stored cursor, as a follower does.
// Every line of the log is stored once, in order.
func twoWritersOfOneStream(t *testing.T, b Backend) {
	s, again := b.Open(t)
	writers := []store.Backend{s, s}
	if b.Replicas {
		writers[1] = again()
	}
	const n = 600
	log := burstyLog("agent", n)
	var conflicts [2]int
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		batch := []int{3, 5}[w]
		wg.Go(func() {
			<-start
			from := store.Cursor{}
			rest, curs := after(log, from)
			for len(rest) > 0 {
				k := min(batch, len(rest))
				_, err := writers[w].AppendAfter("run-1", "pod/agent/1", from, curs[k-1], rest[:k], time.Now())
				var conflict *store.CursorConflict
				switch {
				case errors.As(err, &conflict):
					conflicts[w]++
					from = conflict.Stored
					rest, curs = after(log, from)
				case err != nil:
					t.Error(err)
					return
				default:
					from = curs[k-1]
					rest, curs = rest[k:], curs[k:]
				}
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d lines, batches of 3 and 5: %d and %d commits refused", n, conflicts[0], conflicts[1])
	if conflicts[0]+conflicts[1] == 0 {
		t.Error("no commit was refused: both writers started from the same cursor, so the second commit from it must be")
	}
	if diff := cmp.Diff(texts(log), storedTexts(t, s, "run-1")); diff != "" {
		t.Errorf("stored lines (-log +stored):\n%s", diff)
	}
	_, curs := after(log, store.Cursor{})
	if c, _ := s.Cursor("run-1", "pod/agent/1"); c != curs[n-1] {
		t.Errorf("cursor %+v, want %+v", c, curs[n-1])
	}
}

func mustJSON(t *testing.T, l store.Line) string {
	t.Helper()
	b, err := json.Marshal(&l)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// noLineAfterAHugeCursor: "after N" for an N no run reaches (a client's
// Last-Event-ID or ?after= at or above 2^63) is past the end: no line.
// A signed conversion made it negative on PostgreSQL, and after+1
// wrapped to 0 on bbolt: both replayed the whole log (a hostile review).
func noLineAfterAHugeCursor(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	mustAppend(t, s, "run-1", "st", store.Cursor{}, store.Cursor{TS: 1, Count: 2}, []store.Line{
		{TS: t0, Container: "agent", Line: "one"}, {TS: t0, Container: "agent", Line: "two"}})
	for _, after := range []uint64{math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64} {
		if got, err := store.Lines(s, "run-1", after, 0); err != nil || len(got) != 0 {
			t.Errorf("after %d: %d lines (%v), want none", after, len(got), err)
		}
	}
}

// retentionKeepsRetired: each run retention deletes leaves a Retired
// under its Job (so that its pods, still there, are not collected again),
// in the same transaction; a later attempt's stays over an earlier one's;
// a record that names no Job leaves none; a Job's UID is its own in its
// namespace only; ForgetRetired deletes them.
func retentionKeepsRetired(t *testing.T, b Backend) {
	s, again := b.Open(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	old := now.Add(-48 * time.Hour)
	const jobA, jobB = "0b6c3a2e-1f4d-4c8e-9a51-7d2f0e6b9c11", "5e8d1c7a-2b3f-4a6e-8c90-1f2e3d4c5b6a"
	created := func(h int) *time.Time { c := old.Add(time.Duration(h) * time.Hour).Truncate(time.Second); return &c }
	mk := func(id, job string, pod *time.Time) {
		mustAppend(t, s, id, id, store.Cursor{}, store.Cursor{TS: 1, Count: 1}, Lines("c", "x"))
		if _, err := s.UpdateRun(id, func(r *store.Run) {
			r.Done, r.SeenAt, r.JobUID, r.PodCreated, r.Namespace = true, old, job, pod, "agents"
		}); err != nil {
			t.Fatal(err)
		}
	}
	mk("run-a", jobA, created(2))
	mk("run-legacy", "", created(1))
	if got, err := s.RetiredRun("agents", jobA); err != nil || got != nil {
		t.Fatalf("a Job whose run was never retired: %+v, %v", got, err)
	}
	if gone, err := s.Retain(24*time.Hour, 0, now); err != nil || len(gone) != 2 {
		t.Fatalf("retention deleted %v (%v), want both runs", gone, err)
	}
	want := store.Retired{JobUID: jobA, Namespace: "agents", Run: "run-a", PodCreated: *created(2), RetiredAt: now}
	got, err := s.RetiredRun("agents", jobA)
	if err != nil || got == nil || !got.PodCreated.Equal(want.PodCreated) || !got.RetiredAt.Equal(want.RetiredAt) || got.Run != want.Run || got.JobUID != jobA || got.Namespace != want.Namespace {
		t.Fatalf("kept of the retired run-a: %+v (%v), want %+v", got, err, want)
	}
	if !got.Covers(*created(2)) || !got.Covers(*created(1)) || got.Covers(*created(3)) {
		t.Errorf("%+v covers its own pod and earlier ones, not a later attempt's", got)
	}
	all, err := s.RetiredRuns()
	if err != nil || len(all) != 1 {
		t.Errorf("retired runs %+v (%v): want run-a's only (the legacy record names no Job)", all, err)
	}

	// An earlier attempt of Job B's run under another key, retired after
	// a later one, does not take the later one's place.
	mk("run-b-late", jobB, created(5))
	if _, err := s.Retain(24*time.Hour, 0, now); err != nil {
		t.Fatal(err)
	}
	mk("run-b-early", jobB, created(4))
	if _, err := s.Retain(24*time.Hour, 0, now); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RetiredRun("agents", jobB); err != nil || got == nil || !got.PodCreated.Equal(*created(5)) || got.Run != "run-b-late" {
		t.Errorf("Job B's retired run after an earlier attempt's: %+v (%v), want run-b-late's", got, err)
	}

	if !b.Replicas {
		s.Close()
	}
	s = again()
	if got, err := s.RetiredRun("agents", jobA); err != nil || got == nil {
		t.Errorf("after reopening: %+v, %v", got, err)
	}
	if got, err := s.RetiredRun("elsewhere", jobA); err != nil || got != nil {
		t.Errorf("Job A's UID in another namespace (a pod there naming Job A its controller): %+v, %v", got, err)
	}
	if err := s.ForgetRetired(store.Retired{Namespace: "agents", JobUID: jobA}, store.Retired{Namespace: "agents", JobUID: "no-such-job"},
		store.Retired{Namespace: "elsewhere", JobUID: jobB}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RetiredRun("agents", jobA); err != nil || got != nil {
		t.Errorf("forgotten: %+v, %v", got, err)
	}
	if got, err := s.RetiredRun("agents", jobB); err != nil || got == nil {
		t.Errorf("another Job's, after forgetting Job A's: %+v, %v", got, err)
	}
}
