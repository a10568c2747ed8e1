package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// The fleet on PostgreSQL: runs collected by three relay replicas that
// share one PostgreSQL server (a throwaway one, package pgtest), with one
// SSE client per run on replica (run mod 3), so two clients in three
// follow a run through a replica that does not collect it. The runs write
// at an agent's pace (relay.go's steady phase), then as fast as they can;
// once a third of that flood is stored one replica is killed with
// SIGKILL, and it is started again after the flood; as soon as the others
// have taken its runs, a second is frozen (SIGSTOP, a paused VM or a node
// under pressure) until the last one has taken its runs too, then thawed
// mid-flood. Every line is then checked at every
// client and in the store: a line lost or stored twice fails the bench.
const (
	fleetSchema  = "clipjob_relay" // the relays' default --postgres-schema
	fleetVictim  = 1               // the replica killed mid-flood
	fleetFrozen  = 2               // the replica frozen mid-flood, once the kill's runs are taken
	fleetTail    = 10              // lines per run written once the killed replica is back
	killFraction = 3               // the kill comes once 1/killFraction of the flood is stored
)

var fleetIDs = []string{"r0", "r1", "r2"}

type replicaFigures struct {
	streams               float64 // open in the steady phase
	steadyRSS, steadyAnon float64 // MiB, peak during the steady phase
	peakRSS, peakAnon     float64 // MiB, peak during the flood (the killed one's until its death)
	floodCPU              float64 // seconds
}

type fleetPGResult struct {
	runs                   int
	replicas               []replicaFigures
	steadyLinesPerSec      float64
	latP50, latP99         time.Duration // every client, steady phase
	ownP50, ownP99         time.Duration // clients on the replica collecting the run
	otherP50, otherP99     time.Duration // clients on another replica
	ownN, otherN           int
	floodLines             int
	floodLinesPerSec       float64 // the whole flood, the kill and takeover included
	threeLinesPerSec       float64 // the flood before the kill: three replicas
	twoLinesPerSec         float64 // from the kill's takeover to the flood's end: two replicas, one while the second is frozen
	floodMiBPerSec         float64
	floodWall              time.Duration
	killedAfter            time.Duration // into the flood
	victimRuns             int
	takeover               time.Duration // kill → both survivors see two live replicas
	storedAfterKill        time.Duration // kill → every line the killed replica's runs wrote before it stored
	frozenAfter            time.Duration // into the flood; 0: the flood ended first
	frozenRuns             int
	frozenTakeover         time.Duration // freeze → r0 sees itself alone
	storedAfterFreeze      time.Duration // freeze → every line the frozen replica's runs wrote before it stored
	frozenBacklog          int64         // lines its runs had written and the store did not hold, at the freeze
	thawedRefused          int           // the thawed replica's commits the cursor check refused
	gapVictim, gapOther    time.Duration // longest a written line waited while no new line of its run reached its client
	gapVictimAt            time.Duration // when the killed replica's runs' longest gap began, after the kill
	gapFrozen, gapFrozenAt time.Duration // the frozen replica's runs', and when it began after the freeze
	rejoined               time.Duration // restart → three replicas collecting
	missing, duplicated    int           // at the SSE clients
	storeShort, storeExtra int           // in the store: lines written not stored, stored beyond written
	storedLines            int64
	storedBytes            int64 // the lines' text
	pgDB, pgLines, pgOther int64 // bytes: the database, the lines table, runs + cursors + mirror
	pgSteadyPSS, pgPeakPSS float64
	pgFloodCPU             float64
	floodCPU               map[string]float64 // the other processes
	// steadyCPU: every process's CPU seconds over the steady phase
	// (steadyWall, from its first line to its last stored).
	steadyCPU  map[string]float64
	steadyWall time.Duration
	// steadyProfile, floodProfile: the top of r0's CPU profile in the
	// steady phase and over the flood's first 20 s (-fleet-profile).
	steadyProfile, floodProfile string
	// r0's commits in the flood: its lines, its appends (a stream's
	// lines and cursor), its transactions.
	r0Lines, r0Appends, r0Commits float64
}

func fleetBench(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, sizes []int, floodPerRun int) error {
	kit, err := newRelayKit(ctx, c, slices.Max(sizes))
	if err != nil {
		return err
	}
	var results []fleetPGResult
	var broken []string
	for _, n := range sizes {
		r, err := fleetOnPostgres(ctx, c, cs, kit, n, floodPerRun)
		if err != nil {
			return fmt.Errorf("fleet on PostgreSQL with %d runs: %w", n, err)
		}
		results = append(results, r)
		if r.missing+r.duplicated+r.storeShort+r.storeExtra > 0 {
			broken = append(broken, fmt.Sprintf("%d runs: %d lines lost and %d duplicated at the SSE clients, %d written but not stored and %d stored beyond those written",
				n, r.missing, r.duplicated, r.storeShort, r.storeExtra))
		}
	}
	printFleetPG(os.Stdout, results, floodPerRun)
	if len(broken) > 0 {
		return fmt.Errorf("LINES LOST OR DUPLICATED on PostgreSQL with a replica killed: %s", strings.Join(broken, "; "))
	}
	return nil
}

