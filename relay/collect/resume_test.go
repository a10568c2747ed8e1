package collect

import (
	"fmt"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// session feeds timestamps to a resume from c and returns the accepted
// indexes and the final cursor.
func session(c store.Cursor, ts []time.Time) ([]int, store.Cursor) {
	r := newResume(c)
	var got []int
	for i, x := range ts {
		if r.accept(x) {
			got = append(got, i)
		}
	}
	return got, r.cur
}

func TestResumeSkipsExactlyWhatIsStored(t *testing.T) {
	// The log: three lines share one timestamp, mid-second.
	log := []time.Time{at(100), at(200), at(200), at(200), at(700), at(1300), at(1300)}
	for stop := 0; stop <= len(log); stop++ {
		t.Run(fmt.Sprintf("stored %d lines", stop), func(t *testing.T) {
			first, cur := session(store.Cursor{}, log[:stop])
			if len(first) != stop {
				t.Fatalf("fresh session accepted %d of %d", len(first), stop)
			}
			// Reconnect: the API replays from the second of the cursor.
			since := cur.SinceTime()
			var replay []time.Time
			for _, x := range log {
				if !x.Before(since) {
					replay = append(replay, x)
				}
			}
			second, _ := session(cur, replay)
			var got []time.Time
			for _, i := range second {
				got = append(got, replay[i])
			}
			want := log[stop:]
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("after resume accepted %v, want %v", got, want)
			}
		})
	}
}

func TestResumeAcrossTwoBreaksInOneSecond(t *testing.T) {
	log := []time.Time{at(10), at(10), at(20), at(20), at(20), at(30)}
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
	ts, msg, err := splitTimestamp([]byte(`2026-11-21T10:00:05.123456789Z {"type":"system"}`))
	if err != nil || ts.Nanosecond() != 123456789 || string(msg) != `{"type":"system"}` {
		t.Errorf("got %v %q %v", ts, msg, err)
	}
	ts, msg, err = splitTimestamp([]byte(`2026-11-21T10:00:05Z `))
	if err != nil || len(msg) != 0 || !ts.Equal(t0) {
		t.Errorf("empty line: %v %q %v", ts, msg, err)
	}
	for _, bad := range []string{"", "no-timestamp here", "2026-13-45T00:00:00Z x"} {
		if _, _, err := splitTimestamp([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestResumeWithOutOfOrderTimestamps: a runtime can write a line stamped
// earlier after one stamped later (stdout and stderr race for the file).
// The cursor must not move back, or the resume stores the later line again.
func TestResumeWithOutOfOrderTimestamps(t *testing.T) {
	log := []time.Time{at(10), at(30), at(20), at(40)}
	_, cur := session(store.Cursor{}, log[:3]) // stored: 10, 30, 20
	if cur.TS != at(30).UnixNano() {
		t.Fatalf("cursor moved back to %v", time.Unix(0, cur.TS))
	}
	acc, _ := session(cur, log)
	if len(acc) != 1 || acc[0] != 3 {
		t.Errorf("resume accepted %v, want only the 4th line", acc)
	}
}

// TestResumeSkipsAFileTheKubeletServesAgain: a kubelet that renames a
// rotated log back (the runtime could not reopen it: the container was
// exiting) serves the file again from its start within the same stream.
// Lines the session stored, the one at its cursor's timestamp among them,
// are stored once.
func TestResumeSkipsAFileTheKubeletServesAgain(t *testing.T) {
	log := []time.Time{at(100), at(200), at(300), at(15000), at(15000), at(15100)}
	for stop := 0; stop < len(log); stop++ {
		t.Run(fmt.Sprintf("stored %d lines", stop), func(t *testing.T) {
			_, cur := session(store.Cursor{}, log[:stop])
			// The session reads from the cursor's second (as the API
			// serves it), then the whole file again, then a line written
			// after.
			var again []time.Time
			for _, x := range log {
				if !x.Before(cur.SinceTime()) {
					again = append(again, x)
				}
			}
			again = append(append(again, log...), at(16000))
			acc, _ := session(cur, again)
			var got []time.Time
			for _, i := range acc {
				got = append(got, again[i])
			}
			want := append(append([]time.Time{}, log[stop:]...), at(16000))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("accepted %v, want %v", got, want)
			}
		})
	}
}

// TestResumeKeepsLinesOutOfOrder: what tells a file served again apart
// must not take a runtime's out-of-order lines for one: a second line
// stamped before the first, and a line stamped 11 ms late behind a flood
// of 2,000 lines, are both stored.
func TestResumeKeepsLinesOutOfOrder(t *testing.T) {
	if acc, _ := session(store.Cursor{}, []time.Time{at(300), at(200), at(400)}); len(acc) != 3 {
		t.Errorf("a second line stamped before the first: accepted %v of 3", acc)
	}
	var flood []time.Time
	for i := range 2000 {
		flood = append(flood, t0.Add(time.Duration(i)*10*time.Microsecond))
	}
	late := append(flood, flood[len(flood)-1].Add(-11*time.Millisecond))
	if acc, _ := session(store.Cursor{}, late); len(acc) != len(late) {
		t.Errorf("a line 11 ms late behind a flood: accepted %d of %d", len(acc), len(late))
	}
}
