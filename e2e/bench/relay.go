package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/api"
	"github.com/paperclipai/clipjob/relay/store"
)

// The relay at fleet scale: runs * (steady agent rate plus bursts), then
// every run writing as fast as it can, then a restart over the store that
// leaves. Lines carry the time they were written, so an SSE client per
// run measures write-to-arrival latency.
const (
	steadyFor      = 20 * time.Second
	steadyInterval = 500 * time.Millisecond // 2 lines/s per run
	burstEvery     = 10 * time.Second       // and a burst of burstLines
	burstLines     = 50
	floodChunk     = 100
	lineBytes      = 300 // a typical stream-json event
)

type fleetRun struct {
	job, run string
	log      *cluster.PodLog
	seq      atomic.Int64
}

type fleetResult struct {
	runs                 int
	steadyLinesPerSec    float64
	latP50, latP99       time.Duration
	latSamples           int
	missing, duplicated  int
	floodLines           int
	floodLinesPerSec     float64
	floodMiBPerSec       float64
	maxRSS, maxRSSAnon   float64 // MiB, the whole run's peak
	steadyRSS            float64 // MiB, during the steady phase
	steadyRSSAnon        float64
	streamsOpen          float64
	restartReady         time.Duration
	catchUp              time.Duration
	catchUpLines         int
	storedAtRestart      float64
	restartLinesPerSec   float64
	storeMiBAfterRestart float64
	profile              string  // the top of a CPU profile of the relay during the flood
	storeLagP50          float64 // seconds, bucket bounds: line written to stored
	storeLagP99          float64
	heap                 string // the top of the relay's heap right after the flood
	memAtPeak            string // the Go runtime's memory when the anonymous RSS peaked
	heapAtPeak           string // the top of the relay's heap then
	readyWithHistory     time.Duration
	lists                []listTiming
	floodCPU             map[string]float64
	floodWall            time.Duration
}

// cpuTicks reads the CPU time (user + system, in clock ticks) of this
// process and of every process whose command line names dir (the local
// control plane's: etcd, kube-apiserver, kwok, the relay, …), by name.
func cpuTicks(dir string) map[string]int64 {
	out := map[string]int64{"bench (writers, SSE clients)": procTicks("self", false)}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), dir) {
			continue
		}
		name := filepath.Base(strings.SplitN(string(cmd), "\x00", 2)[0])
		out[name] += procTicks(e.Name(), false)
	}
	return out
}

// procStat is a process's command name and the fields of
// /proc/<pid>/stat after it (which may hold spaces): the state first,
// then the parent's id, …, utime, stime, cutime and cstime at 11 to 14.
func procStat(pid string) (comm string, f []string) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", nil
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil
	}
	return s[open+1 : end], strings.Fields(s[end+1:])
}

// procTicks is a process's CPU time (user + system) in clock ticks, with
// that of its children it waited for when withChildren is set.
func procTicks(pid string, withChildren bool) int64 {
	_, f := procStat(pid)
	if len(f) < 15 {
		return 0
	}
	fields := f[11:13]
	if withChildren {
		fields = f[11:15]
	}
	var t int64
	for _, v := range fields {
		n, _ := strconv.ParseInt(v, 10, 64)
		t += n
	}
	return t
}

// cpuSeconds is after - before, in seconds (clock ticks are 1/100 s on
// Linux).
func cpuSeconds(before, after map[string]int64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = float64(d) / 100
		}
	}
	return out
}

// relayKit is what every relay part needs: the relay binary, a way to
// complete bare Jobs, and an SSE client's HTTP client and token.
type relayKit struct {
	bin      string
	complete func(*batchv1.Job) (*batchv1.Job, error)
	client   *http.Client
	token    string
}

// relayBin, when set, is the relay the relay and fleet parts run instead
// of one built from this checkout: to compare two builds on one machine.
var relayBin = flag.String("relay-bin", "", "relay, fleet: a clipjob-relay binary to run instead of building this checkout's")