// fleetPGPool, when set, is each replica's pool of PostgreSQL connections
// (pool_max_conns in its connection string; the relay's default is
// pgxpool's, 4 on 2 cores): every commit and every read of a client's
// lines takes one.
var fleetPGPool = flag.Int("fleet-pg-pool", 0, "fleet: each replica's PostgreSQL connections (pool_max_conns; 0: the relay's default)")

// fleetProfile: the steady phase's CPU profile of replica r0, to see where
// a replica's time goes once the machine is busy.
var fleetProfile = flag.Bool("fleet-profile", false, "fleet: take a CPU profile of replica r0 over 10 s of the steady phase and 20 s of the flood, and print their tops")

// fleetProfileDir keeps the profiles, which the cluster's directory
// does not (it goes with the cluster).
var fleetProfileDir = flag.String("fleet-profile-dir", "", "fleet: where -fleet-profile writes its profiles (default: the cluster's directory, removed at the end)")

func profileDir(c *cluster.Cluster) string { return cmp.Or(*fleetProfileDir, c.Dir) }

func fleetOnPostgres(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, kit *relayKit, n, floodPerRun int) (fleetPGResult, error) {
	res := fleetPGResult{runs: n, replicas: make([]replicaFigures, len(fleetIDs))}
	name := fmt.Sprintf("fleet-%d", n)
	if err := waitNoAgentPods(ctx, cs); err != nil {
		return res, err
	}
	pg, err := pgtest.Start()
	if err != nil {
		return res, err
	}
	defer pg.Stop()
	db, err := pgx.Connect(ctx, pg.ConnString("postgres"))
	if err != nil {
		return res, err
	}
	defer db.Close(context.WithoutCancel(ctx))
	url := filepath.Join(c.Dir, name+".pgurl")
	conn := pg.ConnString("postgres")
	if *fleetPGPool > 0 {
		conn += fmt.Sprintf(" pool_max_conns=%d", *fleetPGPool)
		fmt.Fprintf(os.Stderr, "bench: fleet: %d PostgreSQL connections per replica\n", *fleetPGPool)
	}
	if err := os.WriteFile(url, []byte(conn), 0o600); err != nil {
		return res, err
	}

	relays := make([]*harness.Relay, len(fleetIDs))
	pprofs := make([]string, len(fleetIDs))
	defer func() {
		for _, rl := range relays {
			if rl != nil {
				rl.Stop()
			}
		}
	}()
	for i, id := range fleetIDs {
		ports, err := cluster.FreePorts(1)
		if err != nil {
			return res, err
		}
		pprofs[i] = fmt.Sprintf("127.0.0.1:%d", ports[0])
		// --max-streams: with one replica gone, the two left follow
		// half the runs each; with two gone, one follows them all.
		relays[i], err = harness.StartRelay(ctx, c, kit.bin, name+"-"+id, "paperclip", "--store", "postgres", "--postgres-url-file", url,
			"--replica-id", id,
			"--max-streams", strconv.Itoa(n+100), "--zap-log-level", "info", "--zap-time-encoding", "rfc3339nano", "--pprof-bind-address", pprofs[i])
		if err != nil {
			return res, err
		}
	}
	if err := waitCollecting(ctx, relays); err != nil {
		return res, err
	}

	fmt.Fprintf(os.Stderr, "bench: fleet: starting %d runs over %d replicas on PostgreSQL\n", n, len(relays))
	runs, err := startRuns(ctx, c, cs, kit.complete, name, n)
	if err != nil {
		return res, err
	}
	defer deleteRuns(context.WithoutCancel(ctx), cs, name)
	victimRuns := map[int]bool{}
	own := make([]bool, n) // run i's client is on the replica that collects it
	members, err := harness.ReadReplicas(ctx, db, fleetSchema)
	if err != nil {
		return res, fmt.Errorf("the relays' table of replicas: %w", err)
	}
	// By name, the newest row of each (rows come oldest renewal first).
	idOf := map[string]string{}
	for _, m := range members {
		idOf[m.Name] = m.ID
	}
	var ids []string
	names := map[string]string{}
	for _, name := range fleetIDs {
		ids, names[idOf[name]] = append(ids, idOf[name]), name
	}
	for i := range runs {
		owner := names[replicas.Pick(ids, runs[i].run)]
		own[i] = owner == fleetIDs[i%len(fleetIDs)]
		if owner == fleetIDs[fleetVictim] {
			victimRuns[i] = true
		}
	}
	res.victimRuns = len(victimRuns)

	followCtx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	lat := newLatencies(n, true)
	for i := range runs {
		var addrs []string
		for k := range relays {
			addrs = append(addrs, relays[(i+k)%len(relays)].APIAddr)
		}
		go follow(followCtx, kit.client, addrs, kit.token, runs[i].run, i, lat)
	}
	if err := connected(ctx, runs, lat, 5*time.Minute); err != nil {
		return res, err
	}

	fmt.Fprintf(os.Stderr, "bench: fleet: %d runs steady for %s\n", n, steadyFor)
	base, _, err := storedTotals(ctx, db)
	if err != nil {
		return res, err
	}
	rss := sampleReplicas(c, relays, pprofs, "steady")
	pgMem := samplePeak(pgPSS)
	var profiled <-chan string
	if *fleetProfile {
		profiled = profileCPU(pprofs[0], filepath.Join(profileDir(c), fmt.Sprintf("fleet-%d-r0-steady.cpu.pprof", n)), 10*time.Second)
	}
	steadyPG, steadyCPU, steadyStart := pgTicks(), cpuTicks(c.Dir), time.Now()
	written := writeSteady(ctx, runs)
	if err := waitStoredPG(ctx, db, base+int64(written), 2*time.Minute); err != nil {
		return res, err
	}
	res.steadyWall = time.Since(steadyStart)
	res.steadyCPU = cpuSeconds(steadyCPU, cpuTicks(c.Dir))
	res.steadyCPU["postgres"] = float64(pgTicks()-steadyPG) / 100
	if profiled != nil {
		res.steadyProfile = <-profiled
	}
	res.steadyLinesPerSec = float64(written) / steadyFor.Seconds()
	for i, rl := range relays {
		if m, err := httpMetrics(rl.MetricsAddr); err == nil {
			res.replicas[i].streams = m.gauge("clipjob_relay_streams_open", nil)
		}
	}
	time.Sleep(time.Second) // the last lines reach the SSE clients
	res.latP50, res.latP99, _ = lat.percentiles(nil)
	res.ownP50, res.ownP99, res.ownN = lat.percentiles(func(run int) bool { return own[run] })
	res.otherP50, res.otherP99, res.otherN = lat.percentiles(func(run int) bool { return !own[run] })
	for i, f := range rss {
		res.replicas[i].steadyRSS, res.replicas[i].steadyAnon, _, _ = f()
	}
	res.pgSteadyPSS = pgMem()

	fmt.Fprintf(os.Stderr, "bench: fleet: %d runs writing %d lines each as fast as they can; replica %s killed once a third is stored\n", n, floodPerRun, fleetIDs[fleetVictim])
	base, baseBytes, err := storedTotals(ctx, db)
	if err != nil {
		return res, err
	}
	rss = sampleReplicas(c, relays, pprofs, "flood")
	pgMem = samplePeak(pgPSS)
	relayTicks := make([]int64, len(relays))
	for i, rl := range relays {
		relayTicks[i] = procTicks(strconv.Itoa(rl.PID()), false)
	}
	pgTicksBefore, cpuBefore := pgTicks(), cpuTicks(c.Dir)
	r0Before, _ := httpMetrics(relays[0].MetricsAddr)
	if *fleetProfile {
		profiled = profileCPU(pprofs[0], filepath.Join(profileDir(c), fmt.Sprintf("fleet-%d-r0-flood.cpu.pprof", n)), 20*time.Second)
	}
	start := time.Now()
	flooding := make(chan int, 1)
	go func() { flooding <- writeFlood(runs, floodPerRun) }()
	target := int64(n * floodPerRun)
	if err := waitStoredPG(ctx, db, base+target/killFraction, 10*time.Minute); err != nil {
		return res, err
	}
	atKill, _, err := storedTotals(ctx, db)
	if err != nil {
		return res, err
	}
	victim := relays[fleetVictim]
	relayTicks[fleetVictim] = procTicks(strconv.Itoa(victim.PID()), false) - relayTicks[fleetVictim]
	writtenAtKill := map[string]int64{}
	for i := range victimRuns {
		writtenAtKill[runs[i].run] = runs[i].seq.Load()
	}
	killed := time.Now()
	victim.Kill()
	// The relays log in nanoseconds: when each survivor saw the victim
	// gone can be read against this.
	fmt.Fprintf(os.Stderr, "bench: fleet: replica %s killed at %s\n", fleetIDs[fleetVictim], killed.UTC().Format(time.RFC3339Nano))
	res.killedAfter = killed.Sub(start)
	res.threeLinesPerSec = float64(atKill-base) / res.killedAfter.Seconds()
	var atTakeover int64
	if res.takeover, atTakeover, err = waitSeen(ctx, db, []*harness.Relay{relays[0], relays[fleetFrozen]}, killed); err != nil {
		return res, err
	}
	refusedBefore, _ := relays[fleetFrozen].Counter("clipjob_relay_reconnects_total", `cause="refused"`)
	frozenRuns, writtenAtFreeze, frozen, err := freezeAfterKill(ctx, db, relays, ids, runs, start, &res)
	if err != nil {
		return res, err
	}
	kill, freeze := &struckRuns{struck: killed, written: writtenAtKill}, &struckRuns{struck: frozen, written: writtenAtFreeze}
	if err := waitRunsStored(ctx, db, kill, freeze); err != nil {
		return res, err
	}
	res.storedAfterKill, res.storedAfterFreeze = kill.stored, freeze.stored
	flooded := <-flooding
	floodWritten := time.Now()
	if err := waitStoredPG(ctx, db, base+int64(flooded), 15*time.Minute); err != nil {
		return res, err
	}
	res.floodWall = time.Since(start)
	if r0After, err := httpMetrics(relays[0].MetricsAddr); err == nil && r0Before != nil {
		lines := r0After.histogram("clipjob_relay_store_lag_seconds", nil).minus(r0Before.histogram("clipjob_relay_store_lag_seconds", nil))
		groups := r0After.histogram("clipjob_relay_store_appends_per_commit", nil).minus(r0Before.histogram("clipjob_relay_store_appends_per_commit", nil))
		res.r0Lines, res.r0Appends, res.r0Commits = float64(lines.count), groups.sum, float64(groups.count)
	}
	if profiled != nil {
		res.floodProfile = <-profiled
	}
	res.floodLines = flooded
	res.floodLinesPerSec = float64(flooded) / res.floodWall.Seconds()
	res.twoLinesPerSec = float64(base+int64(flooded)-atTakeover) / (res.floodWall - res.killedAfter - res.takeover).Seconds()
	cpu := cpuSeconds(cpuBefore, cpuTicks(c.Dir))
	delete(cpu, "clipjob-relay") // per replica below: the killed one's ticks died with it
	res.floodCPU = cpu
	res.pgFloodCPU = float64(pgTicks()-pgTicksBefore) / 100
	for i, rl := range relays {
		if i != fleetVictim {
			relayTicks[i] = procTicks(strconv.Itoa(rl.PID()), false) - relayTicks[i]
		}
		res.replicas[i].floodCPU = float64(relayTicks[i]) / 100
	}
	for i, f := range rss {
		res.replicas[i].peakRSS, res.replicas[i].peakAnon, _, _ = f()
	}
	res.pgPeakPSS = pgMem()
	_, bytesNow, err := storedTotals(ctx, db)
	if err != nil {
		return res, err
	}
	res.floodMiBPerSec = float64(bytesNow-baseBytes) / res.floodWall.Seconds() / (1 << 20)

	fmt.Fprintf(os.Stderr, "bench: fleet: replica %s back, then %d lines more per run\n", fleetIDs[fleetVictim], fleetTail)
	restarted := time.Now()
	if err := victim.Start(ctx); err != nil {
		return res, err
	}
	if err := waitCollecting(ctx, relays); err != nil {
		return res, err
	}
	res.rejoined = time.Since(restarted)
	want := make([]int64, n)
	total := int64(0)
	for i := range runs {
		if err := writeLines(&runs[i], fleetTail); err != nil {
			return res, err
		}
		want[i] = runs[i].seq.Load()
		total += want[i]
	}
	if err := waitStoredPG(ctx, db, total, 5*time.Minute); err != nil {
		return res, err
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return lat.allGot(want), nil
	}); err != nil {
		fmt.Fprintf(os.Stderr, "bench: fleet: not every client has its run's last line 3 minutes after it was stored\n")
	}
	time.Sleep(2 * time.Second) // a line delivered twice would arrive now
	refusedAfter, _ := relays[fleetFrozen].Counter("clipjob_relay_reconnects_total", `cause="refused"`)
	res.thawedRefused = int(refusedAfter - refusedBefore)
	res.missing, res.duplicated = lat.check(runs)
	if res.storeShort, res.storeExtra, err = checkStored(ctx, db, runs); err != nil {
		return res, err
	}
	struck := maps.Clone(victimRuns)
	maps.Copy(struck, frozenRuns)
	res.gapVictim, res.gapVictimAt = deliveryGap(lat, func(run int) bool { return victimRuns[run] }, start, floodWritten, killed)
	res.gapFrozen, res.gapFrozenAt = deliveryGap(lat, func(run int) bool { return frozenRuns[run] }, start, floodWritten, frozen)
	res.gapOther, _ = deliveryGap(lat, func(run int) bool { return !struck[run] }, start, floodWritten, start)
	stopFollowing()
	err = db.QueryRow(ctx, `SELECT pg_database_size(current_database()), pg_total_relation_size('`+fleetSchema+`.lines'),
		pg_total_relation_size('`+fleetSchema+`.runs') + pg_total_relation_size('`+fleetSchema+`.cursors') + pg_total_relation_size('`+fleetSchema+`.mirror'),
		(SELECT coalesce(sum(last_seq), 0)::bigint FROM `+fleetSchema+`.runs), (SELECT coalesce(sum(bytes), 0)::bigint FROM `+fleetSchema+`.runs)`).
		Scan(&res.pgDB, &res.pgLines, &res.pgOther, &res.storedLines, &res.storedBytes)
	return res, err
}

