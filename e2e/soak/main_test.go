package main

import (
	"fmt"
	"testing"
)

func lines(ns ...int) []string {
	var out []string
	for _, n := range ns {
		out = append(out, fmt.Sprintf("line %d", n))
	}
	return out
}

func TestCompareLines(t *testing.T) {
	for _, c := range []struct {
		name           string
		texts          []string
		n              int
		lost, repeated int
		disordered     bool
	}{
		{"all once, in order", lines(1, 2, 3), 3, 0, 0, false},
		{"the tail lost", lines(1, 2), 3, 1, 0, false},
		{"a line in the middle lost", lines(1, 3), 3, 1, 0, false},
		{"a line twice", lines(1, 2, 2, 3), 3, 0, 1, false},
		{"a replay of the head", lines(1, 2, 3, 1, 2, 3), 3, 0, 3, false},
		{"out of order", lines(2, 1, 3), 3, 0, 0, true},
		{"a run cut short: a gapless head", lines(1, 2, 3), -1, 0, 0, false},
		{"a run cut short: a gap", lines(1, 2, 4), -1, 1, 0, false},
		{"a run cut short before its first line", nil, -1, 0, 0, false},
		{"other texts are not lines", append(lines(1), "thinking…"), 1, 0, 0, false},
	} {
		lost, repeated, disordered := compareLines(c.texts, c.n)
		if lost != c.lost || repeated != c.repeated || disordered != c.disordered {
			t.Errorf("%s: lost %d repeated %d out of order %v; want %d %d %v", c.name, lost, repeated, disordered, c.lost, c.repeated, c.disordered)
		}
	}
}
