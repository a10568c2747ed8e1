package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func marksAt(base time.Time, ms ...int) runMarks {
	at := func(i int) time.Time { return base.Add(time.Duration(ms[i]) * time.Millisecond) }
	return runMarks{path: "p", created: at(0), started: at(1), job: at(2), pod: at(3), bound: at(4), written: at(5), inPaperclip: at(6), finished: at(7)}
}

func TestStagesAddUpToTheFirstLine(t *testing.T) {
	m := marksAt(time.Unix(1000, 0), 0, 40, 90, 100, 130, 700, 950, 3000)
	st, err := stages(m)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{40, 50, 10, 30, 570, 250}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(st, want) {
		t.Fatalf("stages %v, want %v", st, want)
	}
	var sum time.Duration
	for _, d := range st {
		sum += d
	}
	if sum != m.firstLine() || m.firstLine() != 950*time.Millisecond {
		t.Errorf("stages add up to %v, the first line came after %v", sum, m.firstLine())
	}
	if len(st) != len(stageNames) {
		t.Errorf("%d stages, %d names", len(st), len(stageNames))
	}
}

func TestStagesRefuseARunNotSeenWhole(t *testing.T) {
	m := marksAt(time.Unix(1000, 0), 0, 40, 90, 100, 130, 700, 950, 3000)
	m.bound = time.Time{}
	if _, err := stages(m); err == nil || !strings.Contains(err.Error(), "pod bound") {
		t.Fatalf("a run with no bound mark: %v, want an error naming it", err)
	}
}

func TestMedianDuration(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5}, 5},
		{[]time.Duration{9, 1, 5}, 5},
		{[]time.Duration{4, 1, 3, 2}, 2}, // (2+3)/2, truncated
		{[]time.Duration{10, 20}, 15},
	} {
		if got := medianDuration(c.in); got != c.want {
			t.Errorf("medianDuration(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestStampOf(t *testing.T) {
	at, ok := stampOf(`[paperclip] Pod running: x` + "\n" + `{"type":"system","subtype":"init","written_at":"2026-11-30T05:10:00.123456789Z"}` + "\n")
	if !ok || !at.Equal(time.Date(2026, 11, 30, 5, 10, 0, 123456789, time.UTC)) {
		t.Errorf("stampOf: %v %v", at, ok)
	}
	if _, ok := stampOf(`{"type":"assistant"}`); ok {
		t.Error("a line with no written_at has a stamp")
	}
}

func TestPaperclipReportComparesWithTheReference(t *testing.T) {
	base := time.Unix(1000, 0)
	var ours, seed pathReport
	ours.key, ours.label = "clipjob", "clipjob"
	seed.key, seed.label = "file", "seed"
	for i := range 10 {
		m := marksAt(base, 0, 40, 90, 100, 130, 700, 750+i*10, 2000)
		m.shown = m.written.Add(600 * time.Millisecond)
		ours.runs = append(ours.runs, m)
		seed.runs = append(seed.runs, marksAt(base, 0, 40, 60, 70, 100, 700, 1700+i*100, 4000))
	}
	var b bytes.Buffer
	paperclipReport(&b, []pathReport{ours, seed}, "file", "1.00, 1.00, 1.00", "2.00, 2.00, 2.00")
	out := b.String()
	for _, want := range []string{
		"| clipjob | 10 | 795 ms | 840 ms | 840 ms | -1355 ms | 2000 ms |",
		"| seed | 10 | 2150 ms | 2600 ms | 2600 ms | +0 ms | 4000 ms |",
		"| clipjob adds at most 100 ms to the p50 (vs seed) | -1355.00 ms (target ≤ 100.00 ms) | met |",
		"| log path: → the line in Paperclip's run log | 95 ms | 1450 ms |",
		"before: 1.00, 1.00, 1.00; after: 2.00, 2.00, 2.00",
		"median: clipjob +600 ms (10 runs), seed +0 ms (0 runs).",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}