func newRelayKit(ctx context.Context, c *cluster.Cluster, maxRuns int) (*relayKit, error) {
	if err := raiseInotifyInstances(2 * maxRuns); err != nil {
		return nil, err
	}
	var k relayKit
	var err error
	if k.bin = *relayBin; k.bin == "" {
		if k.bin, err = harness.Build(c.Dir, "clipjob-relay"); err != nil {
			return nil, err
		}
	}
	if k.complete, err = completer(); err != nil {
		return nil, err
	}
	if k.token, err = harness.ServiceAccountToken(ctx, c, "paperclip", "bench-reader", harness.LogReaderRules, relay.DefaultTokenAudience); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA.CertPEM)
	k.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 1000}}
	return &k, nil
}

func relayBench(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, sizes []int, floodPerRun int) error {
	kit, err := newRelayKit(ctx, c, slices.Max(sizes))
	if err != nil {
		return err
	}
	var results []fleetResult
	for i, n := range sizes {
		r, err := fleet(ctx, c, cs, kit, n, floodPerRun, i == len(sizes)-1)
		if err != nil {
			return fmt.Errorf("relay with %d runs: %w", n, err)
		}
		results = append(results, r)
	}
	printFleet(os.Stdout, results, floodPerRun)
	return nil
}

func fleet(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, kit *relayKit, n, floodPerRun int, restart bool) (fleetResult, error) {
	res := fleetResult{runs: n}
	bin, complete, client, token := kit.bin, kit.complete, kit.client, kit.token
	name := fmt.Sprintf("relay-%d", n)
	ports, err := cluster.FreePorts(1)
	if err != nil {
		return res, err
	}
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	rl, err := harness.StartRelay(ctx, c, bin, name, "paperclip", "--max-streams", strconv.Itoa(n+100),
		"--zap-log-level", "info", "--pprof-bind-address", pprofAddr)
	if err != nil {
		return res, err
	}
	defer func() { rl.Stop() }()
	fmt.Fprintf(os.Stderr, "bench: relay: starting %d runs\n", n)
	runs, err := startRuns(ctx, c, cs, complete, name, n)
	if err != nil {
		return res, err
	}
	defer deleteRuns(context.WithoutCancel(ctx), cs, name)

	// One SSE client per run, from the start of its log.
	followCtx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	lat := newLatencies(n, false)
	for i := range runs {
		go follow(followCtx, client, []string{rl.APIAddr}, token, runs[i].run, i, lat)
	}

	if err := connected(ctx, runs, lat, 3*time.Minute); err != nil {
		return res, err
	}

	fmt.Fprintf(os.Stderr, "bench: relay: %d runs steady for %s\n", n, steadyFor)
	before, err := httpMetrics(rl.MetricsAddr)
	if err != nil {
		return res, err
	}
	rss := sampleRSS(rl.PID(), pprofAddr, filepath.Join(c.Dir, name+".peak.heap.pprof"))
	written := writeSteady(ctx, runs)
	if err := waitStored(rl, before, written, time.Minute); err != nil {
		return res, err
	}
	after, _ := httpMetrics(rl.MetricsAddr)
	lag := after.histogram("clipjob_relay_store_lag_seconds", nil).minus(before.histogram("clipjob_relay_store_lag_seconds", nil))
	res.storeLagP50, res.storeLagP99 = lag.quantileBound(0.5), lag.quantileBound(0.99)
	res.steadyLinesPerSec = float64(written) / steadyFor.Seconds()
	res.streamsOpen = after.gauge("clipjob_relay_streams_open", nil)
	time.Sleep(time.Second) // the last lines reach the SSE clients
	res.latP50, res.latP99, res.latSamples = lat.percentiles(nil)
	res.steadyRSS, res.steadyRSSAnon, _, _ = rss()
	rss = sampleRSS(rl.PID(), pprofAddr, filepath.Join(c.Dir, name+".peak.heap.pprof"))

	fmt.Fprintf(os.Stderr, "bench: relay: %d runs writing %d lines each as fast as they can\n", n, floodPerRun)
	before = after
	start := time.Now()
	profiled := profileCPU(pprofAddr, filepath.Join(c.Dir, name+".cpu.pprof"), 10*time.Second)
	cpuBefore := cpuTicks(c.Dir)
	flooded := writeFlood(runs, floodPerRun)
	if err := waitStored(rl, before, flooded, 5*time.Minute); err != nil {
		return res, err
	}
	took := time.Since(start)
	res.floodCPU = cpuSeconds(cpuBefore, cpuTicks(c.Dir))
	res.floodWall = took
	after, _ = httpMetrics(rl.MetricsAddr)
	res.profile = <-profiled
	res.heap = heapTop(pprofAddr, filepath.Join(c.Dir, name+".heap.pprof"))
	res.floodLines = flooded
	res.floodLinesPerSec = float64(flooded) / took.Seconds()
	res.floodMiBPerSec = (counter(after, "clipjob_relay_bytes_stored_total") - counter(before, "clipjob_relay_bytes_stored_total")) / took.Seconds() / (1 << 20)
	time.Sleep(2 * time.Second)
	res.missing, res.duplicated = lat.check(runs)
	res.maxRSS, res.maxRSSAnon, res.memAtPeak, res.heapAtPeak = rss()
	res.maxRSS, res.maxRSSAnon = max(res.maxRSS, res.steadyRSS), max(res.maxRSSAnon, res.steadyRSSAnon)

	if restart {
		fmt.Fprintf(os.Stderr, "bench: relay: restart over the store, with lines written while it was down\n")
		stopFollowing()
		res.storedAtRestart = counter(after, "clipjob_relay_lines_stored_total")
		rl.Stop()
		res.catchUpLines = len(runs) * 100
		for i := range runs {
			if err := writeLines(&runs[i], 100); err != nil {
				return res, err
			}
		}
		start := time.Now()
		if err := rl.Start(ctx); err != nil {
			return res, err
		}
		res.restartReady = time.Since(start)
		if err := waitStored(rl, nil, res.catchUpLines, 5*time.Minute); err != nil {
			return res, err
		}
		res.catchUp = time.Since(start)
		res.restartLinesPerSec = float64(res.catchUpLines) / res.catchUp.Seconds()
		if st, err := os.Stat(filepath.Join(rl.DataDir, "relay.db")); err == nil {
			res.storeMiBAfterRestart = float64(st.Size()) / (1 << 20)
		}

		// Months of history: 10,000 finished runs more, then the lists a
		// client asks for.
		fmt.Fprintf(os.Stderr, "bench: relay: 10,000 finished runs more, then GET /v1/runs\n")
		rl.Stop()
		if err := addFinishedRuns(rl.DataDir, 10000); err != nil {
			return res, err
		}
		start = time.Now()
		if err := rl.Start(ctx); err != nil {
			return res, err
		}
		res.readyWithHistory = time.Since(start)
		for _, q := range []string{"?agent=" + runs[0].job + "&phase=Running", "", "?limit=10000"} {
			t, err := timeListRuns(client, rl.APIAddr, token, q, 20)
			if err != nil {
				return res, err
			}
			res.lists = append(res.lists, t)
		}
	}
	return res, nil
}

