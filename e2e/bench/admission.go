package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/templates"
)

// The four ways a Job can be admitted that users compare.
const (
	scBaseline = "baseline"
	scMutating = "mutating"
	scBoth     = "both"
	scMAP      = "map"
	scCompiled = "compiled"
	// scCompiledBoth is design (a): the compiled policies complete the
	// Job, the mutating webhook is not called for it, the validating one
	// judges it (the rendered rule among the others) and takes the claim.
	scCompiledBoth = "compiled-validate"
	// scQueued is design (b), Queue mode: the compiled policies complete
	// the Job suspended and queued, no webhook is called on the create,
	// and the claim controller starts it through the validating webhook
	// (start check and claim). Its creation cells run with clipjob
	// stopped: creates need none of it, and a running claim controller
	// would start every measured Job (each a new agent's).
	scQueued = "queued"
)

var scenarioLabels = map[string]string{
	scBaseline:     "no admission, client sends the complete Job",
	scMutating:     "clipjob mutating webhook only",
	scBoth:         "clipjob mutating + validating (claim)",
	scMAP:          "MutatingAdmissionPolicy equivalent",
	scCompiled:     "clipjob's compiled MutatingAdmissionPolicies",
	scCompiledBoth: "compiled policies + validating webhook (claim)",
	scQueued:       "Queue mode, design (b): compiled policies, judged and claimed at start",
}

// Measured in this order in round 0, rotated by one each round, so no
// scenario always runs first (on a cold API server) or last.
var scenarioOrder = []string{scBaseline, scMutating, scBoth, scMAP, scCompiled, scCompiledBoth, scQueued}

// cell is one scenario at one concurrency in one round.
type cell struct {
	scenario   string
	conc       int
	round      int
	ok, errs   int
	lat        []time.Duration
	wall       time.Duration
	apiserver  scrapeDelta // the API server's metrics over the cell
	webhookObs scrapeDelta // clipjob-webhook's metrics over the cell
}

type scrapeDelta struct{ before, after scrape }

func (d scrapeDelta) histogram(name string, match map[string]string) histogram {
	if d.before == nil || d.after == nil {
		return histogram{}
	}
	return d.after.histogram(name, match).minus(d.before.histogram(name, match))
}

func (c cell) pct(p float64) time.Duration { return pctOf(c.lat, p) }

