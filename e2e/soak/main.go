// Command soak is `make soak`: chaos, measured. On a local cluster with a
// real node it deploys Paperclip and clipjob as `make demo` does (the
// webhook with its two replicas), makes several claude_k8s agents and
// runs them through Paperclip's API until it has made the runs asked
// for, while it kills, at random moments and in shuffled rounds so each
// is hit more than once, a webhook pod, the claim controller's leader,
// the relay and the Paperclip server (SIGKILL to the pod's processes, as
// an OOM kill or a crash does, the kubelet restarting them; -delete
// deletes the pod with no grace instead).
//
// Then it judges what Paperclip recorded: every run ended, succeeded or
// failed with a reason; a run's lines (the fake agent's "line 1" …
// "line N") are in its run log once each, in order, all of them when it
// succeeded and a gapless head when it did not; and no agent is left
// blocked: each runs once more, with nothing killed, and succeeds. It
// prints the figures and exits non-zero on any loss, repeat, run without
// a reason or blocked agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

const namespace = "paperclip"

var release = charts.Release{Name: "clipjob", Namespace: "clipjob-system"}

type options struct {
	runs, agents, lines, rate int
	killEvery, killSpacing    time.Duration
	paperclipSpacing          time.Duration
	seed                      uint64
	targets                   []string
	delete                    bool
}

