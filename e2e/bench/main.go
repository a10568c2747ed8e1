// Command bench is the load half of `make bench`. On a local control plane
// (package cluster) it measures
//
//   - Job creation in four scenarios users compare: no admission (the
//     client sends the complete Job), clipjob's mutating webhook alone,
//     both webhooks with the claim, and the same static mutation as a
//     built-in MutatingAdmissionPolicy (examples/map-equivalent.yaml), at
//     each concurrency, in interleaved rounds, as ratios to the baseline of
//     the same round;
//   - the relay at fleet scale (see relay.go);
//   - the fleet on PostgreSQL: three relay replicas, one killed mid-flood
//     (see fleet.go);
//   - what the user feels: a real Paperclip server running agents on the
//     real node through clipjob and, interleaved, through the seed
//     adapter's complete Jobs, from the wake to the first line in
//     Paperclip's run log (see paperclip.go).
//
// It prints Markdown tables with each target beside its figure, for
// docs/benchmarks.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

func main() {
	n := flag.Int("n", 300, "Jobs per cell")
	conc := flag.String("c", "1,10,50", "client concurrency levels")
	rounds := flag.Int("rounds", 3, "interleaved rounds of every cell")
	only := flag.String("only", "paperclip,admission,relay,fleet", "parts to run")
	pcRuns := flag.Int("pc-runs", 50, "paperclip: runs per path (clipjob and each baseline), interleaved")
	pcAgents := flag.Int("pc-agents", 2, "paperclip: agents per path, woken in turn")
	pcBaselines := flag.String("pc-baselines", "file,api", "paperclip: the seed adapter's ways of reading the log to compare with: file (its tail of the tee'd file, the first is the reference), api (the Kubernetes log API)")
	fleetSizes := flag.String("runs", "200,500", "relay: concurrent runs per fleet")
	pgSizes := flag.String("fleet-runs", "1000", "fleet: concurrent runs over three relay replicas on PostgreSQL, one measurement per size")
	flood := flag.Int("flood", 2000, "relay: lines each run writes as fast as it can")
	starts := flag.Int("starts", 30, "admission: Jobs per scenario and round timed from create to the agent pod Running")
	memLimit := flag.String("relay-memlimit", "", "relay: the relay's soft memory limit, passed to it as $GOMEMLIMIT (e.g. 96MiB; default none: the relay sets one only from $CLIPJOB_RELAY_MEMORY_LIMIT, which the chart sets)")
	flag.Parse()
	levels, err := ints(*conc)
	var sizes, pgRuns []int
	if err == nil {
		sizes, err = ints(*fleetSizes)
	}
	if err == nil {
		pgRuns, err = ints(*pgSizes)
	}
	if err == nil && *memLimit != "" && !memLimitSyntax.MatchString(*memLimit) {
		err = fmt.Errorf("-relay-memlimit %q: want a number of bytes with an optional unit B, KiB, MiB, GiB or TiB, as $GOMEMLIMIT", *memLimit)
	}
	if err == nil && strings.Contains(*only, "paperclip") {
		// A control plane of its own, with the real node: the other parts
		// run on kwok.
		if err = paperclipBench(context.Background(), *pcRuns, *pcAgents, strings.Split(*pcBaselines, ",")); err != nil {
			err = fmt.Errorf("the Paperclip part: %w", err)
		}
	}
	if err == nil && (strings.Contains(*only, "admission") || strings.Contains(*only, "relay") || strings.Contains(*only, "fleet")) {
		err = run(*n, levels, *rounds, *only, sizes, pgRuns, *flood, *starts, *memLimit)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func ints(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", list, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// memLimitSyntax is what the Go runtime accepts in $GOMEMLIMIT (besides
// "off"); a relay given anything else would not start.
var memLimitSyntax = regexp.MustCompile(`^[0-9]+(B|KiB|MiB|GiB|TiB)?$`)

func run(n int, levels []int, rounds int, only string, sizes, pgRuns []int, flood, starts int, relayMemLimit string) error {
	ctx := context.Background()
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Log: os.Stderr})
	if err != nil {
		return err
	}
	defer c.Stop()
	ports, err := cluster.FreePorts(1)
	if err != nil {
		return err
	}
	webhookPprof := fmt.Sprintf("127.0.0.1:%d", ports[0])
	in, err := harness.InstallCluster(ctx, c, "webhook", "", "--pprof-bind-address", webhookPprof)
	if err != nil {
		return err
	}
	wh := in.Webhook
	defer wh.Stop()
	cfg := *c.Config
	cfg.QPS, cfg.Burst = 5000, 5000
	cs := kubernetes.NewForConfigOrDie(&cfg)
	fmt.Printf("# make bench: kube-apiserver %s on loopback, %d CPUs, %s\n", version(cs), runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"))

	if strings.Contains(only, "relay") {
		// First: the admission half leaves thousands of suspended Jobs the
		// Job controller works through for minutes, and the fleet's pods
		// would wait behind them. The fleet's Jobs come complete: no
		// webhook is called.
		if err := (&admissionBench{cs: cs}).clear(ctx); err != nil {
			return err
		}
		// The relay inherits the bench's environment; the cluster, started
		// above, does not see the limit.
		if relayMemLimit != "" {
			fmt.Printf("# relay: GOMEMLIMIT=%s (-relay-memlimit)\n", relayMemLimit)
			os.Setenv("GOMEMLIMIT", relayMemLimit)
		}
		err := relayBench(ctx, c, cs, sizes, flood)
		if relayMemLimit != "" {
			os.Unsetenv("GOMEMLIMIT")
		}
		if err != nil {
			return err
		}
	}
	if strings.Contains(only, "fleet") {
		// Before admission too, for the same reason.
		if err := (&admissionBench{cs: cs}).clear(ctx); err != nil {
			return err
		}
		if err := fleetBench(ctx, c, cs, pgRuns, flood); err != nil {
			return err
		}
	}
	if strings.Contains(only, "admission") {
		b, err := newAdmissionBench(cs, wh, c.CA.CertPEM, n)
		if err != nil {
			return err
		}
		b.pprofAddr, b.profileFile = webhookPprof, filepath.Join(c.Dir, "webhook.cpu.pprof")
		if err := b.sameMutation(ctx); err != nil {
			return err
		}
		rep := admissionReport{levels: levels, rounds: rounds, starts: map[string][][]time.Duration{}, startN: starts}
		// Create → pod running first, every round: the creation cells
		// leave thousands of suspended Jobs the Job controller works
		// through for minutes, and a new Job's pod would wait behind them.
		for round := range rounds {
			for i := range scenarioOrder {
				s := scenarioOrder[(i+round)%len(scenarioOrder)]
				lat, err := b.startLatency(ctx, s, round, starts)
				if err != nil {
					return fmt.Errorf("%s, create to pod running, round %d: %w", s, round, err)
				}
				rep.starts[s] = append(rep.starts[s], lat)
				fmt.Fprintf(os.Stderr, "bench: round %d %-9s create → pod running p50 %s\n", round, s, msf(float64(pctOf(lat, 0.5))))
			}
		}
		for round := range rounds {
			for _, conc := range levels {
				for i := range scenarioOrder {
					s := scenarioOrder[(i+round)%len(scenarioOrder)]
					// The webhook's CPU profile: both webhooks, the highest
					// concurrency, the last round.
					b.profile = s == scBoth && conc == levels[len(levels)-1] && round == rounds-1
					cl, err := b.run(ctx, s, conc, round)
					if err != nil {
						return fmt.Errorf("%s at c=%d, round %d: %w", s, conc, round, err)
					}
					fmt.Fprintf(os.Stderr, "bench: round %d c=%d %-9s p50 %s  %.0f Jobs/s\n", round, conc, s, msf(p50(cl)), cl.throughput())
					rep.cells = append(rep.cells, cl)
				}
			}
		}
		if err := b.clear(ctx); err != nil {
			return err
		}
		rep.unsuspended = b.unsuspended
		rep.print(os.Stdout, n)
		if b.profileTop != "" {
			fmt.Printf("\nCPU profile of clipjob-webhook during both webhooks at c=%d (top, cumulative):\n\n```\n%s```\n", levels[len(levels)-1], b.profileTop)
		}
	}
	fmt.Printf("\n(bench took %s)\n", time.Since(start).Round(time.Second))
	return nil
}

func version(cs kubernetes.Interface) string {
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return "?"
	}
	return v.GitVersion
}
