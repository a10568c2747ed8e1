package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// The Paperclip part (-only paperclip): what the user feels, measured side
// by side. On a local control plane with the real node, one Paperclip
// server (host-run, its home on the agents' volume as in Paperclip's
// image) runs agents through clipjob's adapter (a bare Job, clipjob's
// webhooks, its relay) and, in the same run, interleaved, through a
// baseline adapter that does what the seed claude-k8s adapter does (a
// complete Job built by the client in a namespace no webhook of clipjob
// selects, the pod polled every 2 s, its output read from the file it tees
// on the shared volume, or from the Kubernetes log API:
// e2e/bench/seedadapter). Each run is timed from Paperclip's own marks:
// the run's createdAt (the wake) to the ts of the record of the agent's
// first line in the run's log, both set by the server (millisecond
// resolution); between them, the stages of paperclipstages.go.

// seedNamespace is where the baseline's Jobs run: no webhook of clipjob's
// selects it, and the relay does not follow it.
const seedNamespace = "bench-seed"

// agentScript is the fake agent's script: three lines, the first stamped
// with the time it was written.
const agentScript = "lines=3 stamp=1"

type pcPath struct {
	key, label, adapterType, namespace string
	agents                             []harness.PaperclipAgent
}

func paperclipBench(ctx context.Context, runs, agents int, baselines []string) error {
	if !cluster.WantRealNode() {
		return fmt.Errorf("the Paperclip part needs the real node (%s=kwok is set); run the other parts with -only", cluster.NodeEnv)
	}
	c, err := cluster.Start(ctx, cluster.Options{Log: os.Stderr, RealNode: true})
	if err != nil {
		return err
	}
	defer c.Stop()
	in, err := harness.InstallCluster(ctx, c, "webhook-0", harness.RealNodeProfiles())
	if err != nil {
		return err
	}
	defer in.Webhook.Stop()
	r, _, _, err := in.SharedRelay()
	if err != nil {
		return err
	}
	spec, err := in.PaperclipServerSpec(r, "", "")
	if err != nil {
		return err
	}
	seed, err := seedSettings(ctx, c, in)
	if err != nil {
		return err
	}
	// As an operator running the seed adapter beside clipjob would:
	// clipjob's webhooks leave the seed's namespace alone (the chart's
	// webhook.excludeNamespaces).
	if err := in.Register(ctx, harness.RegisterOptions{Values: map[string]any{"agentNamespaces": harness.AgentNamespaces,
		"webhook": map[string]any{"url": "https://" + in.Webhook.Addr, "excludeNamespaces": []any{"kube-system", seedNamespace}}}}); err != nil {
		return err
	}
	if err := waitUnjudged(ctx, c.Clientset()); err != nil {
		return err
	}
	seedDir := filepath.Join(harness.Root(), "e2e", "bench", "seedadapter")
	pc, err := harness.StartPaperclipServer(ctx, spec, harness.ServerOptions{VolumeDir: in.SharedDir(), Prepare: func(pc *harness.Paperclip) error {
		// The baseline adapter and its settings, where the server's user
		// reads them.
		dst := filepath.Join(pc.Files(), "seedadapter")
		if out, err := exec.Command("cp", "-r", seedDir, dst).CombinedOutput(); err != nil {
			return fmt.Errorf("copying the baseline adapter: %v: %s", err, out)
		}
		for name, data := range map[string][]byte{"seed-token": []byte(seed.token), "seed-ca.crt": c.CA.CertPEM} {
			if err := os.WriteFile(filepath.Join(pc.Files(), name), data, 0o600); err != nil {
				return err
			}
		}
		seed.settings["tokenFile"] = filepath.Join(pc.Files(), "seed-token")
		seed.settings["caFile"] = filepath.Join(pc.Files(), "seed-ca.crt")
		data, err := json.Marshal(seed.settings)
		if err != nil {
			return err
		}
		settings := filepath.Join(pc.Files(), "seed-settings.json")
		if err := os.WriteFile(settings, data, 0o600); err != nil {
			return err
		}
		pc.Env["BENCH_SEED_SETTINGS"] = settings
		return pc.Own(pc.Files())
	}})
	if err != nil {
		return err
	}
	failed := true
	defer func() { pc.Close(failed) }()

	all := []*pcPath{
		{key: "clipjob", label: "clipjob (bare Job, webhooks, relay)", adapterType: "claude_k8s", namespace: in.Namespace},
		{key: "file", label: "seed: complete Job, file tail", adapterType: "bench_seed_file", namespace: seedNamespace},
		{key: "api", label: "seed: complete Job, log API", adapterType: "bench_seed_api", namespace: seedNamespace},
	}
	var paths []*pcPath
	for _, p := range all {
		if p.key == "clipjob" || containsWord(baselines, p.key) {
			paths = append(paths, p)
		}
	}
	seedPkg := filepath.Join(pc.Files(), "seedadapter")
	for typ, dir := range map[string]string{"bench_seed_file": seedPkg, "bench_seed_api": filepath.Join(seedPkg, "api")} {
		if err := pc.InstallAdapter(ctx, dir, typ); err != nil {
			return fmt.Errorf("installing the baseline adapter %s: %w", typ, err)
		}
	}
	company, err := pc.NewCompany(ctx, "Bench")
	if err != nil {
		return err
	}
	for _, p := range paths {
		for i := range agents {
			a, err := pc.NewAgent(ctx, company.ID, map[string]any{"name": fmt.Sprintf("%s-%d", p.key, i), "adapterType": p.adapterType,
				"adapterConfig": map[string]any{"promptTemplate": agentScript}})
			if err != nil {
				return fmt.Errorf("an agent of %s: %w", p.adapterType, err)
			}
			p.agents = append(p.agents, a)
		}
	}

	w := newRunWatch(c.Clientset())
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.run(wctx)
	w.ready.Wait()

	loadBefore := loadAverage()
	start := time.Now()
	fmt.Printf("# make bench, the Paperclip part: %d runs per path, %d agents each, interleaved, one run at a time; %s\n", runs, agents, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	results := make([][]runMarks, len(paths))
	for i := range runs {
		for j := range paths {
			// Rotated, so no path always follows the same one.
			k := (i + j) % len(paths)
			p := paths[k]
			m, err := oneRun(ctx, pc, w, p, p.agents[i%len(p.agents)])
			if err != nil {
				return fmt.Errorf("%s, run %d: %w", p.key, i, err)
			}
			results[k] = append(results[k], m)
			fmt.Fprintf(os.Stderr, "bench: paperclip %3d %-7s wake → first line %s\n", i, p.key, msd(m.firstLine()))
		}
	}
	loadAfter := loadAverage()
	reports := make([]pathReport, len(paths))
	for k, p := range paths {
		reports[k] = pathReport{key: p.key, label: p.label, runs: results[k]}
	}
	// The reference is the first baseline (the seed's file tail, unless
	// -pc-baselines says otherwise).
	paperclipReport(os.Stdout, reports, reports[min(1, len(reports)-1)].key, loadBefore, loadAfter)
	fmt.Printf("\n(%d runs in %s; p99 of fewer than 100 runs is the slowest run)\n", runs*len(paths), time.Since(start).Round(time.Second))
	failed = false
	return nil
}

func containsWord(list []string, w string) bool {
	for _, s := range list {
		if s == w {
			return true
		}
	}
	return false
}

type seedSetup struct {
	token    string
	settings map[string]any
}

// seedSettings makes the baseline's namespace: the agents' volume bound
// to a claim there (the same directory as Paperclip's home), and a
// ServiceAccount with what the seed adapter asks of the cluster.
func seedSettings(ctx context.Context, c *cluster.Cluster, in *harness.Install) (seedSetup, error) {
	cs := c.Clientset()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: seedNamespace}}, metav1.CreateOptions{}); err != nil {
		return seedSetup{}, err
	}
	const claim = "paperclip-data"
	pv := harness.HostPathVolume(seedNamespace+"-data", in.SharedDir(), corev1.ReadWriteMany, seedNamespace, claim)
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return seedSetup{}, err
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: seedNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: new(string), VolumeName: pv.Name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims(seedNamespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return seedSetup{}, err
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(seedNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return seedSetup{}, fmt.Errorf("namespace %s never got its default ServiceAccount", seedNamespace)
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
	}
	token, err := harness.ServiceAccountToken(ctx, c, seedNamespace, "seed-adapter", rules)
	if err != nil {
		return seedSetup{}, err
	}
	sel, tol := cluster.RealNodePlacement()
	return seedSetup{token: token, settings: map[string]any{
		"server": c.Config.Host, "namespace": seedNamespace, "image": cluster.FakeAgentImage, "claim": claim,
		"nodeSelector": sel, "tolerations": tol,
	}}, nil
}

