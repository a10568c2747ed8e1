package postgres

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Runs changed while a notification is sent go out in the next one, every
// one once, in payloads the server accepts; what could not be sent is
// sent later.
func TestOutboxCoalescesRunsIntoPayloads(t *testing.T) {
	o := outbox{self: "!me", pending: map[string]*carried{}}
	want := map[string]bool{}
	for i := range 1000 {
		run := fmt.Sprintf("run-%04d@0b7e7c2a-1f5d-4c1e-9a3e-6d2f8b9c0a11", i)
		o.pending[run], want[run] = &carried{idOnly: true}, true
	}
	payloads := o.take()
	if len(payloads) < 2 {
		t.Fatalf("%d payloads for %d runs", len(payloads), len(want))
	}
	got := map[string]int{}
	for _, p := range payloads {
		if len(p) > payloadBytes {
			t.Errorf("a payload of %d bytes, over %d", len(p), payloadBytes)
		}
		lines := strings.Split(p, "\n")
		if lines[0] != "!me" {
			t.Errorf("a payload from %q, want from !me", lines[0])
		}
		for _, run := range lines[1:] {
			got[run]++
		}
	}
	for run := range want {
		if got[run] != 1 {
			t.Fatalf("run %s in %d payloads", run, got[run])
		}
	}
	if len(got) != len(want) || len(o.take()) != 0 {
		t.Errorf("%d runs sent, want %d; and the outbox is not empty", len(got), len(want))
	}
	o.putBack(payloads[:1])
	sorted := func(p string) string {
		runs := strings.Split(p, "\n")[1:]
		slices.Sort(runs)
		return strings.Join(runs, ",")
	}
	if again := o.take(); len(again) != 1 || sorted(again[0]) != sorted(payloads[0]) {
		t.Errorf("put back one payload, took back %d that differ", len(again))
	}
}

// A run's committed lines go out with its id, in the order of their
// seqs, and are read back as sent, each run's whole in one payload; lines
// that do not follow the ones carried, or too many bytes of them, leave
// the id alone (its readers query), as does an entry another relay
// garbled.
func TestOutboxCarriesSmallCommitsLines(t *testing.T) {
	o := outbox{self: "!me", pending: map[string]*carried{}, wake: make(chan struct{}, 1)}
	line := func(seq int, n int) []byte {
		return fmt.Appendf(nil, `{"seq":%d,"line":%q}`, seq, strings.Repeat("x", n))
	}
	want := map[string][][]byte{}
	for i := range 40 {
		run := fmt.Sprintf("run-%02d", i)
		for seq := 1; seq <= 3; seq++ {
			l := line(seq, 300)
			o.put(run, func(c *carried) { c.addLines(uint64(seq), [][]byte{l}) })
			want[run] = append(want[run], l)
		}
	}
	o.put("gap", func(c *carried) { c.addLines(1, [][]byte{line(1, 10)}) })
	o.put("gap", func(c *carried) { c.addLines(3, [][]byte{line(3, 10)}) })
	o.put("big", func(c *carried) { c.addLines(1, [][]byte{line(1, carryBytes)}) })
	o.put("record", func(c *carried) { c.addLines(1, [][]byte{line(1, 10)}) })
	o.put("record", func(c *carried) { *c = carried{idOnly: true} })
	payloads := o.take()
	if len(payloads) < 2 {
		t.Fatalf("%d payloads for 40 runs of 900 bytes each", len(payloads))
	}
	got := map[string]*carried{}
	for _, p := range payloads {
		if len(p) > payloadBytes {
			t.Errorf("a payload of %d bytes, over %d", len(p), payloadBytes)
		}
		_, said := parsePayload(strings.Split(p, "\n")[1:])
		for run, c := range said {
			if got[run] != nil {
				t.Errorf("run %s in two payloads", run)
			}
			got[run] = c
		}
	}
	for run, lines := range want {
		c := got[run]
		if c == nil || c.idOnly || c.first != 1 || !slices.EqualFunc(c.lines, lines, func(a, b []byte) bool { return string(a) == string(b) }) {
			t.Errorf("run %s: read back %+v, want its 3 lines from seq 1", run, c)
		}
	}
	for _, run := range []string{"gap", "big", "record"} {
		if c := got[run]; c == nil || !c.idOnly {
			t.Errorf("run %s: read back %+v, want its id alone", run, c)
		}
	}
	_, said := parsePayload([]string{"run-a", "\x011 {}", "\x013 {}", "run-b", "\x01x {}", "run-c", "\x017 {}", "\x018 {}"})
	if !said["run-a"].idOnly || !said["run-b"].idOnly || said["run-c"].idOnly || said["run-c"].first != 7 || len(said["run-c"].lines) != 2 {
		t.Errorf("garbled entries read as %+v %+v %+v", said["run-a"], said["run-b"], said["run-c"])
	}
}