// waitNoAgentPods waits until the pods of earlier parts are gone: the
// replicas would see them too.
func waitNoAgentPods(ctx context.Context, cs kubernetes.Interface) error {
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cs.CoreV1().Pods("paperclip").List(ctx, metav1.ListOptions{LabelSelector: "paperclip.io/agent-id"})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("the agent pods of an earlier part are still there after 5 minutes: %w", err)
	}
	return nil
}

// waitCollecting waits until every relay collects and sees all of them
// live.
func waitCollecting(ctx context.Context, relays []*harness.Relay) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		for _, rl := range relays {
			live, err := rl.Counter("clipjob_relay_replicas ")
			collecting, err2 := rl.Counter("clipjob_relay_replica_collecting ")
			if err != nil || err2 != nil || int(live) != len(relays) || collecting != 1 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the %d replicas do not all collect, each seeing the others: %w", len(relays), err)
	}
	return nil
}

// waitSeen waits, after a replica was struck, until every survivor sees
// the survivors alone live (the takeover); atTakeover is the lines the
// store held then.
func waitSeen(ctx context.Context, db *pgx.Conn, survivors []*harness.Relay, struck time.Time) (takeover time.Duration, atTakeover int64, err error) {
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, rl := range survivors {
			if live, err := rl.Counter("clipjob_relay_replicas "); err != nil || int(live) != len(survivors) {
				return false, nil
			}
		}
		takeover = time.Since(struck)
		atTakeover, _, _ = storedTotals(ctx, db)
		return true, nil
	})
	if err != nil {
		err = fmt.Errorf("%d survivors do not each see %d live replicas %s after the strike: %w", len(survivors), len(survivors), time.Since(struck), err)
	}
	return takeover, atTakeover, err
}