// waitUnjudged waits until the API server no longer calls clipjob's
// webhooks for the seed's namespace: an agent Job there, created as a dry
// run, is admitted as it is.
func waitUnjudged(ctx context.Context, cs kubernetes.Interface) error {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "unjudged", Namespace: seedNamespace, Labels: map[string]string{contract.LabelAgentID: "a"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "not-allowed.example/x:1"}}}}}}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = cs.BatchV1().Jobs(seedNamespace).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("clipjob's webhooks still judge Jobs in %s: %v", seedNamespace, last)
	}
	return nil
}

// oneRun wakes agent, waits for its run to end, and reads its marks.
func oneRun(ctx context.Context, pc *harness.Paperclip, w *runWatch, p *pcPath, agent harness.PaperclipAgent) (runMarks, error) {
	m := runMarks{path: p.key}
	run, err := pc.Wake(ctx, agent.ID, "make bench")
	if err != nil {
		return m, err
	}
	var rec runRecord
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := pc.Do(ctx, http.MethodGet, "/api/heartbeat-runs/"+run.ID, nil, &rec); err != nil {
			return false, nil
		}
		return harness.PaperclipRun{Status: rec.Status}.Ended(), nil
	})
	if err != nil {
		return m, fmt.Errorf("run %s did not end: last %+v", run.ID, rec)
	}
	if rec.Status != "succeeded" {
		return m, fmt.Errorf("run %s: %s %s %s\n%s", run.ID, rec.Status, rec.ErrorCode, rec.Error, logText(ctx, pc, run.ID))
	}
	if rec.CreatedAt == nil || rec.StartedAt == nil || rec.FinishedAt == nil {
		return m, fmt.Errorf("run %s: Paperclip's record lacks a time: %+v", run.ID, rec)
	}
	m.created, m.started, m.finished = *rec.CreatedAt, *rec.StartedAt, *rec.FinishedAt
	recs, err := readLog(ctx, pc, run.ID)
	if err != nil {
		return m, err
	}
	for _, r := range recs {
		if r.Stream != "stdout" {
			continue
		}
		if at, ok := stampOf(r.Chunk); ok {
			m.written, m.inPaperclip = at, r.TS
			break
		}
	}
	if m.inPaperclip.IsZero() {
		return m, fmt.Errorf("run %s: the agent's first line is not in Paperclip's run log\n%s", run.ID, logText(ctx, pc, run.ID))
	}
	m.job, m.pod, m.bound, m.shown = w.marks(run.ID)
	if _, err := stages(m); err != nil {
		return m, fmt.Errorf("run %s: %w", run.ID, err)
	}
	return m, nil
}