func main() {
	var o options
	flag.IntVar(&o.runs, "runs", 100, "runs to make, spread over the agents")
	flag.IntVar(&o.agents, "agents", 4, "agents, each with one run at a time")
	flag.IntVar(&o.lines, "lines", 20, "lines each run writes")
	flag.IntVar(&o.rate, "rate", 4, "lines per second each run writes")
	flag.DurationVar(&o.killEvery, "kill-every", 15*time.Second, "mean time between two kills")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seed of the kills' order and moments")
	only := flag.String("kill", strings.Join(targets, ","), "what to kill, of: "+strings.Join(targets, ", "))
	flag.DurationVar(&o.killSpacing, "kill-spacing", 5*time.Minute, "least time between two kills of one pod (the kubelet's crash-loop backoff grows with each)")
	flag.DurationVar(&o.paperclipSpacing, "paperclip-kill-spacing", 7*time.Minute, "least time between two kills of the Paperclip server's pod (each leaves its agents' runs to Paperclip's lost-run check, about 5 minutes, and the next kill should find them running again)")
	flag.BoolVar(&o.delete, "delete", false, "delete the pods with no grace instead of SIGKILL to their processes")
	flag.Parse()
	for t := range strings.SplitSeq(*only, ",") {
		if t = strings.TrimSpace(t); t != "" {
			if !slices.Contains(targets, t) {
				fmt.Fprintf(os.Stderr, "soak: -kill %q: not one of %s\n", t, strings.Join(targets, ", "))
				os.Exit(2)
			}
			o.targets = append(o.targets, t)
		}
	}
	// The chart is applied with controller-runtime's client, whose logs
	// are not this program's output.
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if !cluster.WantRealNode() {
		return fmt.Errorf("the soak runs agents in real containers: unset %s", cluster.NodeEnv)
	}
	c, err := cluster.Start(ctx, cluster.Options{Log: os.Stderr, RealNode: true})
	if err != nil {
		return err
	}
	defer c.Stop()
	values := harness.PaperclipInClusterValues(namespace)
	values["webhook"].(map[string]any)["replicas"] = 2 // the chart's default: admission goes on while one is killed
	start := time.Now()
	d, err := harness.DeployPaperclip(ctx, c, namespace, release, values, func(what string) {
		fmt.Printf("%6.1fs %s\n", time.Since(start).Seconds(), what)
	})
	if err != nil {
		return err
	}
	defer d.Close()

	company, err := d.Server.NewCompany(ctx, "Soak Co")
	if err != nil {
		return err
	}
	script := fmt.Sprintf("lines=%d rate=%d", o.lines, o.rate)
	var agents []string
	for i := range o.agents {
		a, err := d.Server.NewAgent(ctx, company.ID, map[string]any{"name": fmt.Sprintf("Agent %d", i+1), "adapterType": "claude_k8s",
			"adapterConfig": map[string]any{"promptTemplate": script}})
		if err != nil {
			return err
		}
		agents = append(agents, a.ID)
	}

	k := &killer{cs: c.Clientset(), rng: rand.New(rand.NewPCG(o.seed, 0)), every: o.killEvery, targets: o.targets, delete: o.delete,
		spacing: o.killSpacing, paperclipSpacing: o.paperclipSpacing, killedAt: map[string]time.Time{}, kills: map[string]int{}}
	killCtx, stopKilling := context.WithCancel(ctx)
	var killing sync.WaitGroup
	killing.Go(func() { k.run(killCtx) })
	fmt.Printf("%6.1fs %d runs of %d agents (%s each), a kill every %s on average (seed %d)\n",
		time.Since(start).Seconds(), o.runs, o.agents, script, o.killEvery, o.seed)
	runs, errs := drive(ctx, d, agents, o.runs, func(format string, args ...any) {
		fmt.Printf("%6.1fs "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	})
	stopKilling()
	killing.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// No agent left blocked: each runs once more, with nothing killed. A
	// claim whose Job went with a kill holds until the claim controller
	// sees the Job gone, or for the pending grace (60 s) when it did not
	// (its leader was killed), and a run woken as the server was killed
	// is lost with it: an agent whose run fails is woken again for up to
	// freeWithin.
	const freeWithin = 3 * time.Minute
	stopped := time.Now()
	fmt.Printf("%6.1fs the kills stopped; each agent runs once more (busy agents tried again for %s)\n", time.Since(start).Seconds(), freeWithin)
	var after []harness.PaperclipRun
	var afterErrs []error
	pending := slices.Clone(agents)
	var freedIn time.Duration
	for len(pending) > 0 && time.Since(stopped) < freeWithin && ctx.Err() == nil {
		ended, errs := drive(ctx, d, pending, len(pending), func(string, ...any) {})
		afterErrs = append(afterErrs, errs...)
		pending = pending[:0]
		for _, r := range ended {
			// A run refused as busy, or lost to the last kill of the
			// server, is not yet a blocked agent.
			if r.Status != "succeeded" && time.Since(stopped) < freeWithin {
				pending = append(pending, r.AgentID)
				continue
			}
			after = append(after, r)
			freedIn = max(freedIn, time.Since(stopped))
		}
		if len(pending) > 0 {
			time.Sleep(5 * time.Second)
		}
	}
	v := judge(ctx, d.Server, runs, o.lines)
	blocked := len(pending)
	for _, r := range after {
		if r.Status != "succeeded" {
			blocked++
			fmt.Printf("agent %s is blocked: its run after the kills %s: %s %s %s\n", r.AgentID, r.ID, r.Status, r.ErrorCode, r.Error)
		}
	}
	fmt.Printf("%6.1fs every agent ran again within %s of the last kill (%d still blocked)\n", time.Since(start).Seconds(), freedIn.Round(time.Second), blocked)
	if blocked > 0 {
		// What holds them: the claims and the Jobs they name.
		leases, _ := c.Clientset().CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: "clipjob.paperclip.io/claim"})
		for _, l := range leases.Items {
			var written []string
			for _, f := range l.ManagedFields {
				written = append(written, fmt.Sprintf("%s %s %v", f.Manager, f.Operation, f.Time))
			}
			fmt.Printf("claim %s: holder %s, acquired %v, annotations %v, written %v (now %s)\n", l.Name, ptr.Deref(l.Spec.HolderIdentity, ""),
				l.Spec.AcquireTime, l.Annotations, written, time.Now().UTC().Format(time.RFC3339))
		}
		jobs, _ := c.Clientset().BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{})
		for _, j := range jobs.Items {
			fmt.Printf("Job %s: uid %s, deleting %v, finalizers %v, status %+v\n", j.Name, j.UID, j.DeletionTimestamp, j.Finalizers, j.Status.Conditions)
		}
	}

	fmt.Printf("\nsoak: %d runs (%d succeeded, %d failed with a reason, %d without), %d kills (%s), %d lines in Paperclip's run logs, %d lost, %d repeated, %d runs out of order, %d agents blocked; %d call errors to Paperclip during the kills, %d after; %s\n",
		len(runs), v.succeeded, v.failedWithReason, v.failedWithout, k.total(), k.summary(), v.lines, v.lost, v.repeated, v.disordered, blocked,
		len(errs), len(afterErrs), time.Since(start).Round(time.Second))
	for _, p := range v.problems {
		fmt.Println("  " + p)
	}
	if v.lost > 0 || v.repeated > 0 || v.disordered > 0 || v.failedWithout > 0 || blocked > 0 || len(runs) < o.runs {
		return errors.New("the soak found losses, repeats, runs ended without a reason or blocked agents (above)")
	}
	return nil
}