// raiseInotifyInstances makes room for kwok, which serves every pod's
// followed log with an inotify instance of its own (the kubelet's log
// reader), all in one process: past the usual limit of 128 the streams it
// serves end at once, and the relay would be measured reconnecting. A
// kubelet serves only its node's pods (110 by default), so a real cluster
// does not meet this limit.
func raiseInotifyInstances(want int) error {
	const knob = "/proc/sys/fs/inotify/max_user_instances"
	b, err := os.ReadFile(knob)
	if err != nil {
		return nil // not Linux: nothing to raise
	}
	have, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if have >= want {
		return nil
	}
	if err := os.WriteFile(knob, []byte(strconv.Itoa(want)), 0o644); err != nil {
		return fmt.Errorf("kwok needs fs.inotify.max_user_instances >= %d to serve that many followed pod logs (it is %d): run `sysctl -w fs.inotify.max_user_instances=%d` as root, or bench fewer runs (-runs): %w", want, have, want, err)
	}
	fmt.Fprintf(os.Stderr, "bench: raised fs.inotify.max_user_instances from %d to %d (kwok follows each pod log with its own inotify instance)\n", have, want)
	return nil
}

// startRuns creates n running agent Jobs (complete: no webhook is
// registered now), waits for their pods and points each pod's log at a
// file this process writes.
func startRuns(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, complete func(*batchv1.Job) (*batchv1.Job, error), prefix string, n int) ([]fleetRun, error) {
	runs := make([]fleetRun, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	for i := range runs {
		runs[i].job = fmt.Sprintf("%s-%04d", prefix, i)
		runs[i].run = runs[i].job
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			job, err := complete(bareJob(runs[i].job, runs[i].job, runs[i].run))
			if err == nil {
				job.Spec.Suspend = ptr.To(false)
				_, err = cs.BatchV1().Jobs("paperclip").Create(ctx, job, metav1.CreateOptions{})
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	pods := map[string]string{} // job -> running pod
	phases := map[corev1.PodPhase]int{}
	// The Job controller creates the pods at its client's 20 requests a
	// second, with an event and a status update each, and kwok starts
	// them four at a time: a thousand take minutes on 2 cores.
	deadline := max(5*time.Minute, time.Duration(n)*600*time.Millisecond)
	err := wait.PollUntilContextTimeout(ctx, time.Second, deadline, true, func(ctx context.Context) (bool, error) {
		list, err := cs.CoreV1().Pods("paperclip").List(ctx, metav1.ListOptions{LabelSelector: "paperclip.io/agent-id"})
		if err != nil {
			return false, nil
		}
		clear(phases)
		for _, p := range list.Items {
			if !strings.HasPrefix(p.Labels[batchv1.JobNameLabel], prefix+"-") {
				continue
			}
			phases[p.Status.Phase]++
			if p.Status.Phase == corev1.PodRunning {
				pods[p.Labels[batchv1.JobNameLabel]] = p.Name
			}
		}
		return len(pods) == n, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%d of %d pods running after %s (pods by phase: %v)", len(pods), n, deadline, phases)
	}
	for i := range runs {
		if runs[i].log, err = c.PodLog(ctx, "paperclip", pods[runs[i].job]); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

func deleteRuns(ctx context.Context, cs kubernetes.Interface, prefix string) {
	list, err := cs.BatchV1().Jobs("paperclip").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, j := range list.Items {
		if strings.HasPrefix(j.Name, prefix+"-") {
			_ = cs.BatchV1().Jobs("paperclip").Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		}
	}
}

// benchLine is one stream-json-like line that says when it was written
// and its number within the run.
func benchLine(i int64) string {
	head := fmt.Sprintf(`{"type":"bench","t":%d,"i":%d,"text":"`, time.Now().UnixNano(), i)
	return head + strings.Repeat("x", max(0, lineBytes-len(head)-2)) + `"}`
}

func writeLines(r *fleetRun, k int) error {
	lines := make([]string, k)
	for j := range lines {
		lines[j] = benchLine(r.seq.Add(1))
	}
	return r.log.Write(lines...)
}

// writeSteady has every run write at an agent's pace for steadyFor, each
// with a burst once every burstEvery at its own offset; it returns the
// lines written.
func writeSteady(ctx context.Context, runs []fleetRun) int {
	var total atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(steadyFor)
	for i := range runs {
		wg.Go(func() {
			offset := time.Duration(i) * burstEvery / time.Duration(len(runs))
			nextBurst := time.Now().Add(offset)
			tick := time.NewTicker(steadyInterval)
			defer tick.Stop()
			for time.Now().Before(end) && ctx.Err() == nil {
				k := 1
				if time.Now().After(nextBurst) {
					k, nextBurst = burstLines, nextBurst.Add(burstEvery)
				}
				if writeLines(&runs[i], k) == nil {
					total.Add(int64(k))
				}
				<-tick.C
			}
		})
	}
	wg.Wait()
	return int(total.Load())
}

func writeFlood(runs []fleetRun, perRun int) int {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32) // the writers must not starve the relay of the cores
	for i := range runs {
		wg.Go(func() {
			for left := perRun; left > 0; left -= floodChunk {
				sem <- struct{}{}
				_ = writeLines(&runs[i], min(left, floodChunk))
				<-sem
			}
		})
	}
	wg.Wait()
	return len(runs) * perRun
}

// profileCPU takes a CPU profile of the process serving pprof at addr
// for d, writes it to file and sends the top of it (by cumulative time).
func profileCPU(addr, file string, d time.Duration) <-chan string {
	out := make(chan string, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
		if err != nil {
			out <- "profile: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(file, b, 0o644)
		}
		if err != nil {
			out <- "profile: " + err.Error()
			return
		}
		top, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount", "25", file).CombinedOutput()
		if err != nil {
			out <- fmt.Sprintf("go tool pprof: %v: %s", err, top)
			return
		}
		out <- string(top)
	}()
	return out
}

// heapTop takes the heap profile of the process serving pprof at addr
// and returns its top by memory in use.
func heapTop(addr, file string) string {
	if err := saveHeap(addr, file); err != nil {
		return "heap: " + err.Error()
	}
	return pprofTop(file)
}

// saveHeap writes the heap profile of the process serving pprof at addr
// to file.
func saveHeap(addr, file string) error {
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(file, b, 0o644)
	}
	return err
}

// pprofTop is the top of the heap profile in file by memory in use.
func pprofTop(file string) string {
	top, err := exec.Command("go", "tool", "pprof", "-top", "-sample_index", "inuse_space", "-nodecount", "15", file).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go tool pprof: %v: %s", err, top)
	}
	return string(top)
}

// waitStored waits until the relay has stored want lines more than at
// before (nil: since it started).
func waitStored(rl *harness.Relay, before scrape, want int, timeout time.Duration) error {
	base := 0.0
	if before != nil {
		base = counter(before, "clipjob_relay_lines_stored_total")
	}
	deadline := time.Now().Add(timeout)
	var got float64
	for time.Now().Before(deadline) {
		m, err := httpMetrics(rl.MetricsAddr)
		if err == nil {
			got = counter(m, "clipjob_relay_lines_stored_total") - base
			if got >= float64(want) {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("relay stored %.0f of %d lines in %s; see %s", got, want, timeout, rl.Log)
}

func counter(s scrape, name string) float64 {
	mf := s[name]
	if mf == nil {
		return 0
	}
	var v float64
	for _, m := range mf.Metric {
		if m.Counter != nil {
			v += m.Counter.GetValue()
		}
	}
	return v
}

// sampleRSS samples the process's resident memory every 200 ms; the
// returned function stops and gives the largest, in MiB: all of it
// (VmRSS) and its anonymous part (RssAnon: the heap and stacks, without
// the store's memory-mapped file, which the kernel can drop), and where
// the Go runtime said its memory was when the anonymous part last grew
// by a tenth (from the pprof server at pprofAddr), with the top of its
// heap profile then (kept in heapFile).
func sampleRSS(pid int, pprofAddr, heapFile string) func() (rss, anon float64, mem, heap string) {
	var peak, peakAnon, peakAnonAsked int64
	var mem string
	profiled := false
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			all, an := rssKiB(pid)
			peak, peakAnon = max(peak, all), max(peakAnon, an)
			if an > peakAnonAsked*11/10 {
				peakAnonAsked = an
				if m := runtimeMemory(pprofAddr); m != "" {
					mem = fmt.Sprintf("at %.0f MiB anonymous: %s", float64(an)/1024, m)
					profiled = saveHeap(pprofAddr, heapFile) == nil
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() (float64, float64, string, string) {
		close(stop)
		<-done
		heap := ""
		if profiled {
			heap = pprofTop(heapFile)
		}
		return float64(peak) / 1024, float64(peakAnon) / 1024, mem, heap
	}
}

// runtimeMemory reads the Go runtime's memory statistics from the heap
// profile's text form: the heap in use and idle (of which released to
// the system), the stacks and everything the runtime holds (Sys), in MiB.
func runtimeMemory(pprofAddr string) string {
	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/heap?debug=1")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	stats := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// "# HeapInuse = 123", "# Stack = in use / sys"
		if f := strings.Fields(sc.Text()); len(f) >= 4 && f[0] == "#" && f[2] == "=" {
			stats[f[1]], _ = strconv.ParseFloat(f[3], 64)
		}
	}
	const mib = 1 << 20
	return fmt.Sprintf("heap in use %.0f MiB, heap idle %.0f MiB (%.0f MiB of it released), next GC at %.0f MiB, stacks %.0f MiB, all the runtime holds (Sys) %.0f MiB",
		stats["HeapInuse"]/mib, stats["HeapIdle"]/mib, stats["HeapReleased"]/mib, stats["NextGC"]/mib, stats["Stack"]/mib, stats["Sys"]/mib)
}

func rssKiB(pid int) (all, anon int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			all = v
		case "RssAnon:":
			anon = v
		}
	}
	return all, anon
}

// connected writes one line to every run and waits until each run's
// client has it, then forgets its latency: every stream is connected and
// every client following before anything is timed.
func connected(ctx context.Context, runs []fleetRun, lat *latencies, timeout time.Duration) error {
	want := make([]int64, len(runs))
	for i := range runs {
		if err := writeLines(&runs[i], 1); err != nil {
			return err
		}
		want[i] = runs[i].seq.Load()
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return lat.allGot(want), nil
	}); err != nil {
		return fmt.Errorf("the first line of every run did not reach its SSE client: %w", err)
	}
	lat.reset()
	return nil
}

// latencies collects, per run, which line numbers arrived (and how
// often) and how long after they were written; with arrivals set, also
// when each line was written and first arrived.
type latencies struct {
	mu   sync.Mutex
	lat  []time.Duration
	runs []int // lat[k] is a line of run runs[k]
	seen []map[int64]int
	// arrivals[run][i]: line i written, first arrived (Unix nanoseconds).
	arrivals []map[int64][2]int64
}

func newLatencies(runs int, arrivals bool) *latencies {
	l := &latencies{seen: make([]map[int64]int, runs)}
	for i := range l.seen {
		l.seen[i] = map[int64]int{}
	}
	if arrivals {
		l.arrivals = make([]map[int64][2]int64, runs)
		for i := range l.arrivals {
			l.arrivals[i] = map[int64][2]int64{}
		}
	}
	return l
}

func (l *latencies) add(run int, i int64, written, arrived time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lat = append(l.lat, arrived.Sub(written))
	l.runs = append(l.runs, run)
	if l.seen[run][i]++; l.arrivals != nil && l.seen[run][i] == 1 {
		l.arrivals[run][i] = [2]int64{written.UnixNano(), arrived.UnixNano()}
	}
}

// allGot reports whether every run's client has line want[run].
func (l *latencies) allGot(want []int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for run, seen := range l.seen {
		if seen[want[run]] == 0 {
			return false
		}
	}
	return true
}

// reset forgets the latencies measured so far (not which lines arrived).
func (l *latencies) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lat, l.runs = nil, nil
}

// percentiles are those of the latencies of the runs of which only says
// true (nil: every run).
func (l *latencies) percentiles(only func(run int) bool) (p50, p99 time.Duration, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s []time.Duration
	for k, d := range l.lat {
		if only == nil || only(l.runs[k]) {
			s = append(s, d)
		}
	}
	if len(s) == 0 {
		return 0, 0, 0
	}
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)], len(s)
}

// check counts lines written but never delivered, and delivered twice.
func (l *latencies) check(runs []fleetRun) (missing, duplicated int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for r := range runs {
		for i := int64(1); i <= runs[r].seq.Load(); i++ {
			switch c := l.seen[r][i]; {
			case c == 0:
				missing++
			case c > 1:
				duplicated += c - 1
			}
		}
	}
	return missing, duplicated
}

// follow reads one run's log as SSE from its start, resuming with
// Last-Event-ID after any break, until ctx ends. It asks the relay at
// addrs[0] first and, when a response breaks, the next one: as a client
// through a Service would land on another replica.
func follow(ctx context.Context, client *http.Client, addrs []string, token, run string, idx int, lat *latencies) {
	var last string
	for k := 0; ctx.Err() == nil; k++ {
		err := followOnce(ctx, client, addrs[k%len(addrs)], token, run, &last, func(l store.Line) {
			var ev struct {
				T int64 `json:"t"`
				I int64 `json:"i"`
			}
			if json.Unmarshal([]byte(l.Line), &ev) == nil && ev.T > 0 {
				lat.add(idx, ev.I, time.Unix(0, ev.T), time.Now())
			}
		})
		if err != nil && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func followOnce(ctx context.Context, client *http.Client, addr, token, run string, last *string, line func(store.Line)) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/v1/runs/"+run+"/log", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	if *last != "" {
		req.Header.Set("Last-Event-ID", *last)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return errors.New(resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var id, event string
	for sc.Scan() {
		t := sc.Text()
		switch {
		case strings.HasPrefix(t, "id: "):
			id = strings.TrimPrefix(t, "id: ")
		case strings.HasPrefix(t, "event: "):
			event = strings.TrimPrefix(t, "event: ")
		case strings.HasPrefix(t, "data: ") && event == "line":
			var l store.Line
			if json.Unmarshal([]byte(strings.TrimPrefix(t, "data: ")), &l) == nil {
				line(l)
				*last = id
			}
		}
	}
	return sc.Err()
}

func printFleet(w io.Writer, rs []fleetResult, floodPerRun int) {
	fmt.Fprintf(w, "\n### The relay at fleet scale (kwok pods with file logs, one SSE client per run)\n\n")
	fmt.Fprintf(w, "Steady: each run writes %d-byte lines at 2 per second plus a burst of %d every %s, for %s. Flood: each run writes %d lines as fast as it can.\n\n",
		lineBytes, burstLines, burstEvery, steadyFor, floodPerRun)
	fmt.Fprintln(w, "| runs | streams open | steady lines/s | line → SSE p50 | p99 | flood lines/s | flood MiB/s | relay RSS peak (anonymous) | lost / duplicated |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %s | %s | %.0f | %.1f | %.0f MiB (%.0f MiB) | %d / %d |\n", r.runs, r.streamsOpen, r.steadyLinesPerSec,
			msf(float64(r.latP50)), msf(float64(r.latP99)), r.floodLinesPerSec, r.floodMiBPerSec, r.maxRSS, r.maxRSSAnon, r.missing, r.duplicated)
	}
	for _, r := range rs {
		fmt.Fprintf(w, "\nWith %d runs, from a line written to its commit in the store (the relay's clipjob_relay_store_lag_seconds, steady phase, bucket bounds): p50 ≤ %.0f ms, p99 ≤ %.0f ms.\n",
			r.runs, r.storeLagP50*1000, r.storeLagP99*1000)
	}
	fmt.Fprintln(w, "\n| target | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, r := range rs {
		if r.runs == 200 {
			target(w, "line → SSE client p99 < 250 ms at 200 runs", float64(r.latP99)/float64(time.Millisecond), 250, " ms", true)
		}
		target(w, fmt.Sprintf("aggregate ingest ≥ 50,000 lines/s (%d runs, flood)", r.runs), r.floodLinesPerSec, 50000, " lines/s", false)
		if r.runs == 500 {
			// Issue 24: the store's mapping included, or without it if
			// the mapping is the floor.
			target(w, "relay RSS < 150 MiB at 500 runs (the store's mapping included)", r.maxRSS, 150, " MiB", true)
			target(w, "relay anonymous RSS < 100 MiB at 500 runs", r.maxRSSAnon, 100, " MiB", true)
			target(w, "line → SSE client p99 < 250 ms at 500 runs", float64(r.latP99)/float64(time.Millisecond), 250, " ms", true)
		}
		fmt.Fprintf(w, "\nThe relay's RSS peak with %d runs: %.0f MiB (%.0f MiB anonymous) in the steady phase; the table's is the flood's, or the steady phase's if larger.\n",
			r.runs, r.steadyRSS, r.steadyRSSAnon)
		if r.memAtPeak != "" {
			fmt.Fprintf(w, "\nThe relay's Go runtime with %d runs during the flood, %s.\n", r.runs, r.memAtPeak)
		}
		if r.heapAtPeak != "" {
			fmt.Fprintf(w, "\nHeap of the relay then (top, in use at the last collection):\n\n```\n%s```\n", r.heapAtPeak)
		}
		if len(r.floodCPU) > 0 {
			fmt.Fprintf(w, "\nWhere the %d cores went during the flood with %d runs (%s wall, %.1f core-seconds available):\n\n| process | CPU seconds | share of the cores |\n|---|---|---|\n",
				runtime.NumCPU(), r.runs, r.floodWall.Round(100*time.Millisecond), r.floodWall.Seconds()*float64(runtime.NumCPU()))
			names := slices.Collect(maps.Keys(r.floodCPU))
			slices.SortFunc(names, func(a, b string) int { return cmp.Compare(r.floodCPU[b], r.floodCPU[a]) })
			for _, n := range names {
				fmt.Fprintf(w, "| %s | %.1f | %.0f%% |\n", n, r.floodCPU[n], 100*r.floodCPU[n]/(r.floodWall.Seconds()*float64(runtime.NumCPU())))
			}
		}
		if r.profile != "" {
			fmt.Fprintf(w, "\nCPU profile of the relay during the flood with %d runs (top, cumulative):\n\n```\n%s```\n", r.runs, r.profile)
		}
		if r.heap != "" {
			fmt.Fprintf(w, "\nHeap of the relay right after the flood with %d runs (top, in use):\n\n```\n%s```\n", r.runs, r.heap)
		}
		if len(r.lists) > 0 {
			fmt.Fprintf(w, "\nWith 10,000 finished runs more in the store (ready %s after a restart), GET /v1/runs over TLS with a token (20 requests each):\n\n| query | runs returned | p50 | max |\n|---|---|---|---|\n",
				r.readyWithHistory.Round(10*time.Millisecond))
			for _, l := range r.lists {
				fmt.Fprintf(w, "| `/v1/runs%s` | %d | %s | %s |\n", l.query, l.runs, msf(float64(l.p50)), msf(float64(l.max)))
			}
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| target | measured | |")
			fmt.Fprintln(w, "|---|---|---|")
			target(w, "GET /v1/runs < 50 ms with 10,000 runs (one agent's running run)", float64(r.lists[0].p50)/1e6, 50, " ms", true)
			target(w, fmt.Sprintf("GET /v1/runs < 50 ms with 10,000 runs (the default list, newest %d)", api.DefaultListLimit), float64(r.lists[1].p50)/1e6, 50, " ms", true)
		}
		if r.restartReady > 0 {
			fmt.Fprintf(w, "\nRestart over a store of %.0f lines (%.0f MiB): ready in %s; the %d lines written while it was down stored %s after the start (%.0f lines/s).\n",
				r.storedAtRestart, r.storeMiBAfterRestart, r.restartReady.Round(10*time.Millisecond), r.catchUpLines, r.catchUp.Round(10*time.Millisecond), r.restartLinesPerSec)
		}
	}
}
