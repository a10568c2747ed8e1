package collect

import (
	"fmt"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// line is a log line as a stream gives it: its timestamp and its text.
type line struct {
	ts   time.Time
	text string
}

// lines are lines stamped ts, each with a text of its own.
func lines(ts ...time.Time) []line {
	out := make([]line, len(ts))
	for i, x := range ts {
		out[i] = line{x, fmt.Sprintf("line %d at %s", i, x.Format(time.StampMicro))}
	}
	return out
}

// session feeds lines to a resume from c and returns the accepted
// indexes and the final cursor. It stops at a line the resume cannot
// tell from one stored, where a follower's session ends.
func session(c store.Cursor, ls []line) ([]int, store.Cursor) {
	r := newResume(c)
	var got []int
	for i, l := range ls {
		switch r.accept(l.ts, l.text) {
		case lineNew:
			got = append(got, i)
		case lineHeldServedAgain:
			got = got[:len(got)-1] // a batch drops the held line
		case lineUnsure:
			return got, r.cur
		}
	}
	return got, r.cur
}

// accepted are the lines of ls at the indexes acc.
func accepted(ls []line, acc []int) []line {
	var out []line
	for _, i := range acc {
		out = append(out, ls[i])
	}
	return out
}

// since are the lines of log a stream opened at the cursor c serves: from
// the second of c, as the API's SinceTime does.
func since(log []line, c store.Cursor) []line {
	var out []line
	for _, l := range log {
		if !l.ts.Before(c.SinceTime()) {
			out = append(out, l)
		}
	}
	return out
}

func TestResumeSkipsExactlyWhatIsStored(t *testing.T) {
	// The log: three lines share one timestamp, mid-second.
	log := lines(at(100), at(200), at(200), at(200), at(700), at(1300), at(1300))
	for stop := 0; stop <= len(log); stop++ {
		t.Run(fmt.Sprintf("stored %d lines", stop), func(t *testing.T) {
			first, cur := session(store.Cursor{}, log[:stop])
			if len(first) != stop {
				t.Fatalf("fresh session accepted %d of %d", len(first), stop)
			}
			// Reconnect: the API serves from the second of the cursor.
			replay := since(log, cur)
			second, _ := session(cur, replay)
			if got, want := accepted(replay, second), log[stop:]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("after resume accepted %v, want %v", got, want)
			}
		})
	}
}

func TestResumeAcrossTwoBreaksInOneSecond(t *testing.T) {
	log := lines(at(10), at(10), at(20), at(20), at(20), at(30))
	_, c1 := session(store.Cursor{}, log[:3])
	acc, c2 := session(c1, log[:4]) // broke again after one more line
	if len(acc) != 1 || c2 != (store.Cursor{TS: at(20).UnixNano(), Count: 2}) {
		t.Fatalf("second session accepted %v, cursor %+v", acc, c2)
	}
	acc, _ = session(c2, log)
	if len(acc) != 2 || acc[0] != 4 || acc[1] != 5 {
		t.Errorf("third session accepted %v, want [4 5]", acc)
	}
}