// struckRuns are the lines each run of a struck replica had written when
// it was struck; stored is how long after the strike the store held them
// all (0: not yet).
type struckRuns struct {
	struck  time.Time
	written map[string]int64
	stored  time.Duration
}

// waitRunsStored waits until the store holds, for each strike, the lines
// its runs had written when it came, noting when it did. One connection
// polls for all: a pgx.Conn serves one query at a time.
func waitRunsStored(ctx context.Context, db *pgx.Conn, strikes ...*struckRuns) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		all := true
		for _, st := range strikes {
			if st.stored > 0 {
				continue
			}
			rows, err := db.Query(ctx, `SELECT id, last_seq FROM `+fleetSchema+`.runs WHERE id = ANY($1)`, slices.Collect(maps.Keys(st.written)))
			if err != nil {
				return false, nil
			}
			done := 0
			for rows.Next() {
				var id string
				var last int64
				if rows.Scan(&id, &last) == nil && last >= st.written[id] {
					done++
				}
			}
			rows.Close()
			if done == len(st.written) {
				st.stored = time.Since(st.struck)
			} else {
				all = false
			}
		}
		return all, nil
	})
	if err != nil {
		err = fmt.Errorf("the struck replicas' runs have not all stored the lines written before the strikes: %w", err)
	}
	return err
}