// pctOf is the p-quantile of lat (nearest rank), 0 for none.
func pctOf(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func (c cell) throughput() float64 { return float64(len(c.lat)) / c.wall.Seconds() }

// admissionBench switches the cluster between the scenarios and creates n
// suspended agent Jobs per cell.
type admissionBench struct {
	cs        kubernetes.Interface
	webhook   *harness.Webhook
	caBundle  []byte
	n         int
	complete  func(bare *batchv1.Job) (*batchv1.Job, error)
	mapPolicy []byte
	// compiled: clipjob's policies compiled from the cluster's source;
	// compiledQueue the same in Queue mode.
	compiled, compiledQueue []compile.Policy
	// lastInvalid is why the last probe's Job was refused as invalid.
	lastInvalid error
	// profile: take a CPU profile of the webhook (at pprofAddr, into
	// profileFile) over the next cell; its top goes to profileTop.
	profile                bool
	pprofAddr, profileFile string
	profileTop             string
	// unsuspended: for queued runs, create → the unsuspend admitted.
	unsuspended []time.Duration
}

func newAdmissionBench(cs kubernetes.Interface, wh *harness.Webhook, caBundle []byte, n int) (*admissionBench, error) {
	complete, err := completer()
	if err != nil {
		return nil, err
	}
	mapPolicy, err := os.ReadFile(filepath.Join(harness.Root(), "examples", "map-equivalent.yaml"))
	if err != nil {
		return nil, err
	}
	compiled, err := compiledPolicies(cs, "")
	if err != nil {
		return nil, err
	}
	compiledQueue, err := compiledPolicies(cs, config.ModeQueue)
	if err != nil {
		return nil, err
	}
	return &admissionBench{cs: cs, webhook: wh, caBundle: caBundle, n: n, complete: complete, mapPolicy: mapPolicy,
		compiled: compiled, compiledQueue: compiledQueue}, nil
}

// compiledPolicies compiles clipjob's policies for the agent namespace
// from the cluster's source Deployment and the example config (in mode,
// when set), as a controller in the cluster would.
func compiledPolicies(cs kubernetes.Interface, mode config.ConcurrencyMode) ([]compile.Policy, error) {
	cfg, err := config.Load(filepath.Join(harness.Root(), "examples", "config.yaml"))
	if err != nil {
		return nil, err
	}
	if mode != "" {
		cfg = cfg.InMode(mode)
	}
	dep, err := cs.AppsV1().Deployments(cfg.Source.Namespace).Get(context.Background(), cfg.Source.Deployment, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	inh, err := templates.InheritFromDeployment(dep, cfg.Source)
	if err != nil {
		return nil, err
	}
	return compile.Mutating(compile.Input{Namespace: "paperclip", Inherited: inh, Config: cfg})
}

// completer renders, with clipjob's own core, the Job a client must send
// when nothing completes it: the baseline sends the same Job the webhook
// would have stored.
func completer() (func(*batchv1.Job) (*batchv1.Job, error), error) {
	cfg, err := config.Load(filepath.Join(harness.Root(), "examples", "config.yaml"))
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(harness.Root(), "examples", "paperclip.yaml"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	set, err := manifest.Read(f, config.TypeMeta)
	if err != nil {
		return nil, err
	}
	if len(set.Deployments) != 1 {
		return nil, errors.New("examples/paperclip.yaml: want one Deployment")
	}
	inh, err := templates.InheritFromDeployment(set.Deployments[0], cfg.Source)
	if err != nil {
		return nil, err
	}
	return func(bare *batchv1.Job) (*batchv1.Job, error) {
		res, err := templates.Render(templates.Input{Job: bare, Inherited: inh, Config: cfg})
		if err != nil {
			return nil, err
		}
		return res.Job, nil
	}, nil
}

func bareJob(name, agent, run string) *batchv1.Job {
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "paperclip", Labels: map[string]string{
			contract.LabelAgentID: agent, contract.LabelCompanyID: "bench", contract.LabelRunID: run, contract.LabelAdapterType: "claude_local"}},
		// Suspended, so the Job controller, scheduler and kwok do not
		// compete for the cores with what is measured: admission.
		Spec: batchv1.JobSpec{Suspend: ptr.To(true)},
	}
	job.Spec.Template.Spec.RestartPolicy = "Never"
	return job
}

// use switches the cluster to scenario s and waits until the API server
// admits as s does (its admission configuration follows a watch).
func (b *admissionBench) use(ctx context.Context, s string) error {
	if err := b.clear(ctx); err != nil {
		return err
	}
	switch s {
	case scMutating, scBoth:
		if err := harness.Register(ctx, b.cs, b.webhook.Addr, b.caBundle); err != nil {
			return err
		}
		if s == scMutating {
			if err := b.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, harness.ValidatingWebhookName, metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
	case scMAP:
		if err := b.applyMAP(ctx); err != nil {
			return err
		}
	case scCompiled:
		if err := b.applyCompiled(ctx, b.compiled); err != nil {
			return err
		}
	case scCompiledBoth, scQueued:
		policies := b.compiled
		if s == scQueued {
			policies = b.compiledQueue
			if err := harness.ApplyAgentRunsPolicy(ctx, b.cs); err != nil {
				return err
			}
		}
		if err := b.applyCompiled(ctx, policies); err != nil {
			return err
		}
		register := harness.RegisterForCompiledPolicies
		if s == scQueued {
			register = harness.RegisterForCompiledPoliciesInQueueMode
		}
		if err := register(ctx, b.cs, b.webhook.Addr, b.caBundle); err != nil {
			return err
		}
	}
	want := map[string]string{scBaseline: "none", scMutating: "webhook", scBoth: "webhook", scMAP: "map", scCompiled: "compiled",
		scCompiledBoth: "compiled", scQueued: "compiled, queued"}[s]
	var got string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got = b.probe(ctx)
		return got == want, nil
	})
	if err != nil {
		return fmt.Errorf("switching to %s: a dry-run bare Job is completed by %q, want %q (last refusal: %v)", s, got, want, b.lastInvalid)
	}
	// The validating configuration has no dry-run probe of its own that
	// the mutating one would not also pass; its watch event arrived with
	// or before the mutating one's. A second covers the slowest informer.
	time.Sleep(time.Second)
	return nil
}

