package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// judge sums what each place the lines are read from (a replica's API, the
// mirror files) made of every run's lines.
type judge struct {
	sources []string
	sums    map[string]*harness.LineTally
	// failures name each run a source got wrong, with how.
	failures []string
}

// add records what source made of run's lines.
func (j *judge) add(source, run string, n harness.LineTally) {
	if j.sums == nil {
		j.sums = map[string]*harness.LineTally{}
	}
	s, ok := j.sums[source]
	if !ok {
		s = &harness.LineTally{Misplaced: -1}
		j.sums[source] = s
		j.sources = append(j.sources, source)
	}
	s.Want += n.Want
	s.Got += n.Got
	s.Lost += n.Lost
	s.Duplicated += n.Duplicated
	s.Foreign += n.Foreign
	if !n.Once() {
		s.Misplaced = max(s.Misplaced, 0)
		j.failures = append(j.failures, fmt.Sprintf("%s, run %s: %s", source, run, n))
	}
}

// ok reports whether every source held every run's lines once, in order.
func (j *judge) ok() bool { return len(j.failures) == 0 && len(j.sources) > 0 }

// print writes a line per source and each failure.
func (j *judge) print(w io.Writer) {
	for _, s := range j.sources {
		n := j.sums[s]
		verdict := "each once, in order"
		if !n.Once() {
			verdict = "NOT each once, in order"
		}
		fmt.Fprintf(w, "  %-14s %7d lines written, %7d read: %d lost, %d stored twice or more, %d nobody wrote; %s\n", s, n.Want, n.Got, n.Lost, n.Duplicated, n.Foreign, verdict)
	}
	for _, f := range slices.Sorted(slices.Values(j.failures)) {
		fmt.Fprintln(w, "  FAIL", f)
	}
}