// A run's tail serves the lines after a reader's cursor while it holds
// the line after it and a query since it began found the run running;
// a reader with nothing new queries; it keeps the newest lines within its
// bounds, starts again after a gap, and is dropped when lines come again
// or out of order, or when nobody here waits on the run nor read it for
// tailIdle.
func TestTailServesWhatItHoldsAndNothingElse(t *testing.T) {
	var ts tails
	now := time.Unix(1_700_000_000, 0)
	js := func(seq uint64) []byte { return fmt.Appendf(nil, `{"seq":%d}`, seq) }
	lines := func(from, to uint64) [][]byte {
		var out [][]byte
		for s := from; s <= to; s++ {
			out = append(out, js(s))
		}
		return out
	}
	served := func(after uint64) (seqs []uint64, last uint64, ok bool) {
		got, last, ok := ts.page("r", after, 1000, now)
		for _, l := range got {
			if string(l.JSON) != string(js(l.Seq)) {
				t.Fatalf("seq %d served as %s", l.Seq, l.JSON)
			}
			seqs = append(seqs, l.Seq)
		}
		return seqs, last, ok
	}
	ts.add("r", 5, lines(5, 6), false, now)
	if _, _, ok := served(4); ok {
		t.Fatal("a tail kept for a run nobody here waits on")
	}
	ts.add("r", 5, lines(5, 6), true, now)
	ts.add("r", 7, lines(7, 9), true, now)
	if _, _, ok := served(6); ok {
		t.Fatal("served before a query found the run running since the tail began: its end may have come first")
	}
	ts.confirm("r", &tail{}) // a tail dropped and begun again since the query
	if _, _, ok := served(6); ok {
		t.Fatal("confirmed by a query made before the tail began")
	}
	ts.confirm("r", ts.held("r"))
	if seqs, last, ok := served(6); !ok || last != 9 || !slices.Equal(seqs, []uint64{7, 8, 9}) {
		t.Fatalf("after 6: %v last %d %v, want 7 8 9", seqs, last, ok)
	}
	for _, after := range []uint64{3, 9, 10} { // 9: nothing new, the reader queries
		if _, _, ok := served(after); ok {
			t.Fatalf("after %d: served, though the tail holds 5-9", after)
		}
	}
	ts.add("r", 10, lines(10, 10+tailLines), true, now)
	if _, last, ok := served(10); !ok || last != 10+tailLines {
		t.Fatalf("the newest %d lines not served: last %d %v", tailLines, last, ok)
	}
	if _, _, ok := served(9); ok {
		t.Fatal("lines past the tail's bound still served")
	}
	ts.add("r", 100, lines(100, 101), true, now) // a gap: another relay's commit unheard
	ts.confirm("r", ts.held("r"))
	if _, _, ok := served(80); ok {
		t.Fatal("served across a gap")
	}
	if seqs, _, ok := served(99); !ok || !slices.Equal(seqs, []uint64{100, 101}) {
		t.Fatalf("after the gap: %v %v", seqs, ok)
	}
	// A reader woken by one commit does not wait while it reads: the
	// next commit keeps the tail it read lately, not one idle for long.
	now = now.Add(tailIdle / 2)
	ts.add("r", 102, lines(102, 102), false, now)
	if seqs, _, ok := served(101); !ok || !slices.Equal(seqs, []uint64{102}) {
		t.Fatalf("a tail read %s ago, extended with nobody waiting: %v %v", tailIdle/2, seqs, ok)
	}
	now = now.Add(tailIdle)
	ts.add("r", 103, lines(103, 103), false, now)
	if _, _, ok := served(102); ok {
		t.Fatalf("a tail nobody read for %s, nor waits on, kept", tailIdle)
	}
	ts.add("r", 100, lines(100, 101), true, now)
	ts.add("r", 101, lines(101, 102), true, now) // lines again: two writers
	if _, _, ok := served(99); ok {
		t.Fatal("served after lines came again")
	}
}
