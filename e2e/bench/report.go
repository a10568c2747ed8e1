package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// admissionReport turns the cells into ratios to the baseline of the same
// round and concurrency, medians over the rounds: the machine's own speed
// drifts between rounds (a shared VM), a ratio in one round does not.
type admissionReport struct {
	cells  []cell
	levels []int
	rounds int
	// starts: per scenario, each round's create → pod Running latencies.
	starts map[string][][]time.Duration
	startN int
	// unsuspended: queued runs' create → unsuspend admitted.
	unsuspended []time.Duration
}

// startPct is the median over rounds of the p-quantile of a scenario's
// create → pod Running latencies.
func (r admissionReport) startPct(s string, p float64) float64 {
	var vs []float64
	for _, lat := range r.starts[s] {
		vs = append(vs, float64(pctOf(lat, p)))
	}
	return median(vs)
}

// startOverBaseline is the median over rounds of a scenario's p50 less the
// baseline's p50 of the same round.
func (r admissionReport) startOverBaseline(s string) float64 {
	var vs []float64
	for round := range min(len(r.starts[s]), len(r.starts[scBaseline])) {
		vs = append(vs, float64(pctOf(r.starts[s][round], 0.5)-pctOf(r.starts[scBaseline][round], 0.5)))
	}
	return median(vs)
}

func (r admissionReport) find(s string, conc, round int) *cell {
	for i := range r.cells {
		c := &r.cells[i]
		if c.scenario == s && c.conc == conc && c.round == round {
			return c
		}
	}
	return nil
}

// ratio is the median over rounds of f(scenario cell) / f(reference cell).
func (r admissionReport) ratio(s, ref string, conc int, f func(cell) float64) float64 {
	var rs []float64
	for round := range r.rounds {
		a, b := r.find(s, conc, round), r.find(ref, conc, round)
		if a == nil || b == nil || f(*b) == 0 {
			continue
		}
		rs = append(rs, f(*a)/f(*b))
	}
	return median(rs)
}

// abs is the median over rounds of f of the scenario's cells.
func (r admissionReport) abs(s string, conc int, f func(cell) float64) float64 {
	var vs []float64
	for round := range r.rounds {
		if c := r.find(s, conc, round); c != nil {
			vs = append(vs, f(*c))
		}
	}
	return median(vs)
}