// probe says what completes a bare Job now: "none", "webhook", "map" or
// "compiled" (the compiled policies store what the webhook stores: the
// webhook's request count tells them apart).
func (b *admissionBench) probe(ctx context.Context) string {
	job := bareJob("probe", "probe", "probe")
	calls, _ := b.webhook.Counter("clipjob_admission_requests_total", `webhook="mutate"`)
	got, err := b.cs.BatchV1().Jobs("paperclip").Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	after, _ := b.webhook.Counter("clipjob_admission_requests_total", `webhook="mutate"`)
	switch {
	case err != nil && apierrors.IsInvalid(err):
		b.lastInvalid = err
		return "none"
	case err != nil:
		return "error: " + err.Error()
	case strings.Contains(got.Annotations["clipjob.paperclip.io/source"], " inherited ") && after == calls && got.Annotations[contract.AnnotationQueued] == "true":
		return "compiled, queued"
	case strings.Contains(got.Annotations["clipjob.paperclip.io/source"], " inherited ") && after == calls:
		return "compiled"
	case strings.Contains(got.Annotations["clipjob.paperclip.io/source"], " inherited "):
		return "webhook"
	case got.Annotations["clipjob.paperclip.io/source"] != "":
		return "map"
	}
	return "none"
}

func (b *admissionBench) clear(ctx context.Context) error {
	ar := b.cs.AdmissionregistrationV1()
	for _, del := range []error{
		ar.MutatingWebhookConfigurations().Delete(ctx, harness.MutatingWebhookName, metav1.DeleteOptions{}),
		ar.ValidatingWebhookConfigurations().Delete(ctx, harness.ValidatingWebhookName, metav1.DeleteOptions{}),
		ar.MutatingAdmissionPolicyBindings().Delete(ctx, "clipjob-map-equivalent", metav1.DeleteOptions{}),
		ar.MutatingAdmissionPolicies().Delete(ctx, "clipjob-map-equivalent", metav1.DeleteOptions{}),
		harness.DeleteAgentRunsPolicy(ctx, b.cs),
	} {
		if del != nil && !apierrors.IsNotFound(del) {
			return del
		}
	}
	return harness.DeleteCompiledPolicies(ctx, b.cs)
}