// runRecord is the part of Paperclip's heartbeat run the bench reads.
type runRecord struct {
	Status     string     `json:"status"`
	Error      string     `json:"error"`
	ErrorCode  string     `json:"errorCode"`
	CreatedAt  *time.Time `json:"createdAt"`
	StartedAt  *time.Time `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt"`
}

// logRecord is one record of a run's log as Paperclip stores it, with the
// time it recorded it.
type logRecord struct {
	TS     time.Time `json:"ts"`
	Stream string    `json:"stream"`
	Chunk  string    `json:"chunk"`
}

func readLog(ctx context.Context, pc *harness.Paperclip, id string) ([]logRecord, error) {
	var page struct {
		Content string `json:"content"`
	}
	if err := pc.Do(ctx, http.MethodGet, fmt.Sprintf("/api/heartbeat-runs/%s/log?offset=0&limitBytes=4194304", url.PathEscape(id)), nil, &page); err != nil {
		return nil, err
	}
	var out []logRecord
	sc := bufio.NewScanner(strings.NewReader(page.Content))
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	for sc.Scan() {
		var r logRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// stampOf reads the fake agent's written_at from a chunk holding its
// first line (a chunk may hold several lines).
func stampOf(chunk string) (time.Time, bool) {
	for _, line := range strings.Split(chunk, "\n") {
		var ev struct {
			WrittenAt time.Time `json:"written_at"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && !ev.WrittenAt.IsZero() {
			return ev.WrittenAt, true
		}
	}
	return time.Time{}, false
}

func logText(ctx context.Context, pc *harness.Paperclip, id string) string {
	recs, err := readLog(ctx, pc, id)
	var b strings.Builder
	fmt.Fprintf(&b, "Paperclip's log of run %s (%d records, err %v):\n", id, len(recs), err)
	for _, r := range recs {
		fmt.Fprintf(&b, "  %s %s: %s\n", r.TS.Format("15:04:05.000"), r.Stream, strings.TrimRight(r.Chunk, "\n"))
	}
	return b.String()
}

// loadAverage is the machine's load average, as uptime says it.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], ", ")
}

// runWatch watches every agent Job and pod (labeled with a run id) and
// keeps, per run, when it first saw the Job, the pod and the pod bound.
type runWatch struct {
	cs kubernetes.Interface
	mu sync.Mutex
	// seen[run]: job, pod, bound, the agent's container shown started.
	seen map[string]*[4]time.Time
	// ready: both watches are open (the first runs are seen whole).
	ready sync.WaitGroup
}

func newRunWatch(cs kubernetes.Interface) *runWatch {
	w := &runWatch{cs: cs, seen: map[string]*[4]time.Time{}}
	w.ready.Add(2)
	return w
}

func (w *runWatch) note(run string, i int, at time.Time) {
	if run == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.seen[run]
	if s == nil {
		s = new([4]time.Time)
		w.seen[run] = s
	}
	if s[i].IsZero() {
		s[i] = at
	}
}

func (w *runWatch) marks(run string) (job, pod, bound, shown time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.seen[run]; s != nil {
		return s[0], s[1], s[2], s[3]
	}
	return
}

func (w *runWatch) run(ctx context.Context) {
	sel := metav1.ListOptions{LabelSelector: contract.LabelRunID}
	go w.loop(ctx, func(ctx context.Context, rv string) (watch.Interface, error) {
		o := sel
		o.ResourceVersion = rv
		return w.cs.BatchV1().Jobs("").Watch(ctx, o)
	})
	w.loop(ctx, func(ctx context.Context, rv string) (watch.Interface, error) {
		o := sel
		o.ResourceVersion = rv
		return w.cs.CoreV1().Pods("").Watch(ctx, o)
	})
}

// loop watches from now on, again from where it was when a watch ends.
func (w *runWatch) loop(ctx context.Context, open func(context.Context, string) (watch.Interface, error)) {
	rv := ""
	opened := false
	for ctx.Err() == nil {
		wi, err := open(ctx, rv)
		if err != nil {
			rv = ""
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if !opened {
			opened = true
			w.ready.Done()
		}
		for ev := range wi.ResultChan() {
			at := time.Now()
			switch o := ev.Object.(type) {
			case *batchv1.Job:
				rv = o.ResourceVersion
				w.note(o.Labels[contract.LabelRunID], 0, at)
			case *corev1.Pod:
				rv = o.ResourceVersion
				run := o.Labels[contract.LabelRunID]
				w.note(run, 1, at)
				if o.Spec.NodeName != "" {
					w.note(run, 2, at)
				}
				for _, st := range o.Status.ContainerStatuses {
					if st.State.Running != nil || st.State.Terminated != nil {
						w.note(run, 3, at)
					}
				}
			case *metav1.Status:
				rv = "" // expired: from now on
			}
		}
		wi.Stop()
	}
}
