package harness

import (
	"strings"
	"testing"
)

// TestTallyCountsWhatAStoreMadeOfTheLines: each way a store can get a
// run's lines wrong is counted as that and nothing else, and only lines
// stored once each, in the order written, pass.
func TestTallyCountsWhatAStoreMadeOfTheLines(t *testing.T) {
	want := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		name                      string
		got                       []string
		lost, dup, foreign, place int
	}{
		{name: "once, in order", got: []string{"a", "b", "c", "d"}, place: -1},
		{name: "one lost", got: []string{"a", "b", "d"}, lost: 1, place: 2},
		{name: "the tail lost", got: []string{"a", "b"}, lost: 2, place: 2},
		{name: "one stored twice", got: []string{"a", "b", "b", "c", "d"}, dup: 1, place: 2},
		{name: "one stored three times", got: []string{"a", "b", "c", "c", "c", "d"}, dup: 2, place: 3},
		{name: "a run resumed from an old cursor", got: []string{"a", "b", "c", "b", "c", "d"}, dup: 2, place: 3},
		{name: "lost and duplicated", got: []string{"a", "a", "c", "d"}, lost: 1, dup: 1, place: 1},
		{name: "a line nobody wrote", got: []string{"a", "b", "x", "c", "d"}, foreign: 1, place: 2},
		{name: "swapped", got: []string{"a", "c", "b", "d"}, place: 1},
		{name: "nothing stored", lost: 4, place: 0},
	} {
		n := Tally(c.got, want)
		if n.Lost != c.lost || n.Duplicated != c.dup || n.Foreign != c.foreign || n.Misplaced != c.place {
			t.Errorf("%s: lost %d, duplicated %d, foreign %d, misplaced at %d; want %d, %d, %d, %d", c.name, n.Lost, n.Duplicated, n.Foreign, n.Misplaced,
				c.lost, c.dup, c.foreign, c.place)
		}
		if n.Once() != (c.place < 0) {
			t.Errorf("%s: Once() is %v", c.name, n.Once())
		}
	}
}

// TestTallyOfALineWrittenTwice: a line an agent wrote twice is two lines
// to keep: one copy is not a loss of nothing, and two are not a duplicate.
func TestTallyOfALineWrittenTwice(t *testing.T) {
	want := []string{"x", "x", "y"}
	if n := Tally([]string{"x", "x", "y"}, want); !n.Once() || n.Duplicated != 0 {
		t.Errorf("both copies stored: %s", n)
	}
	if n := Tally([]string{"x", "y"}, want); n.Lost != 1 || n.Duplicated != 0 || n.Once() {
		t.Errorf("one copy stored: lost %d, duplicated %d", n.Lost, n.Duplicated)
	}
	if n := Tally([]string{"x", "x", "x", "y"}, want); n.Lost != 0 || n.Duplicated != 1 {
		t.Errorf("three copies stored: lost %d, duplicated %d", n.Lost, n.Duplicated)
	}
}

// TestTallySaysWhatWentWrong: the failure message names the lines lost
// and duplicated, and a line out of place by its index.
func TestTallySaysWhatWentWrong(t *testing.T) {
	if s := Tally([]string{"a", "a"}, []string{"a", "b"}).String(); !strings.Contains(s, `lost 1 ["b"]`) || !strings.Contains(s, `duplicated 1 ["a"]`) {
		t.Errorf("message %q does not name the lost and the duplicated line", s)
	}
	if s := Tally([]string{"b", "a"}, []string{"a", "b"}).String(); !strings.Contains(s, `line 0 is "b"`) {
		t.Errorf("message %q does not say where the order departs", s)
	}
}