func TestSplitTimestamp(t *testing.T) {
	ts, msg, err := splitTimestamp(`2026-11-21T10:00:05.123456789Z {"type":"system"}`)
	if err != nil || ts.Nanosecond() != 123456789 || msg != `{"type":"system"}` {
		t.Errorf("got %v %q %v", ts, msg, err)
	}
	ts, msg, err = splitTimestamp(`2026-11-21T10:00:05Z `)
	if err != nil || len(msg) != 0 || !ts.Equal(t0) {
		t.Errorf("empty line: %v %q %v", ts, msg, err)
	}
	for _, bad := range []string{"", "no-timestamp here", "2026-13-45T00:00:00Z x"} {
		if _, _, err := splitTimestamp(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestResumeWithOutOfOrderTimestamps: a runtime can write a line stamped
// earlier after one stamped later (stdout and stderr race for the file).
// The cursor must not move back, or the resume stores the later line again.
func TestResumeWithOutOfOrderTimestamps(t *testing.T) {
	log := lines(at(10), at(30), at(20), at(40))
	_, cur := session(store.Cursor{}, log[:3]) // stored: 10, 30, 20
	if cur.TS != at(30).UnixNano() {
		t.Fatalf("cursor moved back to %v", time.Unix(0, cur.TS))
	}
	acc, _ := session(cur, log)
	if len(acc) != 1 || acc[0] != 3 {
		t.Errorf("resume accepted %v, want only the 4th line", acc)
	}
}

// servedAgain is what a session opened at cur reads when the kubelet
// serves file again from its start within the stream after the session
// read it (it renames a rotated log back when the runtime could not reopen
// it: a container exiting, a runtime too busy to answer): the log from the
// cursor's second, file again, then the lines after.
func servedAgain(log []line, cur store.Cursor, file []line, after ...line) []line {
	return append(append(since(log, cur), file...), after...)
}

// TestResumeSkipsAFileTheKubeletServesAgain: the lines the session stored,
// the one at its cursor's timestamp among them, are stored once when the
// kubelet serves their file again.
func TestResumeSkipsAFileTheKubeletServesAgain(t *testing.T) {
	log := lines(at(100), at(200), at(300), at(15000), at(15000), at(15100))
	next := line{at(16000), "written after"}
	for stop := 0; stop < len(log); stop++ {
		t.Run(fmt.Sprintf("stored %d lines", stop), func(t *testing.T) {
			_, cur := session(store.Cursor{}, log[:stop])
			again := servedAgain(log, cur, log, next)
			acc, _ := session(cur, again)
			want := append(append([]line{}, log[stop:]...), next)
			if got := accepted(again, acc); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("accepted %v, want %v", got, want)
			}
		})
	}
}

// TestResumeSkipsAFileServedAgainWithinASecond: a file served again whose
// lines all lie within a second of the newest (a flood's rotated file
// spans milliseconds), or that starts at the session's cursor, is skipped
// by the lines themselves: their timestamps and text.
func TestResumeSkipsAFileServedAgainWithinASecond(t *testing.T) {
	// A flood's rotated file: 50,000 lines in half a second (the real
	// node's flood test rotates files of 40,000 lines).
	var flood []time.Time
	for i := range 50000 {
		flood = append(flood, t0.Add(time.Duration(i)*10*time.Microsecond))
	}
	for _, c := range []struct {
		name string
		log  []line
		// stored: how many of log's lines were stored before the session;
		// file: what the kubelet serves again (nil: log).
		stored int
		file   []line
	}{
		{name: "a file of milliseconds", log: lines(at(100), at(105), at(110))},
		{name: "a flood's file", log: lines(flood...)},
		{name: "out of order lines", log: lines(at(100), at(130), at(120), at(140))},
		{name: "from the cursor", log: lines(at(100), at(100), at(100), at(150)), stored: 2},
		{name: "from within the file", log: lines(at(100), at(200), at(300), at(400)), file: lines(at(100), at(200), at(300), at(400))[1:]},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, cur := session(store.Cursor{}, c.log[:c.stored])
			file := c.file
			if file == nil {
				file = c.log
			}
			last := c.log[len(c.log)-1].ts
			next := []line{{last.Add(time.Millisecond), "written after"}, {last.Add(2 * time.Millisecond), "and after"}}
			again := servedAgain(c.log, cur, file, next...)
			acc, _ := session(cur, again)
			want := append(append([]line{}, c.log[c.stored:]...), next...)
			if got := accepted(again, acc); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("accepted %d lines, want %d:\n%v\nwant\n%v", len(got), len(want), got, want)
			}
		})
	}
}

// TestResumeKeepsLinesOutOfOrder: what tells a file served again apart
// must not take a runtime's out-of-order lines for one: a second line
// stamped before the first, and a line stamped 11 ms late behind a flood
// of 2,000 lines, are both stored; so are lines out of order written
// after a file served again, and lines one write stamped alike (CRI-O
// stamps a whole read with one time), the same text among them.
func TestResumeKeepsLinesOutOfOrder(t *testing.T) {
	if acc, _ := session(store.Cursor{}, lines(at(300), at(200), at(400))); len(acc) != 3 {
		t.Errorf("a second line stamped before the first: accepted %v of 3", acc)
	}
	var flood []time.Time
	for i := range 2000 {
		flood = append(flood, t0.Add(time.Duration(i)*10*time.Microsecond))
	}
	late := lines(append(flood, flood[len(flood)-1].Add(-11*time.Millisecond))...)
	if acc, _ := session(store.Cursor{}, late); len(acc) != len(late) {
		t.Errorf("a line 11 ms late behind a flood: accepted %d of %d", len(acc), len(late))
	}

	// A file of two seconds with lines out of order is served again;
	// the lines written after it come out of order too, the first
	// stamped before the last line stored.
	file := lines(at(0), at(1000), at(2000), at(1990), at(2010))
	after := []line{{at(2005), "after, stamped before the last line stored"}, {at(2030), "after 2"}, {at(2020), "after 3"}}
	again := append(append(append([]line{}, file...), file...), after...)
	acc, _ := session(store.Cursor{}, again)
	want := append(append([]line{}, file...), after...)
	if got := accepted(again, acc); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a file with lines out of order served again, then lines out of order: accepted\n%v\nwant\n%v", got, want)
	}

	burst := []line{{at(500), "a"}, {at(500), ""}, {at(500), "b"}, {at(500), ""}, {at(500), ""}, {at(600), "c"}}
	if acc, _ := session(store.Cursor{}, burst); len(acc) != len(burst) {
		t.Errorf("lines one write stamped alike: accepted %v of %d", acc, len(burst))
	}
}