// backlog is how many of the lines in written the store does not hold.
func backlog(ctx context.Context, db *pgx.Conn, written map[string]int64) int64 {
	var stored int64
	_ = db.QueryRow(ctx, `SELECT coalesce(sum(last_seq), 0)::bigint FROM `+fleetSchema+`.runs WHERE id = ANY($1)`, slices.Collect(maps.Keys(written))).Scan(&stored)
	total := int64(0)
	for _, n := range written {
		total += n
	}
	return total - stored
}

// freezeAfterKill freezes replica fleetFrozen (SIGSTOP) as soon as the
// survivors of the kill have taken its runs, while both still have lines
// to store: replica r0 is then left alone with every run. It waits until
// r0 sees itself alone, thaws the frozen one, and returns the frozen
// replica's runs (its share between r0 and it), the lines each had
// written at the freeze, and when it was frozen. The thawed replica finds
// its row lapsed, joins again and takes its runs back; what it tried to
// commit from before the freeze is refused by the cursor check (counted
// from its log after the flood).
func freezeAfterKill(ctx context.Context, db *pgx.Conn, relays []*harness.Relay, ids []string, runs []fleetRun, start time.Time, res *fleetPGResult) (map[int]bool, map[string]int64, time.Time, error) {
	live := []string{ids[0], ids[fleetFrozen]}
	frozenRuns, written := map[int]bool{}, map[string]int64{}
	for i := range runs {
		if replicas.Pick(live, runs[i].run) == ids[fleetFrozen] {
			frozenRuns[i], written[runs[i].run] = true, runs[i].seq.Load()
		}
	}
	res.frozenRuns = len(frozenRuns)
	pid := relays[fleetFrozen].PID()
	frozen := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, nil, frozen, err
	}
	fmt.Fprintf(os.Stderr, "bench: fleet: replica %s frozen at %s\n", fleetIDs[fleetFrozen], frozen.UTC().Format(time.RFC3339Nano))
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	res.frozenAfter = frozen.Sub(start)
	res.frozenBacklog = backlog(ctx, db, written)
	var err error
	if res.frozenTakeover, _, err = waitSeen(ctx, db, relays[:1], frozen); err != nil {
		return nil, nil, frozen, err
	}
	return frozenRuns, written, frozen, syscall.Kill(pid, syscall.SIGCONT)
}

