package main

import (
	"fmt"
	"io"
	"math"
	"time"
)

// The pure half of the Paperclip part (paperclip.go): where a run's time
// went, from the marks the bench collected, and the report.

// runMarks are the moments of one run, all on this machine's clock (the
// server, the API server, the node and the bench share it).
type runMarks struct {
	path string
	// created: Paperclip's run record made by the wake (its createdAt);
	// started: Paperclip started the run and called the adapter (its
	// startedAt).
	created, started time.Time
	// job, pod, bound: when the bench's watch saw the run's Job stored, its
	// pod created, and the pod bound to the node.
	job, pod, bound time.Time
	// written: when the agent wrote its first line (the fake agent's
	// written_at); inPaperclip: when Paperclip recorded that line in the
	// run's log (the record's ts, set as the adapter handed it over).
	written, inPaperclip time.Time
	// finished: Paperclip's finishedAt.
	finished time.Time
	// shown: when the watch saw the API server show the agent's container
	// started (the kubelet's status report): clipjob's relay follows a
	// container from then. Not a stage: the agent may write before it.
	shown time.Time
}

// stageNames name the stages stages returns, in order.
var stageNames = []string{
	"Paperclip: wake → run started, adapter called",
	"adapter: → Job stored (clipjob: its webhooks' admission included)",
	"Job controller: → pod created",
	"scheduler: → pod bound",
	"kubelet: → agent's first line written (sandbox, init containers, start)",
	"log path: → the line in Paperclip's run log",
}

// stages splits a run's time from the wake to its first line in
// Paperclip's log into stageNames, each from one mark to the next; they
// add up to firstLine. A missing mark is an error: the run was not seen
// whole.
func stages(m runMarks) ([]time.Duration, error) {
	marks := []struct {
		what string
		t    time.Time
	}{
		{"run created", m.created}, {"run started", m.started}, {"Job stored", m.job}, {"pod created", m.pod},
		{"pod bound", m.bound}, {"first line written", m.written}, {"first line in Paperclip", m.inPaperclip},
	}
	for _, mk := range marks {
		if mk.t.IsZero() {
			return nil, fmt.Errorf("%s: no mark for %q", m.path, mk.what)
		}
	}
	out := make([]time.Duration, 0, len(marks)-1)
	for i := 1; i < len(marks); i++ {
		out = append(out, marks[i].t.Sub(marks[i-1].t))
	}
	return out, nil
}

// firstLine is the time the user waits: from the wake to the agent's
// first line in Paperclip's run log.
func (m runMarks) firstLine() time.Duration { return m.inPaperclip.Sub(m.created) }

// pathReport is what the report says of one way of running agents.
type pathReport struct {
	key, label string
	runs       []runMarks
}

func (p pathReport) firstLines() []time.Duration {
	out := make([]time.Duration, 0, len(p.runs))
	for _, r := range p.runs {
		out = append(out, r.firstLine())
	}
	return out
}

func (p pathReport) finishes() []time.Duration {
	out := make([]time.Duration, 0, len(p.runs))
	for _, r := range p.runs {
		out = append(out, r.finished.Sub(r.created))
	}
	return out
}

// stageMedians is each stage's median over the path's runs.
func (p pathReport) stageMedians() []time.Duration {
	per := make([][]time.Duration, len(stageNames))
	for _, r := range p.runs {
		st, err := stages(r)
		if err != nil {
			continue
		}
		for i, d := range st {
			per[i] = append(per[i], d)
		}
	}
	out := make([]time.Duration, len(stageNames))
	for i := range per {
		out[i] = medianDuration(per[i])
	}
	return out
}

// medianDuration is the median (the mean of the middle two of an even
// count); 0 for none.
func medianDuration(ds []time.Duration) time.Duration {
	vs := make([]float64, len(ds))
	for i, d := range ds {
		vs[i] = float64(d)
	}
	m := median(vs)
	if math.IsNaN(m) {
		return 0
	}
	return time.Duration(m)
}

// paperclipReport prints the tables: ref is the path clipjob is compared
// with (the seed's file tail), the first path is clipjob's.
func paperclipReport(w io.Writer, paths []pathReport, ref string, loadBefore, loadAfter string) {
	fmt.Fprintf(w, "\n### What the user feels: from the wake to the agent's first line in Paperclip's run log\n\n")
	fmt.Fprintf(w, "Load average (1, 5, 15 min) before: %s; after: %s.\n\n", loadBefore, loadAfter)
	var refP50 time.Duration
	for _, p := range paths {
		if p.key == ref {
			refP50 = medianDuration(p.firstLines())
		}
	}
	fmt.Fprintln(w, "| path | runs | p50 | p99 | max | p50 − baseline p50 | wake → run finished, p50 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, p := range paths {
		fl := p.firstLines()
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s |\n", p.label, len(p.runs),
			msd(medianDuration(fl)), msd(pctOf(fl, 0.99)), msd(pctOf(fl, 1)), signedMs(medianDuration(fl)-refP50), msd(medianDuration(p.finishes())))
	}
	fmt.Fprintf(w, "\nWhere the time goes (each stage's median over the path's runs; the medians need not add up to the total's):\n\n")
	fmt.Fprint(w, "| stage |")
	for _, p := range paths {
		fmt.Fprintf(w, " %s |", p.label)
	}
	fmt.Fprint(w, "\n|---|")
	for range paths {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	meds := make([][]time.Duration, len(paths))
	for i, p := range paths {
		meds[i] = p.stageMedians()
	}
	for s, name := range stageNames {
		fmt.Fprintf(w, "| %s |", name)
		for i := range paths {
			fmt.Fprintf(w, " %s |", msd(meds[i][s]))
		}
		fmt.Fprintln(w)
	}

	fmt.Fprintf(w, "\nThe agent's container shown started by the API server (the kubelet's status report; clipjob's relay follows a container from then), after the agent wrote its first line, median:")
	for i, p := range paths {
		var ds []time.Duration
		for _, r := range p.runs {
			if !r.shown.IsZero() {
				ds = append(ds, r.shown.Sub(r.written))
			}
		}
		sep := ","
		if i == len(paths)-1 {
			sep = "."
		}
		fmt.Fprintf(w, " %s %s (%d runs)%s", p.label, signedMs(medianDuration(ds)), len(ds), sep)
	}
	fmt.Fprintln(w)

	if len(paths) < 2 {
		return
	}
	ours := paths[0]
	fmt.Fprintln(w, "\n| target | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, p := range paths[1:] {
		d := medianDuration(ours.firstLines()) - medianDuration(p.firstLines())
		target(w, fmt.Sprintf("clipjob adds at most 100 ms to the p50 (vs %s)", p.label), float64(d)/float64(time.Millisecond), 100, " ms", true)
		r := float64(pctOf(ours.firstLines(), 0.99)) / float64(pctOf(p.firstLines(), 0.99))
		target(w, fmt.Sprintf("clipjob faster at the p99 (vs %s)", p.label), r, 1, "× its p99", true)
	}
}

func msd(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func signedMs(d time.Duration) string {
	return fmt.Sprintf("%+.0f ms", float64(d)/float64(time.Millisecond))
}