// drive keeps one run going per agent until n runs were made, and
// returns them as they ended, with the errors Paperclip's API answered
// meanwhile. A call that fails finds the server's pod again (it may have
// been replaced) before the next.
func drive(ctx context.Context, d *harness.PaperclipInCluster, agents []string, n int, logf func(string, ...any)) ([]harness.PaperclipRun, []error) {
	pc := d.Server
	current := map[string]string{} // agent → its run going on
	// An agent refused as busy (its claim held for a run a kill ended) is
	// woken again after a pause, as Paperclip's next heartbeat would.
	notBefore := map[string]time.Time{}
	var ended []harness.PaperclipRun
	var errs []error
	made := 0
	failed := func(err error) {
		errs = append(errs, err)
		logf("Paperclip: %v; finding its pod again", err)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := d.Reconnect(rctx); err != nil {
			errs = append(errs, err)
		}
	}
	for ctx.Err() == nil && (made < n || len(current) > 0) {
		for _, a := range agents {
			if id := current[a]; id != "" {
				r, err := pc.Run(ctx, id)
				if err != nil {
					failed(err)
					continue
				}
				if r.Ended() {
					delete(current, a)
					if r.ErrorCode == "k8s_concurrent_run_blocked" {
						notBefore[a] = time.Now().Add(5 * time.Second)
					}
					ended = append(ended, r)
					logf("run %d/%d %s of %s: %s %s", len(ended), n, r.ID, a, r.Status, r.Error)
				}
				continue
			}
			if made < n && time.Now().After(notBefore[a]) {
				r, err := pc.Wake(ctx, a, "soak")
				if err != nil {
					failed(err)
					continue
				}
				current[a] = r.ID
				made++
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return ended, errs
}

// verdict is what Paperclip recorded of the runs.
type verdict struct {
	succeeded, failedWithReason, failedWithout int
	lines, lost, repeated, disordered          int
	problems                                   []string
}

// judge reads each run's log: a succeeded run must hold "line 1" … "line
// n" once each, in order; any other a gapless head of them, and a reason.
func judge(ctx context.Context, pc *harness.Paperclip, runs []harness.PaperclipRun, n int) verdict {
	var v verdict
	for _, r := range runs {
		records, err := pc.RunLog(ctx, r.ID)
		var apiErr *harness.APIError
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound && r.Status != "succeeded" {
			err = nil // a run that ended before it wrote anything has no log
		}
		if err != nil {
			v.problems = append(v.problems, fmt.Sprintf("run %s: its log: %v", r.ID, err))
			continue
		}
		texts := harness.AgentTexts(records)
		v.lines += len(texts)
		want := n
		if r.Status == "succeeded" {
			v.succeeded++
		} else {
			want = -1 // what it wrote before it was cut short
			if r.Error == "" && r.ErrorCode == "" {
				v.failedWithout++
				v.problems = append(v.problems, fmt.Sprintf("run %s ended %s with no reason", r.ID, r.Status))
			} else {
				v.failedWithReason++
				v.problems = append(v.problems, fmt.Sprintf("run %s ended %s: %s %s (%d lines)", r.ID, r.Status, r.ErrorCode, r.Error, len(texts)))
			}
		}
		lost, repeated, disordered := compareLines(texts, want)
		v.lost += lost
		v.repeated += repeated
		if disordered {
			v.disordered++
		}
		if lost > 0 || repeated > 0 || disordered {
			v.problems = append(v.problems, fmt.Sprintf("run %s (%s): %d lines lost, %d repeated, out of order %v: %s", r.ID, r.Status, lost, repeated, disordered, strings.Join(texts, ", ")))
		}
	}
	return v
}

// compareLines holds a run's texts to the fake agent's "line 1" …
// "line n", each once and in order; n < 0 takes the highest line seen (a
// run cut short must hold a gapless head). It counts the lines missing,
// those beyond their first, and says whether the order is broken.
func compareLines(texts []string, n int) (lost, repeated int, disordered bool) {
	seen := map[int]int{}
	last := 0
	for _, t := range texts {
		var i int
		if _, err := fmt.Sscanf(t, "line %d", &i); err != nil || i <= 0 {
			continue
		}
		if seen[i]++; seen[i] > 1 {
			repeated++
			continue
		}
		if i < last {
			disordered = true
		}
		last = max(last, i)
	}
	if n < 0 {
		n = last
	}
	for i := 1; i <= n; i++ {
		if seen[i] == 0 {
			lost++
		}
	}
	return lost, repeated, disordered
}

// killer deletes, with no grace, one of clipjob's or Paperclip's pods at
// random moments, in rounds of the targets shuffled.
type killer struct {
	cs      kubernetes.Interface
	rng     *rand.Rand
	every   time.Duration
	targets []string
	delete  bool // delete the pod rather than SIGKILL its processes
	// spacing is the least time between two kills of one pod: the
	// kubelet restarts a container killed again and again after a
	// crash-loop backoff that doubles from 10 s and is reset only after
	// ten minutes up, and a pod killed every minute measures that
	// backoff (80–160 s down after five kills), not clipjob's recovery.
	spacing time.Duration
	// paperclipSpacing is the Paperclip server's: a SIGKILL leaves its
	// in-flight runs running in Paperclip until it marks them lost, about
	// five minutes, and each agent waits for its run; killed again as
	// they resume, the soak measures Paperclip's recovery, not clipjob's
	// (stopped at run 24 of 100 after 8 minutes with 5 minutes between).
	paperclipSpacing time.Duration
	killedAt         map[string]time.Time // by pod name

	mu    sync.Mutex
	kills map[string]int // by target
}

// spacingOf is the least time between two kills of one pod of target.
func (k *killer) spacingOf(target string) time.Duration {
	if target == "Paperclip" {
		return max(k.spacing, k.paperclipSpacing)
	}
	return k.spacing
}

// rested are the pods of names not killed within spacing of now.
func rested(names []string, killedAt map[string]time.Time, now time.Time, spacing time.Duration) []string {
	var out []string
	for _, n := range names {
		if at, ok := killedAt[n]; !ok || now.Sub(at) >= spacing {
			out = append(out, n)
		}
	}
	return out
}

// The targets, by what each pod is.
var targets = []string{"webhook", "claim controller", "relay", "Paperclip"}

func (k *killer) run(ctx context.Context) {
	for len(k.targets) > 0 && ctx.Err() == nil {
		round := slices.Clone(k.targets)
		k.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		for _, t := range round {
			wait := time.Duration(float64(k.every) * (0.5 + k.rng.Float64()))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			ns, pod, err := k.pick(ctx, t)
			if err != nil {
				fmt.Printf("kill %s: %v\n", t, err)
				continue
			}
			how, err := k.kill(ctx, ns, pod)
			if err != nil {
				fmt.Printf("kill %s %s/%s: %v\n", t, ns, pod, err)
				continue
			}
			fmt.Printf("killed the %s: pod %s/%s (%s)\n", t, ns, pod, how)
			k.killedAt[pod] = time.Now()
			k.mu.Lock()
			k.kills[t]++
			k.mu.Unlock()
		}
	}
}

// kill ends pod ns/name: with SIGKILL to its containers' processes on
// this machine (the real node's), as an OOM kill or a crash would, the pod
// left for the kubelet to restart them in; or, with -delete, deleted with
// no grace, as a lost node's pods are (their processes then run on for a
// moment with tokens the API server no longer accepts).
func (k *killer) kill(ctx context.Context, ns, name string) (string, error) {
	if k.delete {
		return "deleted", k.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
	p, err := k.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	pids, err := podProcesses(string(p.UID))
	if err != nil {
		return "", err
	}
	if len(pids) == 0 {
		return "", fmt.Errorf("no process of pod %s on this machine", p.UID)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return fmt.Sprintf("SIGKILL to %d processes", len(pids)), nil
}

// podProcesses are the processes of a pod's containers, found by the
// pod's cgroup (the kubelet's cgroupfs driver names it pod<uid>), the
// sandbox's pause process left out: killing it would take the pod's
// network down, which is another failure.
func podProcesses(uid string) ([]int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !strings.Contains(string(cg), "pod"+uid) {
			continue
		}
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "pause" {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// pick names a running pod of target: for the webhook a replica that
// does not lead the claim controller when another is ready, for the claim
// controller the replica holding its Lease. The two are one binary, so
// striking the leader as "webhook" would kill the claim controller too and
// hold its pod out of the other target's spacing.
func (k *killer) pick(ctx context.Context, target string) (ns, pod string, err error) {
	ns, selector := release.Namespace, ""
	switch target {
	case "webhook":
		selector = "app.kubernetes.io/instance=" + release.Name + ",app.kubernetes.io/component=webhook"
	case "relay":
		selector = "app.kubernetes.io/instance=" + release.Name + ",app.kubernetes.io/component=relay"
	case "Paperclip":
		ns, selector = namespace, "app=paperclip-server"
	case "claim controller":
		// The leader's pod: the Lease may still name one just killed
		// until another replica takes it over.
		var name string
		err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			name = k.claimLeader(ctx)
			p, err := k.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.DeletionTimestamp == nil && ready(p), nil
		})
		if err != nil {
			return "", "", fmt.Errorf("no live pod holds the claim controller's Lease (last named %q): %w", name, err)
		}
		if spacing := k.spacingOf(target); len(rested([]string{name}, k.killedAt, time.Now(), spacing)) == 0 {
			return "", "", fmt.Errorf("its pod %s was killed less than %s ago", name, spacing)
		}
		return ns, name, nil
	}
	// Only a ready pod: a container killed again while it starts measures
	// the kubelet's crash-loop backoff, not recovery (the first SIGKILL
	// soak kept Paperclip in CrashLoopBackOff that way).
	var live []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := k.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		live = live[:0]
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && ready(&p) {
				live = append(live, p.Name)
			}
		}
		return len(live) > 0, nil
	})
	if err != nil {
		return "", "", fmt.Errorf("no ready pod of %s (%s) in %s: %w", target, selector, ns, err)
	}
	if target == "webhook" {
		live = besidesLeader(live, k.claimLeader(ctx))
	}
	spacing := k.spacingOf(target)
	if live = rested(live, k.killedAt, time.Now(), spacing); len(live) == 0 {
		return "", "", fmt.Errorf("every ready pod of %s was killed less than %s ago", target, spacing)
	}
	return ns, live[k.rng.IntN(len(live))], nil
}

// claimLeader is the pod named by the claim controller's Lease, "" when
// it cannot be read.
func (k *killer) claimLeader(ctx context.Context) string {
	l, err := k.cs.CoordinationV1().Leases(release.Namespace).Get(ctx, "clipjob-claim-controller", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	// controller-runtime's identity is the pod's name and a suffix.
	name, _, _ := strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "_")
	return name
}

// besidesLeader leaves the claim controller's leader out of the webhook's
// ready pods, unless it is the only one.
func besidesLeader(live []string, leader string) []string {
	rest := slices.DeleteFunc(slices.Clone(live), func(n string) bool { return n == leader })
	if len(rest) == 0 {
		return live
	}
	return rest
}

func (k *killer) total() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, c := range k.kills {
		n += c
	}
	return n
}

func (k *killer) summary() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var parts []string
	for _, t := range k.targets {
		parts = append(parts, fmt.Sprintf("%s %d", t, k.kills[t]))
	}
	return strings.Join(parts, ", ")
}

func ready(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}