// TestResumeReadsAgainWhatItCannotTell: a file served again whose lines
// are all stamped as the last lines read (at a flood's end, the newest
// file holding the result alone) and lines written twice in one write
// (CRI-O stamps a read with one time) both bring the first of the last
// lines again, timestamp and text alike. The session ends there, and the
// next, reading the log once from the cursor, stores what the log holds
// once: the file served again not at all, the lines written twice both.
func TestResumeReadsAgainWhatItCannotTell(t *testing.T) {
	flood := lines(at(0), at(1), at(2), at(3))
	result := line{at(10000), "result"}
	a, x, y, b := line{at(0), "a"}, line{at(500), "x"}, line{at(500), "y"}, line{at(600), "b"}
	for _, c := range []struct {
		name string
		// log is what a stream opened anew serves; read, what the first
		// session reads (nil: log).
		log, read []line
	}{
		{name: "the newest file, its only line, served again", log: append(flood, result),
			read: append(append(append([]line{}, flood...), result), result, result, result)},
		{name: "a file of lines stamped alike served again", log: []line{a, x, y}, read: []line{a, x, y, x, y}},
		{name: "a line written twice", log: []line{a, x, x, b}},
		{name: "two lines written twice", log: []line{a, x, y, x, y, b}},
		{name: "a line written twice after another", log: []line{a, y, x, x, b}},
	} {
		t.Run(c.name, func(t *testing.T) {
			read := c.read
			if read == nil {
				read = c.log
			}
			first, cur := session(store.Cursor{}, read)
			again := since(c.log, cur)
			second, _ := session(cur, again)
			got := append(accepted(read, first), accepted(again, second)...)
			if fmt.Sprint(got) != fmt.Sprint(c.log) {
				t.Errorf("stored\n%v\nwant\n%v", got, c.log)
			}
		})
	}
}

// TestResumeSkipsTheFirstLineOfAFileServedAgainAfterAJoin: the runtime
// switches files between two reads of the container's output, so a
// rotated file can end with the head of a line (a partial record); the
// kubelet joins it to the next line it reads, stamped as the head. A
// follow left behind on a rotated file (a flood) reads that head, skips
// the files after it and reopens the newest: its first line comes joined
// to the head, stamped seconds before it. When the kubelet then serves
// the newest file again, its first line comes alone, with its own stamp
// and text, which the session never read: it is the line before the lines
// the session remembers, not a line written out of order, and is stored
// once. (The real node's flood test stored line 292777 after 293241 so.)
// A line stamped out of order at a file's end is still stored when that
// file is served again after it: it does not come before the file's
// first line.
func TestResumeSkipsTheFirstLineOfAFileServedAgainAfterAJoin(t *testing.T) {
	var rotated []line // a rotated file, whose last line's head ends it
	for i := range 10 {
		rotated = append(rotated, line{at(i), fmt.Sprintf(`{"n":%d}`, i)})
	}
	// The newest file: its first line stamped before the stall of the
	// rotation, 300 ms before the lines after it.
	first := line{at(15700), `{"n":1000}`}
	newest := []line{first}
	for i := range 5 {
		newest = append(newest, line{at(16000 + i), fmt.Sprintf(`{"n":%d}`, 1001+i)})
	}
	joined := line{at(10), `{"n":10,"te` + first.text} // the head of line 10, then the newest file's first line
	after := []line{{at(16500), `{"n":1006}`}, {at(16501), `{"n":1007}`}}
	read := append(append(append(append(append([]line{}, rotated...), joined), newest[1:]...), newest...), after...)
	acc, _ := session(store.Cursor{}, read)
	want := append(append(append(append([]line{}, rotated...), joined), newest[1:]...), after...)
	if got := accepted(read, acc); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the newest file served again after its first line came joined: accepted\n%v\nwant\n%v", got, want)
	}

	// A file whose last line is stamped before the one read before it,
	// served again (renamed back): that line is stored.
	file := []line{{at(100), "p"}, {at(200), "q"}, {at(190), "r, out of order"}}
	read = append(append(append([]line{}, file...), file...), line{at(300), "s"})
	acc, _ = session(store.Cursor{}, read)
	want = append(append([]line{}, file...), line{at(300), "s"})
	if got := accepted(read, acc); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a file with its last line out of order served again: accepted\n%v\nwant\n%v", got, want)
	}
}