// storedTotals are the lines and bytes of text the store holds.
func storedTotals(ctx context.Context, db *pgx.Conn) (lines, bytes int64, err error) {
	err = db.QueryRow(ctx, `SELECT coalesce(sum(last_seq), 0)::bigint, coalesce(sum(bytes), 0)::bigint FROM `+fleetSchema+`.runs`).Scan(&lines, &bytes)
	return lines, bytes, err
}

// waitStoredPG waits until the store holds want lines.
func waitStoredPG(ctx context.Context, db *pgx.Conn, want int64, timeout time.Duration) error {
	var got int64
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		got, _, err = storedTotals(ctx, db)
		return err == nil && got >= want, nil
	})
	if err != nil {
		return fmt.Errorf("the store holds %d of %d lines after %s: %w", got, want, timeout, err)
	}
	return nil
}

// checkStored compares each run's stored lines with those written: its
// lines are numbered densely from 1, so a line lost or stored twice shows
// in the count.
func checkStored(ctx context.Context, db *pgx.Conn, runs []fleetRun) (short, extra int, err error) {
	stored := map[string]int64{}
	rows, err := db.Query(ctx, `SELECT id, last_seq FROM `+fleetSchema+`.runs`)
	if err != nil {
		return 0, 0, err
	}
	for rows.Next() {
		var id string
		var last int64
		if err := rows.Scan(&id, &last); err != nil {
			rows.Close()
			return 0, 0, err
		}
		stored[id] = last
	}
	rows.Close()
	for i := range runs {
		switch d := stored[runs[i].run] - runs[i].seq.Load(); {
		case d < 0:
			short -= int(d)
		case d > 0:
			extra += int(d)
		}
	}
	return short, extra, rows.Err()
}

// deliveryGap is, over the lines written from start to end, the longest
// time a written line of the runs in waited while no new line of its run
// reached the run's client: for consecutive lines, from the later of the
// first's arrival and the second's write to the second's arrival. And
// when that gap began, after since.
func deliveryGap(l *latencies, in func(run int) bool, start, end, since time.Time) (gap, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for run, arr := range l.arrivals {
		if !in(run) {
			continue
		}
		for i, a := range arr {
			prev, ok := arr[i-1]
			if !ok || a[0] < start.UnixNano() || a[0] >= end.UnixNano() {
				continue
			}
			from := max(prev[1], a[0])
			if g := time.Duration(a[1] - from); g > gap {
				gap, at = g, time.Unix(0, from).Sub(since)
			}
		}
	}
	return gap, at
}

// sampleReplicas samples each relay's resident memory (sampleRSS).
func sampleReplicas(c *cluster.Cluster, relays []*harness.Relay, pprofs []string, phase string) []func() (float64, float64, string, string) {
	var out []func() (float64, float64, string, string)
	for i, rl := range relays {
		out = append(out, sampleRSS(rl.PID(), pprofs[i], filepath.Join(c.Dir, fmt.Sprintf("fleet-%s-%s.heap.pprof", fleetIDs[i], phase))))
	}
	return out
}

// samplePeak samples f every 500 ms; the returned function stops and
// gives the largest.
func samplePeak(f func() float64) func() float64 {
	var peak float64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			peak = max(peak, f())
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		return peak
	}
}