// applyCompiled creates compiled policies and their bindings.
func (b *admissionBench) applyCompiled(ctx context.Context, policies []compile.Policy) error {
	ar := b.cs.AdmissionregistrationV1()
	for _, p := range policies {
		if _, err := ar.MutatingAdmissionPolicies().Create(ctx, p.Policy, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("policy %s: %w", p.Policy.Name, err)
		}
		if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, p.Binding, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// applyMAP creates examples/map-equivalent.yaml's policy and binding.
func (b *admissionBench) applyMAP(ctx context.Context) error {
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b.mapPolicy)))
	for {
		doc, err := docs.Read()
		if err != nil {
			break
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return err
		}
		ar := b.cs.AdmissionregistrationV1()
		switch meta.Kind {
		case "MutatingAdmissionPolicy":
			var p admissionregistrationv1.MutatingAdmissionPolicy
			if err := yaml.UnmarshalStrict(doc, &p); err != nil {
				return fmt.Errorf("examples/map-equivalent.yaml: %w", err)
			}
			if _, err := ar.MutatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{}); err != nil {
				return err
			}
		case "MutatingAdmissionPolicyBinding":
			var p admissionregistrationv1.MutatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict(doc, &p); err != nil {
				return fmt.Errorf("examples/map-equivalent.yaml: %w", err)
			}
			if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, &p, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameMutation fails unless the MAP and the webhook complete a bare Job
// into the same pod (what the comparison claims): both are dry-run
// through the API server and compared on the fields that make the pod.
func (b *admissionBench) sameMutation(ctx context.Context) error {
	pods := map[string][]byte{}
	for _, s := range []string{scMutating, scMAP} {
		if err := b.use(ctx, s); err != nil {
			return err
		}
		job, err := b.cs.BatchV1().Jobs("paperclip").Create(ctx, bareJob("same", "same", "same"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		labels := job.Spec.Template.Labels
		for _, k := range []string{batchv1.ControllerUidLabel, "controller-uid"} {
			delete(labels, k) // the API server's, new for each Job
		}
		spec := job.Spec.Template.Spec
		c := spec.Containers[0]
		c.Command = nil // the MAP's is the profile's command without per-run options
		pods[s], err = yaml.Marshal([]any{c, spec.SecurityContext, spec.Volumes, spec.ImagePullSecrets,
			labels, spec.AutomountServiceAccountToken, job.Spec.BackoffLimit, job.Spec.TTLSecondsAfterFinished,
			job.Annotations[contract.AnnotationCreatedBy]})
		if err != nil {
			return err
		}
	}
	if !bytes.Equal(pods[scMutating], pods[scMAP]) {
		return fmt.Errorf("examples/map-equivalent.yaml no longer makes the pod the webhook makes; update it.\nwebhook:\n%s\nMAP:\n%s", pods[scMutating], pods[scMAP])
	}
	return b.sameCompiled(ctx)
}

// sameCompiled fails unless the compiled policies store the whole Job the
// webhook stores (the e2e suite holds this for every fixture; the bench
// checks the Job it measures with).
func (b *admissionBench) sameCompiled(ctx context.Context) error {
	jobs := map[string][]byte{}
	for _, s := range []string{scMutating, scCompiled} {
		if err := b.use(ctx, s); err != nil {
			return err
		}
		job, err := b.cs.BatchV1().Jobs("paperclip").Create(ctx, bareJob("same", "same", "same"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		job.UID, job.CreationTimestamp, job.ManagedFields, job.Spec.Selector = "", metav1.Time{}, nil, nil
		for _, k := range []string{batchv1.ControllerUidLabel, "controller-uid"} {
			delete(job.Spec.Template.Labels, k)
		}
		if jobs[s], err = yaml.Marshal(job); err != nil {
			return err
		}
	}
	if !bytes.Equal(jobs[scMutating], jobs[scCompiled]) {
		return fmt.Errorf("the compiled policies store another Job than the webhook:\nwebhook:\n%s\ncompiled:\n%s", jobs[scMutating], jobs[scCompiled])
	}
	return nil
}

// run measures one cell.
func (b *admissionBench) run(ctx context.Context, s string, conc, round int) (cell, error) {
	if err := b.use(ctx, s); err != nil {
		return cell{}, err
	}
	if s == scQueued {
		// Creates need nothing of clipjob; a claim controller would start
		// every Job measured. Its Jobs go before clipjob is back.
		b.webhook.Stop()
		defer func() {
			if err := b.deleteJobs(ctx, cellPrefix(s, conc, round)); err != nil {
				fmt.Fprintln(os.Stderr, "bench: deleting the queued cell's Jobs:", err)
			}
			if err := b.webhook.Start(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "bench: restarting the webhook:", err)
			}
		}()
	}
	prefix := cellPrefix(s, conc, round)
	jobs := make([]*batchv1.Job, b.n+20)
	for i := range jobs {
		name := fmt.Sprintf("%s-%04d", prefix, i)
		jobs[i] = bareJob(name, name, name)
		if s == scBaseline {
			full, err := b.complete(jobs[i])
			if err != nil {
				return cell{}, err
			}
			jobs[i] = full
		}
	}
	// Warm the API server's connections to what admits (not measured).
	if _, err := b.create(ctx, jobs[b.n:], min(conc, 10)); err != nil {
		return cell{}, err
	}
	c := cell{scenario: s, conc: conc, round: round}
	var err error
	if c.apiserver.before, err = apiServerMetrics(ctx, b.cs); err != nil {
		return c, err
	}
	webhookUp := s != scQueued
	if webhookUp {
		if c.webhookObs.before, err = httpMetrics(b.webhook.MetricsAddr); err != nil {
			return c, err
		}
	}
	var profiled <-chan string
	if b.profile {
		profiled = profileCPU(b.pprofAddr, b.profileFile, 2*time.Second)
	}
	r, err := b.create(ctx, jobs[:b.n], conc)
	if err != nil {
		return c, err
	}
	if profiled != nil {
		b.profileTop = <-profiled
	}
	c.ok, c.errs, c.lat, c.wall = r.ok, r.errs, r.lat, r.wall
	if c.apiserver.after, err = apiServerMetrics(ctx, b.cs); err != nil {
		return c, err
	}
	if webhookUp {
		if c.webhookObs.after, err = httpMetrics(b.webhook.MetricsAddr); err != nil {
			return c, err
		}
	}
	return c, nil
}

// cellPrefix names a cell's Jobs.
func cellPrefix(s string, conc, round int) string { return fmt.Sprintf("%s-c%d-r%d", s, conc, round) }

// deleteJobs deletes the Jobs whose names start with prefix.
func (b *admissionBench) deleteJobs(ctx context.Context, prefix string) error {
	list, err := b.cs.BatchV1().Jobs("paperclip").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	bg := metav1.DeletePropagationBackground
	for _, j := range list.Items {
		if strings.HasPrefix(j.Name, prefix+"-") {
			if err := b.cs.BatchV1().Jobs("paperclip").Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

type createResult struct {
	ok, errs int
	lat      []time.Duration
	wall     time.Duration
}

// create sends jobs with conc concurrent clients; any refusal is an error
// (every Job is a new agent's first run).
func (b *admissionBench) create(ctx context.Context, jobs []*batchv1.Job, conc int) (createResult, error) {
	var r createResult
	var mu sync.Mutex
	var firstErr error
	next := make(chan *batchv1.Job)
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for job := range next {
				t0 := time.Now()
				_, err := b.cs.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{})
				d := time.Since(t0)
				mu.Lock()
				r.lat = append(r.lat, d)
				if err == nil {
					r.ok++
				} else {
					r.errs++
					if firstErr == nil {
						firstErr = err
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	r.wall = time.Since(start)
	if r.errs > 0 {
		return r, fmt.Errorf("%d of %d creates failed; first: %w", r.errs, len(jobs), firstErr)
	}
	return r, nil
}

// startLatency measures what a user waits for: from the create call to
// the agent pod's Running event, for k Jobs of new agents created one
// after another in scenario s (not suspended: the Job controller, the
// scheduler and kwok take part). Each Job is deleted once measured.
func (b *admissionBench) startLatency(ctx context.Context, s string, round, k int) ([]time.Duration, error) {
	if err := b.use(ctx, s); err != nil {
		return nil, err
	}
	w, err := b.cs.CoreV1().Pods("paperclip").Watch(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	running := make(chan string, 4*k)
	go func() {
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && pod.Status.Phase == corev1.PodRunning {
				running <- pod.Labels[contract.LabelRunID]
			}
		}
	}()
	// A queued run's way to Running has clipjob's part (create → the
	// claim controller's unsuspend admitted) and the Job controller's,
	// the scheduler's and the kubelet's after it, as every scenario's.
	var unsuspended chan string
	if s == scQueued {
		jw, err := b.cs.BatchV1().Jobs("paperclip").Watch(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID})
		if err != nil {
			return nil, err
		}
		defer jw.Stop()
		unsuspended = make(chan string, 4*k)
		go func() {
			for ev := range jw.ResultChan() {
				if j, ok := ev.Object.(*batchv1.Job); ok && ev.Type == watch.Modified && (j.Spec.Suspend == nil || !*j.Spec.Suspend) {
					unsuspended <- j.Labels[contract.LabelRunID]
				}
			}
		}()
	}
	var lat []time.Duration
	for i := range k {
		name := fmt.Sprintf("start-%s-r%d-%03d", s, round, i)
		job := bareJob(name, name, name)
		job.Spec.Suspend = nil
		if s == scBaseline {
			if job, err = b.complete(job); err != nil {
				return nil, err
			}
		}
		t0 := time.Now()
		if _, err := b.cs.BatchV1().Jobs("paperclip").Create(ctx, job, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating %s: %w", name, err)
		}
		if unsuspended != nil {
			if err := waitRunning(ctx, unsuspended, name); err != nil {
				return nil, fmt.Errorf("unsuspending: %w", err)
			}
			b.unsuspended = append(b.unsuspended, time.Since(t0))
		}
		if err := waitRunning(ctx, running, name); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
		bg := metav1.DeletePropagationBackground
		if err := b.cs.BatchV1().Jobs("paperclip").Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
			return nil, err
		}
	}
	return lat, nil
}

// waitRunning waits for run's pod to be seen Running (events of earlier
// runs' pods are skipped).
func waitRunning(ctx context.Context, running <-chan string, run string) error {
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case got := <-running:
			if got == run {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("the pod of %s was not Running within 2 minutes", run)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