func p50(c cell) float64 { return float64(c.pct(0.50)) }
func p99(c cell) float64 { return float64(c.pct(0.99)) }
func tput(c cell) float64 {
	return c.throughput()
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r admissionReport) print(w io.Writer, n int) {
	fmt.Fprintf(w, "\n### Job creation: %d suspended Jobs per cell, %d interleaved rounds, medians over rounds\n\n", n, r.rounds)
	fmt.Fprintln(w, "| scenario | concurrency | p50 | p99 | Jobs/s | p50 / baseline | p99 / baseline | Jobs/s / baseline |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, conc := range r.levels {
		for _, s := range scenarioOrder {
			fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f | %.2f× | %.2f× | %.2f× |\n", scenarioLabels[s], conc,
				msf(r.abs(s, conc, p50)), msf(r.abs(s, conc, p99)), r.abs(s, conc, tput),
				r.ratio(s, scBaseline, conc, p50), r.ratio(s, scBaseline, conc, p99), r.ratio(s, scBaseline, conc, tput))
		}
	}

	if len(r.starts) > 0 {
		fmt.Fprintf(w, "\n### Create → agent pod Running: %d Jobs of new agents one after another per scenario and round (kwok pods), medians over rounds\n\n", r.startN)
		fmt.Fprintln(w, "| scenario | p50 | p99 | p50 − baseline p50 |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, s := range scenarioOrder {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", scenarioLabels[s], msf(r.startPct(s, 0.5)), msf(r.startPct(s, 0.99)), msf(r.startOverBaseline(s)))
		}
		if len(r.unsuspended) > 0 {
			fmt.Fprintf(w, "\nOf the queued runs' way, clipjob's part (create → its unsuspend admitted, all rounds): p50 %s, p99 %s.\n",
				msf(float64(pctOf(r.unsuspended, 0.5))), msf(float64(pctOf(r.unsuspended, 0.99))))
		}
	}

	fmt.Fprintln(w, "\n### Targets (ratios from the same rounds)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, conc := range r.levels {
		target(w, fmt.Sprintf("mutating only: p50 no worse than the MAP equivalent at c=%d", conc),
			r.ratio(scMutating, scMAP, conc, p50), 1.0, "× the MAP's p50", true)
	}
	for _, s := range []string{scQueued, scCompiledBoth, scCompiled} {
		for _, conc := range r.levels {
			target(w, fmt.Sprintf("%s: p50 ≤ 1.3× baseline at c=%d", scenarioLabels[s], conc),
				r.ratio(s, scBaseline, conc, p50), 1.3, "×", true)
		}
		if slices.Contains(r.levels, 50) {
			target(w, scenarioLabels[s]+": throughput ≥ 0.8× baseline at c=50", r.ratio(s, scBaseline, 50, tput), 0.8, "×", false)
		}
	}
	if len(r.starts) > 0 {
		for _, s := range []string{scQueued, scCompiledBoth, scCompiled, scBoth} {
			target(w, fmt.Sprintf("%s: create → pod Running p50 ≤ baseline + 50 ms", scenarioLabels[s]),
				r.startOverBaseline(s)/float64(time.Millisecond), 50, " ms over", true)
		}
	}
	if slices.Contains(r.levels, 1) {
		target(w, "mutating only: p50 ≤ 1.2× baseline at c=1", r.ratio(scMutating, scBaseline, 1, p50), 1.2, "×", true)
		target(w, "both + claim: p50 ≤ 2× baseline at c=1", r.ratio(scBoth, scBaseline, 1, p50), 2, "×", true)
	}
	if slices.Contains(r.levels, 10) {
		target(w, "both + claim: p50 ≤ 2.5× baseline at c=10", r.ratio(scBoth, scBaseline, 10, p50), 2.5, "×", true)
	}
	if slices.Contains(r.levels, 50) {
		target(w, "mutating only: throughput ≥ 0.85× baseline at c=50", r.ratio(scMutating, scBaseline, 50, tput), 0.85, "×", false)
		target(w, "both + claim: throughput ≥ 0.5× baseline at c=50", r.ratio(scBoth, scBaseline, 50, tput), 0.5, "×", false)
		for _, hook := range []string{"mutate", "validate"} {
			var worst float64
			for round := range r.rounds {
				if c := r.find(scBoth, 50, round); c != nil {
					worst = max(worst, c.webhookObs.histogram("clipjob_admission_duration_seconds", map[string]string{"webhook": hook}).quantileBound(0.99))
				}
			}
			target(w, fmt.Sprintf("handler time p99 < 5 ms at c=50 (%s, clipjob's histogram; bucket bound, worst round)", hook),
				worst*1000, 5, " ms", true)
		}
	}

	conc := r.levels[len(r.levels)-1]
	fmt.Fprintf(w, "\n### Where the time goes: both + claim at c=%d, as the API server measured it (means, median over rounds)\n\n", conc)
	fmt.Fprintln(w, "| what | mean |")
	fmt.Fprintln(w, "|---|---|")
	mean := func(from func(cell) scrapeDelta, name string, match map[string]string) float64 {
		return r.abs(scBoth, conc, func(c cell) float64 { return from(c).histogram(name, match).mean() * 1000 })
	}
	apis := func(c cell) scrapeDelta { return c.apiserver }
	hook := func(c cell) scrapeDelta { return c.webhookObs }
	rows := []struct {
		what string
		v    float64
	}{
		{"Job create, whole request", mean(apis, "apiserver_request_duration_seconds", map[string]string{"resource": "jobs", "verb": "POST"})},
		{"mutating webhook call (API server's side)", mean(apis, "apiserver_admission_webhook_admission_duration_seconds", map[string]string{"type": "admit"})},
		{"validating webhook call (API server's side)", mean(apis, "apiserver_admission_webhook_admission_duration_seconds", map[string]string{"type": "validating"})},
		{"clipjob mutate handler", mean(hook, "clipjob_admission_duration_seconds", map[string]string{"webhook": "mutate"})},
		{"clipjob validate handler", mean(hook, "clipjob_admission_duration_seconds", map[string]string{"webhook": "validate"})},
		{"claim Lease create (API server)", mean(apis, "apiserver_request_duration_seconds", map[string]string{"resource": "leases", "verb": "POST"})},
		{"PVC get (API server)", mean(apis, "apiserver_request_duration_seconds", map[string]string{"resource": "persistentvolumeclaims", "verb": "GET"})},
		{"Secret get (API server)", mean(apis, "apiserver_request_duration_seconds", map[string]string{"resource": "secrets", "verb": "GET"})},
	}
	for _, row := range rows {
		if math.IsNaN(row.v) {
			fmt.Fprintf(w, "| %s | none made |\n", row.what)
			continue
		}
		fmt.Fprintf(w, "| %s | %.2f ms |\n", row.what, row.v)
	}
}

// target prints one target row: the measured value, the bound and whether
// it is met (below the bound when lowerIsBetter, else above).
func target(w io.Writer, what string, got, bound float64, unit string, lowerIsBetter bool) {
	met := got <= bound
	if !lowerIsBetter {
		met = got >= bound
	}
	verdict := "met"
	if !met || math.IsNaN(got) {
		verdict = "**missed**"
	}
	cmp := "≤"
	if !lowerIsBetter {
		cmp = "≥"
	}
	fmt.Fprintf(w, "| %s | %.2f%s (target %s %.2f%s) | %s |\n", what, got, unit, cmp, bound, unit, verdict)
}

func msf(ns float64) string { return fmt.Sprintf("%.1f ms", ns/float64(time.Millisecond)) }