// postgresPIDs are the PostgreSQL server this process started (pgtest)
// and its backends and workers.
func postgresPIDs() (main string, children []string) {
	self := strconv.Itoa(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	parents := map[string]string{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if comm, f := procStat(e.Name()); comm == "postgres" && len(f) > 1 {
			parents[e.Name()] = f[1]
		}
	}
	for pid, parent := range parents {
		if parent == self {
			main = pid
		}
	}
	for pid, parent := range parents {
		if main != "" && parent == main {
			children = append(children, pid)
		}
	}
	return main, children
}

// pgPSS is the PostgreSQL server's proportional resident memory, in MiB:
// its shared buffers counted once, not once per backend.
func pgPSS() float64 {
	main, children := postgresPIDs()
	if main == "" {
		return 0
	}
	var kib int64
	for _, pid := range append(children, main) {
		b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				kib += v
			}
		}
	}
	return float64(kib) / 1024
}

// pgTicks is the CPU time of the PostgreSQL server and its processes,
// ended ones included, in clock ticks.
func pgTicks() int64 {
	main, children := postgresPIDs()
	if main == "" {
		return 0
	}
	t := procTicks(main, true)
	for _, pid := range children {
		t += procTicks(pid, false)
	}
	return t
}

func printFleetPG(w io.Writer, rs []fleetPGResult, floodPerRun int) {
	lease, renew := relay.DefaultOptions().Replicas.LeaseDuration, relay.DefaultOptions().Replicas.RenewInterval
	fmt.Fprintf(w, "\n### The fleet on PostgreSQL (kwok pods with file logs, three relay replicas, one SSE client per run on replica run mod 3)\n\n")
	fmt.Fprintf(w, "Steady: each run writes %d-byte lines at 2 per second plus a burst of %d every %s, for %s. Flood: each run writes %d lines as fast as it can; "+
		"replica %s is killed with SIGKILL once a third of the flood is stored, and started again after the flood; then each run writes %d lines more. "+
		"As soon as the others have taken its runs, replica %s is frozen (SIGSTOP) until r0 sees itself alone, then thawed. "+
		"Latencies are the steady phase's; the delivery gap is the longest a written line waited while no new line of its run reached its client, over the flood.\n\n",
		lineBytes, burstLines, burstEvery, steadyFor, floodPerRun, fleetIDs[fleetVictim], fleetTail, fleetIDs[fleetFrozen])
	fmt.Fprintln(w, "| runs | steady lines/s | line → SSE p50 / p99 | client on the collecting replica | on another replica | flood lines/s stored: three replicas / from the kill's takeover (two, one while frozen) / the whole flood | flood MiB/s | kill → takeover | kill → the killed replica's earlier lines stored | freeze → takeover | freeze → the frozen replica's earlier lines stored | longest delivery gap: the killed replica's runs / the frozen one's / the others | lost / duplicated |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		fmt.Fprintf(w, "| %d | %.0f | %s / %s | %s / %s (%d lines) | %s / %s (%d lines) | %.0f / %.0f / %.0f | %.1f | %s | %s | %s | %s | %s / %s / %s | %d / %d |\n", r.runs, r.steadyLinesPerSec,
			msf(float64(r.latP50)), msf(float64(r.latP99)), msf(float64(r.ownP50)), msf(float64(r.ownP99)), r.ownN, msf(float64(r.otherP50)), msf(float64(r.otherP99)), r.otherN,
			r.threeLinesPerSec, r.twoLinesPerSec, r.floodLinesPerSec, r.floodMiBPerSec, r.takeover.Round(100*time.Millisecond), r.storedAfterKill.Round(100*time.Millisecond),
			r.frozenTakeover.Round(100*time.Millisecond), r.storedAfterFreeze.Round(100*time.Millisecond),
			r.gapVictim.Round(100*time.Millisecond), r.gapFrozen.Round(100*time.Millisecond), r.gapOther.Round(100*time.Millisecond), r.missing+r.storeShort, r.duplicated+r.storeExtra)
	}
	fmt.Fprintln(w, "\n| runs | replica | streams open (steady) | RSS steady (anonymous) | RSS peak in the flood (anonymous) | CPU seconds in the flood |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rs {
		for i, f := range r.replicas {
			id := fleetIDs[i]
			if i == fleetVictim {
				id += " (killed)"
			}
			fmt.Fprintf(w, "| %d | %s | %.0f | %.0f MiB (%.0f MiB) | %.0f MiB (%.0f MiB) | %.1f |\n", r.runs, id, f.streams, f.steadyRSS, f.steadyAnon, f.peakRSS, f.peakAnon, f.floodCPU)
		}
	}
	fmt.Fprintln(w, "\n| runs | lines stored | their text | database | lines table | per line stored | runs, cursors, mirror tables | PostgreSQL PSS steady / peak | PostgreSQL CPU seconds in the flood |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		perLine := float64(r.pgLines) / float64(max(r.storedLines, 1))
		fmt.Fprintf(w, "| %d | %d | %.0f MiB | %.0f MiB | %.0f MiB | %.0f bytes | %.1f MiB | %.0f / %.0f MiB | %.1f |\n", r.runs, r.storedLines, float64(r.storedBytes)/(1<<20),
			float64(r.pgDB)/(1<<20), float64(r.pgLines)/(1<<20), perLine, float64(r.pgOther)/(1<<20), r.pgSteadyPSS, r.pgPeakPSS, r.pgFloodCPU)
	}
	for _, r := range rs {
		relayCPU := 0.0
		for _, f := range r.replicas {
			relayCPU += f.floodCPU
		}
		fmt.Fprintf(w, "\nWith %d runs: the kill came %s into the flood; the killed replica collected %d runs; back, it collected again %s after its start. "+
			"The killed replica's runs' longest gap began at the kill %+.1f s. "+
			"The freeze came %s into the flood; the frozen replica collected %d runs, with %d lines written and not stored at the freeze; their longest gap began at the freeze %+.1f s; thawed, %d of its commits were refused by the cursor check. In the flood the replicas used %.1f CPU seconds (%.0f lines stored per relay CPU second), PostgreSQL %.1f (%.0f lines per second of its CPU).\n",
			r.runs, r.killedAfter.Round(100*time.Millisecond), r.victimRuns, r.rejoined.Round(100*time.Millisecond), r.gapVictimAt.Seconds(),
			r.frozenAfter.Round(100*time.Millisecond), r.frozenRuns, r.frozenBacklog, r.gapFrozenAt.Seconds(), r.thawedRefused,
			relayCPU, float64(r.floodLines)/relayCPU, r.pgFloodCPU, float64(r.floodLines)/r.pgFloodCPU)
		if r.r0Commits > 0 {
			fmt.Fprintf(w, "\nIn the flood r0 stored %.0f lines in %.0f appends (%.1f lines each) and %.0f transactions (%.1f appends each).\n",
				r.r0Lines, r.r0Appends, r.r0Lines/r.r0Appends, r.r0Commits, r.r0Appends/r.r0Commits)
		}
		if len(r.steadyCPU) > 0 {
			coresTable(w, "in the steady phase", r.runs, r.steadyWall, r.steadyCPU)
		}
		if r.steadyProfile != "" {
			fmt.Fprintf(w, "\nReplica r0's CPU profile over 10 s of the steady phase with %d runs (by cumulative time):\n\n```\n%s```\n", r.runs, r.steadyProfile)
		}
		if r.floodProfile != "" {
			fmt.Fprintf(w, "\nReplica r0's CPU profile over the flood's first 20 s with %d runs (by cumulative time):\n\n```\n%s```\n", r.runs, r.floodProfile)
		}
		if len(r.floodCPU) > 0 {
			cpu := maps.Clone(r.floodCPU)
			cpu["clipjob-relay (three replicas)"], cpu["postgres"] = relayCPU, r.pgFloodCPU
			coresTable(w, "during the flood", r.runs, r.floodWall, cpu)
		}
	}
	fmt.Fprintln(w, "\n| target | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	bound := lease + renew
	for _, r := range rs {
		target(w, fmt.Sprintf("line → SSE client p99 < 250 ms at %d runs (three replicas)", r.runs), float64(r.latP99)/float64(time.Millisecond), 250, " ms", true)
		target(w, fmt.Sprintf("aggregate ingest ≥ 50,000 lines/s (%d runs, flood, three replicas, before the kill)", r.runs), r.threeLinesPerSec, 50000, " lines/s", false)
		target(w, fmt.Sprintf("takeover of a killed replica's runs within --lease-duration + a renewal, %s (%d runs)", bound, r.runs), r.takeover.Seconds(), bound.Seconds(), " s", true)
		target(w, fmt.Sprintf("takeover of a frozen replica's runs within --lease-duration + a renewal, %s (%d runs)", bound, r.runs), r.frozenTakeover.Seconds(), bound.Seconds(), " s", true)
		target(w, fmt.Sprintf("lines lost or duplicated through a SIGKILL and a SIGSTOP mid-flood, at the clients and in the store (%d runs)", r.runs), float64(r.missing+r.duplicated+r.storeShort+r.storeExtra), 0, "", true)
	}
}

// coresTable prints where the machine's cores went over a phase of wall
// time: each process's CPU seconds and share, the largest first.
func coresTable(w io.Writer, phase string, runs int, wall time.Duration, cpu map[string]float64) {
	cores := wall.Seconds() * float64(runtime.NumCPU())
	fmt.Fprintf(w, "\nWhere the %d cores went %s with %d runs (%s wall, %.1f core-seconds available):\n\n| process | CPU seconds | share of the cores |\n|---|---|---|\n",
		runtime.NumCPU(), phase, runs, wall.Round(100*time.Millisecond), cores)
	names := slices.Collect(maps.Keys(cpu))
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(cpu[b], cpu[a]) })
	for _, n := range names {
		fmt.Fprintf(w, "| %s | %.1f | %.0f%% |\n", n, cpu[n], 100*cpu[n]/cores)
	}
}
