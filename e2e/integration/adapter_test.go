package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// The Paperclip adapter (adapters/paperclip) against the real control
// plane, webhooks and relay: test/e2e-run.mjs plays the Paperclip server,
// calling the built adapter's execute() with a fake run context, and
// prints every onLog call, the onMeta call and the result as JSON lines.
// The adapter runs with a kubeconfig of a ServiceAccount holding exactly
// the Role its README documents, and a token of that account for the
// relay's audience, as a Paperclip server's pod would hold them.

// adapterLog is one onLog call (or, with Meta or Result, the onMeta call
// or execute's result).
type adapterLog struct {
	Stream string         `json:"stream"`
	Line   string         `json:"line"`
	Meta   map[string]any `json:"meta"`
	Result *adapterResult `json:"result"`
	// Environment is testEnvironment's result (mode "testEnvironment").
	Environment *adapterEnvironment `json:"environment"`
}

// adapterEnvironment is Paperclip's AdapterEnvironmentTestResult.
type adapterEnvironment struct {
	Status string
	Checks []struct{ Code, Level, Message, Hint string }
}

// adapterResult is the part of Paperclip's AdapterExecutionResult the
// tests read; JSON null reads as the zero value.
type adapterResult struct {
	ExitCode      *int
	Signal        string
	TimedOut      bool
	ErrorCode     string
	ErrorMessage  string
	ErrorMeta     map[string]any
	Usage         *struct{ InputTokens, OutputTokens int }
	CostUSD       *float64 `json:"costUsd"`
	Model         string
	Provider      string
	Summary       string
	SessionID     string
	SessionParams map[string]any
	ResultJSON    map[string]any `json:"resultJson"`
}

// clipjob is resultJson.clipjob: what the relay said about the run's end.
func (r *adapterResult) clipjob() map[string]any {
	m, _ := r.ResultJSON["clipjob"].(map[string]any)
	return m
}

// adapterRun is one execute() of the adapter in a node process.
type adapterRun struct {
	spec   harness.AdapterSpec
	stderr bytes.Buffer // node's own stderr; read once done is closed

	mu     sync.Mutex
	logs   []adapterLog
	meta   map[string]any
	result *adapterResult
	env    *adapterEnvironment

	done    chan struct{}
	exitErr error
	cmd     *exec.Cmd
	stdin   io.WriteCloser // with spec.CancelOnStdinEnd: closing it cancels the run
}

// cancel cancels the run, as Paperclip's user does (spec.CancelOnStdinEnd).
func (a *adapterRun) cancel(t *testing.T) {
	t.Helper()
	if a.stdin == nil {
		t.Fatal("cancel: the run was started without CancelOnStdinEnd")
	}
	_ = a.stdin.Close()
}

// kill ends the adapter's process at once, as a Paperclip server that
// crashed or was rescheduled.
func (a *adapterRun) kill() {
	_ = a.cmd.Process.Kill()
	<-a.done
}

// startAdapter runs the adapter for spec; it is killed when t ends.
func startAdapter(ctx context.Context, t *testing.T, spec harness.AdapterSpec) *adapterRun {
	t.Helper()
	a := &adapterRun{spec: spec, done: make(chan struct{})}
	specFile := filepath.Join(t.TempDir(), "spec.json")
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(harness.NodeBin(t), "node"), filepath.Join("test", "e2e-run.mjs"), specFile)
	cmd.Dir = harness.AdapterDir()
	cmd.Stderr = &a.stderr
	if spec.CancelOnStdinEnd {
		if a.stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.cmd = cmd
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			var l adapterLog
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l = adapterLog{Stream: "unparsed", Line: sc.Text()}
			}
			a.mu.Lock()
			switch {
			case l.Result != nil:
				a.result = l.Result
			case l.Environment != nil:
				a.env = l.Environment
			case l.Meta != nil:
				a.meta = l.Meta
			default:
				a.logs = append(a.logs, l)
			}
			a.mu.Unlock()
		}
		a.exitErr = cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			_ = cmd.Process.Kill()
			<-a.done
		}
	})
	return a
}

// lines are the chunks the adapter handed to onLog on stream.
func (a *adapterRun) lines(stream string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, l := range a.logs {
		if l.Stream == stream {
			out = append(out, l.Line)
		}
	}
	return out
}

// stdout is what the adapter handed on as the agent's output.
func (a *adapterRun) stdout() []string { return a.lines("stdout") }

func (a *adapterRun) exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// describe says where the run stands, for a failure message.
func (a *adapterRun) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "adapter run %s: %d stdout lines", a.spec.RunID, len(a.stdout()))
	for _, n := range a.lines("stderr") {
		fmt.Fprintf(&b, "\n  notice: %s", n)
	}
	if a.exited() {
		a.mu.Lock()
		res := a.result
		a.mu.Unlock()
		fmt.Fprintf(&b, "\n  exited: %v; result %+v\n  node stderr: %s", a.exitErr, res, a.stderr.String())
	}
	return b.String()
}

// waitStdout waits until the adapter has handed on at least n lines of
// the agent's output.
func (a *adapterRun) waitStdout(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if len(a.stdout()) >= n {
			return true, nil
		}
		if a.exited() {
			return false, errors.New("the adapter ended first")
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for %d lines through onLog: %v\n%s", n, err, a.describe())
	}
}

// wait waits for execute() to return and gives its result.
func (a *adapterRun) wait(ctx context.Context, t *testing.T) *adapterResult {
	t.Helper()
	select {
	case <-a.done:
	case <-ctx.Done():
		t.Fatalf("the adapter did not return: %v\n%s", ctx.Err(), a.describe())
	}
	a.mu.Lock()
	res := a.result
	a.mu.Unlock()
	if (res == nil && a.env == nil) || a.exitErr != nil {
		t.Fatalf("no result from the adapter\n%s", a.describe())
	}
	return res
}

// jobOfRun waits for the Job the adapter created for its run (found by
// the run-id label, as nothing else names it to the test).
func jobOfRun(in *harness.Install, ctx context.Context, t *testing.T, a *adapterRun) *batchv1.Job {
	t.Helper()
	var job *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		jobs, err := suite.cs.BatchV1().Jobs(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + a.spec.RunID})
		if err == nil && len(jobs.Items) > 0 {
			job = &jobs.Items[0]
			return true, nil
		}
		if a.exited() {
			return false, errors.New("the adapter ended first")
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the Job of run %s: %v\n%s", a.spec.RunID, err, a.describe())
	}
	return job
}

// runSecrets are the Secrets labeled for run.
func runSecrets(in *harness.Install, ctx context.Context, t *testing.T, run string) []string {
	t.Helper()
	list, err := suite.cs.CoreV1().Secrets(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + run})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	return names
}

// blockedBy checks a run refused because holder is the agent's active
// run: no Job and no Secret of its own left behind.
func blockedBy(in *harness.Install, ctx context.Context, t *testing.T, a *adapterRun, holder string) *adapterResult {
	t.Helper()
	res := a.wait(ctx, t)
	if res.ErrorCode != "k8s_concurrent_run_blocked" || res.ErrorMeta["holderRunId"] != holder {
		t.Errorf("run %s: want k8s_concurrent_run_blocked with holderRunId %s, got %s %q (meta %v)\n%s",
			a.spec.RunID, holder, res.ErrorCode, res.ErrorMessage, res.ErrorMeta, a.describe())
	}
	if len(a.stdout()) != 0 {
		t.Errorf("run %s was blocked but handed on agent output %q", a.spec.RunID, a.stdout())
	}
	jobs, err := suite.cs.BatchV1().Jobs(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + a.spec.RunID})
	if err != nil || len(jobs.Items) != 0 {
		t.Errorf("run %s was blocked, yet Jobs %v (%v)", a.spec.RunID, jobs, err)
	}
	if left := runSecrets(in, ctx, t, a.spec.RunID); len(left) != 0 {
		t.Errorf("run %s was blocked and left its Secrets %v", a.spec.RunID, left)
	}
	return res
}

// checkSucceeded checks the result of a run whose agent wrote harness.ClaudeInit
// and last harness.ClaudeResult(text) and exited 0, run by Job job.
func checkSucceeded(in *harness.Install, t *testing.T, res *adapterResult, run string, job *batchv1.Job, text string) {
	t.Helper()
	cj := res.clipjob()
	if res.ErrorCode != "" || res.ErrorMessage != "" || res.ExitCode == nil || *res.ExitCode != 0 || res.TimedOut {
		t.Errorf("run %s: want success with exit 0, got code %q %q, exit %v", run, res.ErrorCode, res.ErrorMessage, res.ExitCode)
	}
	if res.SessionID != "sess-e2e" || res.SessionParams["sessionId"] != "sess-e2e" || res.Model != "claude-sonnet-4-5" || res.Provider != "anthropic" {
		t.Errorf("run %s: session %q (params %v), model %q, provider %q; want sess-e2e, claude-sonnet-4-5, anthropic",
			run, res.SessionID, res.SessionParams, res.Model, res.Provider)
	}
	if res.Summary != text || res.CostUSD == nil || *res.CostUSD != 0.42 || res.Usage == nil || res.Usage.InputTokens != 10 || res.Usage.OutputTokens != 20 {
		t.Errorf("run %s: summary %q, cost %v, usage %+v; want %q, 0.42, 10 in and 20 out", run, res.Summary, res.CostUSD, res.Usage, text)
	}
	raw, _ := res.ResultJSON["raw"].(map[string]any)
	if raw["type"] != "result" || raw["result"] != text || cj["outcome"] != "succeeded" || cj["phase"] != "Succeeded" ||
		cj["run"] != run || cj["job"] != in.Namespace+"/"+job.Name {
		t.Errorf("run %s: resultJson %v", run, res.ResultJSON)
	}
}

// TestPaperclipAdapterRunsAnAgent: the adapter submits a bare Job that
// clipjob completes, follows the agent's output through the relay (every
// line through onLog once and in order) and returns the result of its
// final line. While the run goes on, a second run of the agent for
// another task is blocked (the adapter sees the running run at the relay)
// and so is one that does not look (clipjob's claim answers 409 with the
// holder), neither leaving anything behind; and a server restarted
// mid-run re-attaches to the run instead of starting another.
func TestPaperclipAdapterRunsAnAgent(t *testing.T) {
	in := newInstall(t)
	const agent, run = "agent-e2e-pc", "e2e-pc-run"
	spec := paperclipServer(in, t, agent, run)
	ctx := ctxT(t)
	spec.TaskID = "task-1"
	a := startAdapter(ctx, t, spec)

	job := jobOfRun(in, ctx, t, a)
	if got := job.Spec.Template.Annotations[contract.AnnotationPrompt]; got != "Fix the failing test, "+agent+"." {
		t.Errorf("prompt annotation %q: want the rendered prompt template", got)
	}
	if job.Labels[contract.LabelAdapterType] != "claude_local" || job.Labels[contract.LabelCompanyID] != "e2e-company" ||
		job.Labels[contract.LabelTaskID] != "task-1" || job.Labels[contract.LabelAgentID] != agent {
		t.Errorf("Job labels %v", job.Labels)
	}
	if job.Annotations["clipjob.paperclip.io/profile"] != "claude_local" || len(job.Spec.Template.Spec.Containers) == 0 {
		t.Errorf("the Job was not completed by clipjob: annotations %v, %d containers", job.Annotations, len(job.Spec.Template.Spec.Containers))
	}
	// The run's env Secret is one clipjob takes: the Job comes to own it.
	envSecret := job.Annotations[contract.AnnotationEnvSecret]
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := suite.cs.CoreV1().Secrets(in.Namespace).Get(ctx, envSecret, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == job.UID }), nil
	})
	if err != nil {
		t.Errorf("the run's env Secret %q never came to be owned by its Job", envSecret)
	}

	pod := in.WaitPod(ctx, t, job.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{harness.ClaudeInit, `{"type":"assistant","message":{"content":[{"type":"text","text":"working"}]}}`, "plain progress line"}
	if err := log.Write(lines...); err != nil {
		t.Fatal(err)
	}
	// Handed on: the relay follows the run, and lists it as the agent's.
	a.waitStdout(ctx, t, len(lines))

	otherTask := paperclipServer(in, t, agent, "e2e-pc-run-other-task")
	otherTask.TaskID = "task-2"
	noLook := paperclipServer(in, t, agent, "e2e-pc-run-no-reattach")
	noLook.Config = map[string]any{"reattach": false}
	restarted := paperclipServer(in, t, agent, run)
	restarted.TaskID = "task-1"
	b, c, d := startAdapter(ctx, t, otherTask), startAdapter(ctx, t, noLook), startAdapter(ctx, t, restarted)

	t.Run("a run for another task is refused by clipjob while the running one holds the agent", func(t *testing.T) {
		res := blockedBy(in, ctx, t, b, run)
		if res.ErrorMeta["holderJob"] != in.Namespace+"/"+job.Name {
			t.Errorf("errorMeta %v: want holderJob %s/%s", res.ErrorMeta, in.Namespace, job.Name)
		}
		if n := strings.Join(b.lines("stderr"), ""); !strings.Contains(n, "the agent's run "+run+" is another run: not re-attaching") {
			t.Errorf("notices %q: want one saying it did not re-attach to the agent's other run", n)
		}
	})
	t.Run("a second run is refused by clipjob's claim", func(t *testing.T) {
		res := blockedBy(in, ctx, t, c, run)
		if res.ErrorMeta["holderJob"] != in.Namespace+"/"+job.Name || res.ErrorMeta["httpStatus"] != float64(409) {
			t.Errorf("errorMeta %v: want holderJob %s/%s and httpStatus 409", res.ErrorMeta, in.Namespace, job.Name)
		}
	})

	// The restarted server has re-attached (and followed the run so far)
	// before the run ends.
	d.waitStdout(ctx, t, len(lines))
	lines = endRun(in, ctx, t, a, log, job, lines, "fixed it")
	if cmd, _ := a.meta["command"].(string); cmd != "clipjob bare Job "+in.Namespace+"/"+job.Name {
		t.Errorf("onMeta command %q", cmd)
	}

	t.Run("a restarted server re-attaches to the run", func(t *testing.T) {
		res := d.wait(ctx, t)
		harness.ExactlyOnce(t, d.stdout(), lines)
		checkSucceeded(in, t, res, run, job, "fixed it")
		if jobs, err := suite.cs.BatchV1().Jobs(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent}); err != nil || len(jobs.Items) != 1 {
			t.Errorf("the agent's Jobs: %v (%v); want the one run's", jobs, err)
		}
		if n := d.lines("stderr"); !strings.Contains(strings.Join(n, "\n"), "re-attaching to the agent's running run "+run) {
			t.Errorf("notices %q: want one saying it re-attached", n)
		}
	})
}

// TestPaperclipAdapterFollowsAcrossRelayRestarts: the relay is stopped
// (a rolling update) while the agent writes on, started again, and later
// killed and started again; the adapter resumes its stream each time and
// hands on every line once and in order, then the result.
func TestPaperclipAdapterFollowsAcrossRelayRestarts(t *testing.T) {
	in := newInstall(t)
	const agent, run = "agent-e2e-pc-restart", "e2e-pc-restart"
	spec := paperclipServer(in, t, agent, run)
	r, _, _ := in.Relay(t)
	ctx := ctxT(t)
	a := startAdapter(ctx, t, spec)
	job := jobOfRun(in, ctx, t, a)
	pod := in.WaitPod(ctx, t, job.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := log.Write(harness.ClaudeInit); err != nil {
		t.Fatal(err)
	}
	// Lines come in bursts of three with one timestamp, which a resumed
	// stream must tell apart (writeLinesInBackground).
	want := writeLinesInBackground(t, log, 240, func(i int) {
		switch i {
		case 60:
			// The adapter has handed on all so far, mid-stream; the relay
			// goes while the agent writes on.
			a.waitStdout(ctx, t, 1+i)
			r.Stop()
		case 120:
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
		case 180:
			a.waitStdout(ctx, t, 1+i)
			r.Kill()
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	endRun(in, ctx, t, a, log, job, append([]string{harness.ClaudeInit}, want...), "survived two relay restarts")
}

// TestPaperclipAdapterCancelsARun: a run cancelled while its agent works
// has its Job deleted, its pod and both its Secrets gone with it, and
// returns cancelled, acknowledged. The agent's next run, started the
// moment the cancelled one returned (as Paperclip starts an agent's queued
// run), is admitted and runs a Job of its own, although the relay still
// lists the cancelled run as running then: it marks a run done once its
// streams have drained, DrainIdle after their last line. The cancelled
// agent's log goes on until the next run has decided (kwok serves a log
// past its pod's deletion), so the relay cannot have drained the run
// before, however slowly this machine starts the next run.
func TestPaperclipAdapterCancelsARun(t *testing.T) {
	in := newInstall(t)
	const agent, run, nextRun = "agent-e2e-pc-cancel", "e2e-pc-cancel", "e2e-pc-cancel-next"
	spec := paperclipServer(in, t, agent, run)
	ctx := ctxT(t)
	// A relay of its own that drains for 12 s (production's default is
	// 3 s, the suite's 1 s): what keeps the cancelled run listed as
	// running is the agent's log going on (below); the drain only adds to
	// it.
	bin := suite.relayBin
	slow, err := harness.StartRelay(ctx, suite.cluster, bin, in.Namespace+"-relay-adapter-cancel", in.Namespace, "--drain-idle", "12s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Stop)
	_, reader, _ := in.Relay(t)
	spec.RelayURL = "https://" + slow.APIAddr
	// Cancelled once its lines came through and its Secrets were seen.
	spec.CancelOnStdinEnd = true
	// The prompt by Secret too, so the run has two Secrets to see go.
	spec.Config = map[string]any{"promptAnnotationMaxBytes": 16}
	a := startAdapter(ctx, t, spec)
	job := jobOfRun(in, ctx, t, a)
	if got := job.Spec.Template.Annotations[contract.AnnotationPromptSecret]; got != job.Name+"-prompt" {
		t.Errorf("prompt Secret annotation %q, want %s-prompt", got, job.Name)
	}
	pod := in.WaitPod(ctx, t, job.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The agent works on, a line every 200 ms, until the test stops it:
	// after the cancel, until the next run has decided.
	var mu sync.Mutex
	written := []string{harness.ClaudeInit}
	if err := log.Write(harness.ClaudeInit); err != nil {
		t.Fatal(err)
	}
	writerDone, stopWriting := make(chan struct{}), make(chan struct{})
	var stopOnce sync.Once
	stopWriter := func() { stopOnce.Do(func() { close(stopWriting) }); <-writerDone }
	t.Cleanup(stopWriter)
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				return
			case <-time.After(200 * time.Millisecond):
			}
			l := fmt.Sprintf(`{"type":"assistant","message":{"content":[{"type":"text","text":"step %d"}]}}`, i)
			if log.Write(l) != nil {
				return
			}
			mu.Lock()
			written = append(written, l)
			mu.Unlock()
		}
	}()
	a.waitStdout(ctx, t, 2)
	if secrets := runSecrets(in, ctx, t, run); len(secrets) != 2 {
		t.Fatalf("the running run's Secrets: %v, want its env and prompt Secrets", secrets)
	}

	nextSpec := paperclipServer(in, t, agent, nextRun)
	nextSpec.RelayURL = spec.RelayURL
	a.cancel(t)
	res := a.wait(ctx, t)
	next := startAdapter(ctx, t, nextSpec)
	if r, code := slow.Run(t, reader, run); r == nil || r.Done {
		t.Fatalf("the relay already marked the cancelled run done (HTTP %d, %+v): the next run cannot meet it listed as running", code, r)
	}
	// The next run has decided once its Job exists: the agent stops.
	nextJob := jobOfRun(in, ctx, t, next)
	stopWriter()

	if res.ErrorCode != "cancelled" || res.Signal != "SIGTERM" {
		t.Errorf("cancelled run: code %q %q, signal %q; want cancelled, SIGTERM", res.ErrorCode, res.ErrorMessage, res.Signal)
	}
	if ack, _ := res.ResultJSON["executionCancellation"].(map[string]any); ack["state"] != "acknowledged" {
		t.Errorf("resultJson %v: want executionCancellation acknowledged", res.ResultJSON)
	}
	// What was handed on before the cancel: the agent's first lines, each
	// once and in order (the agent wrote on after).
	got := a.stdout()
	mu.Lock()
	if len(got) > len(written) {
		t.Errorf("%d lines handed on, %d written", len(got), len(written))
	} else {
		harness.ExactlyOnce(t, got, written[:len(got)])
	}
	mu.Unlock()
	// Gone once the adapter says so: it deleted the Job in the foreground.
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, job.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the cancelled run's Job: %v, want it deleted", err)
	}
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the cancelled run's pod: %v, want it deleted before the Job", err)
	}
	if left := runSecrets(in, ctx, t, run); len(left) != 0 {
		t.Errorf("the cancelled run's Secrets are still there: %v", left)
	}

	// The next run is admitted: it holds the agent's claim, and runs and
	// hands on only its own output.
	lease, err := suite.cs.CoordinationV1().Leases(in.Namespace).Get(ctx, claim.KeyFor(nextJob, in.LoadConfig(t).Policy.Concurrency).Name, metav1.GetOptions{})
	if err != nil || claim.HolderOf(lease).UID != string(nextJob.UID) {
		t.Errorf("the agent's claim after the cancel: %v %v, want it held by the next run's Job", lease, err)
	}
	if n := next.lines("stderr"); !slices.ContainsFunc(n, func(l string) bool {
		return strings.Contains(l, "the agent's run "+run+" is another run: not re-attaching")
	}) {
		t.Errorf("the next run's notices %q: want one saying it did not re-attach to the cancelled run", n)
	}
	nextPod := in.WaitPod(ctx, t, nextJob.Name, harness.Running)
	nextLog, err := suite.cluster.PodLog(ctx, in.Namespace, nextPod.Name)
	if err != nil {
		t.Fatal(err)
	}
	nextLines := []string{harness.ClaudeInit, harness.ClaudeResult("the next run")}
	if err := nextLog.Write(nextLines...); err != nil {
		t.Fatal(err)
	}
	in.FinishRun(ctx, t, nextJob.Name, "0")
	nextRes := next.wait(ctx, t)
	harness.ExactlyOnce(t, next.stdout(), nextLines)
	checkSucceeded(in, t, nextRes, nextRun, nextJob, "the next run")
}

// TestPaperclipAdapterIgnoresACopiedJob: someone else who may create Jobs
// in the agents' namespace puts an agent's labels (agent, company, task)
// on a Job of their own. The relay lists it as the agent's running run,
// but clipjob recorded who created it, so the agent's next run does not
// take it for its own (the hostile review's finding: it handed the copy's
// output, result and session on as the agent's): it hands on none of its
// output and is refused by clipjob's claim, which the copy holds.
func TestPaperclipAdapterIgnoresACopiedJob(t *testing.T) {
	in := newInstall(t)
	const agent, run = "agent-e2e-pc-copied", "e2e-pc-copied-victim"
	spec := paperclipServer(in, t, agent, run)
	spec.TaskID = "task-1"
	r, reader, _ := in.Relay(t)
	ctx := ctxT(t)
	copier := in.ClientAs(ctx, t, "e2e-label-copier", "create")
	copied := in.BareJob(t, "e2e-pc-copied")
	for k, v := range map[string]string{contract.LabelAgentID: agent, contract.LabelRunID: "e2e-pc-copied-run",
		contract.LabelCompanyID: "e2e-company", contract.LabelTaskID: "task-1"} {
		copied.Labels[k] = v
	}
	if _, err := copier.BatchV1().Jobs(in.Namespace).Create(ctx, copied, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.FinishRun(context.Background(), t, copied.Name, "0") })
	pod := in.WaitPod(ctx, t, copied.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := log.Write(harness.ClaudeInit, harness.ClaudeResult("forged result")); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got, _ := r.Run(t, reader, "e2e-pc-copied-run")
		return got != nil && got.LastSeq >= 2 && got.Agent == agent, nil
	})
	if err != nil {
		t.Fatalf("the relay never listed the copy as the agent's run: %v", err)
	}

	a := startAdapter(ctx, t, spec)
	blockedBy(in, ctx, t, a, "e2e-pc-copied-run")
	if n := strings.Join(a.lines("stderr"), ""); !strings.Contains(n, "the agent's run e2e-pc-copied-run is another run: not re-attaching") {
		t.Errorf("notices %q: want one saying the copy is another run, not followed", n)
	}
}

// TestPaperclipAdapterTestEnvironment: Paperclip's "Test environment"
// through the adapter against the real install: RBAC by
// SelfSubjectAccessReviews from the README's Role, a dry-run bare Job
// clipjob completes and records this server as the creator of, the relay
// taking the server's token; and a token the relay refuses is named.
func TestPaperclipAdapterTestEnvironment(t *testing.T) {
	in := newInstall(t)
	spec := paperclipServer(in, t, "", "")
	spec.Mode = "testEnvironment"
	ctx := ctxT(t)
	a := startAdapter(ctx, t, spec)
	a.wait(ctx, t)
	levels := map[string]string{}
	for _, c := range a.env.Checks {
		levels[c.Code] = c.Level
		if c.Code == "clipjob_created_by" && !strings.Contains(c.Message, "system:serviceaccount:"+in.Namespace+":") {
			t.Errorf("clipjob_created_by: %q, want this server's ServiceAccount", c.Message)
		}
	}
	want := map[string]string{"clipjob_kube_config": "info", "clipjob_rbac": "info", "clipjob_webhook": "info", "clipjob_created_by": "info", "clipjob_relay": "info"}
	if a.env.Status != "pass" || !maps.Equal(levels, want) {
		t.Errorf("testEnvironment: status %q, checks %+v; want pass with %v", a.env.Status, a.env.Checks, want)
	}

	// A token for the API server's audience, not the relay's.
	wrong, err := harness.ServiceAccountToken(ctx, suite.cluster, in.Namespace, "e2e-wrong-audience", nil)
	if err != nil {
		t.Fatal(err)
	}
	spec.RelayTokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(spec.RelayTokenFile, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startAdapter(ctx, t, spec)
	b.wait(ctx, t)
	var relayCheck string
	for _, c := range b.env.Checks {
		if c.Code == "clipjob_relay" && c.Level == "error" {
			relayCheck = c.Message
		}
	}
	if b.env.Status != "fail" || !strings.Contains(relayCheck, "refused the token") {
		t.Errorf("with a token of the wrong audience: status %q, checks %+v; want fail naming the refused token", b.env.Status, b.env.Checks)
	}
}

// TestPaperclipAdapterInQueueMode: with clipjob in Queue mode, a run of
// the agent for another task is admitted suspended and its adapter waits
// for it; the server restarts while it waits (the relay knows no pod of
// it yet), and the next run for that task re-attaches to the queued run
// (found among the agent's Jobs) instead of queueing a second one behind
// it. When the active run ends, clipjob starts the queued one and the
// re-attached adapter hands on its output and result.
func TestPaperclipAdapterInQueueMode(t *testing.T) {
	in := newInstall(t)
	const agent = "agent-e2e-pc-queue"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	a, jobA, podA, b, jobB := queuedBehind(in, ctx, t, agent, "e2e-pc-queue-1", "e2e-pc-queue-2")
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return slices.ContainsFunc(b.lines("stderr"), func(l string) bool { return strings.Contains(l, "queued by clipjob") }), nil
	})
	if err != nil {
		t.Fatalf("the queued run's adapter never said it was queued\n%s", b.describe())
	}
	b.kill() // the server restarts while the run waits

	// The restarted server runs the same run again (its Job is found by
	// the run's id among the agent's Jobs).
	retried := paperclipServer(in, t, agent, "e2e-pc-queue-2")
	retried.TaskID = "task-2"
	c := startAdapter(ctx, t, retried)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return slices.ContainsFunc(c.lines("stderr"), func(l string) bool {
			return strings.Contains(l, "re-attaching to the agent's queued run e2e-pc-queue-2")
		}), nil
	})
	if err != nil {
		t.Fatalf("the restarted server did not re-attach to the queued run\n%s", c.describe())
	}

	linesB := []string{harness.ClaudeInit, "the queued run works", harness.ClaudeResult("second done")}
	runQueuedAfter(in, ctx, t, a, jobA, podA, jobB, linesB)
	res := c.wait(ctx, t)
	harness.ExactlyOnce(t, c.stdout(), linesB)
	checkSucceeded(in, t, res, "e2e-pc-queue-2", jobB, "second done")
	jobs, err := suite.cs.BatchV1().Jobs(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent})
	if err != nil || len(jobs.Items) != 2 {
		t.Errorf("the agent's Jobs: %d (%v); want the two runs', no third", len(jobs.Items), err)
	}
}

// TestPaperclipAdapterKeepsARunWhoseIDAnotherJobTook: a queued run's id
// shows in its Job's labels. Someone who may only create Jobs starts one of
// another agent with that id first and prints a forged result (the hostile
// review's repro, which returned the forged result as the run's success).
// The relay keeps the id for the Job it saw first and the queued run's Job
// apart under its own key; the queued run's adapter asks for its Job's run
// (?job=<uid>), hands on none of the bait's output, and once the run
// starts, its own, to its own result.
func TestPaperclipAdapterKeepsARunWhoseIDAnotherJobTook(t *testing.T) {
	in := newInstall(t)
	const agent, victimRun = "agent-e2e-pc-runid", "e2e-pc-runid-victim"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	a, jobA, podA, v, jobV := queuedBehind(in, ctx, t, agent, "e2e-pc-runid-1", victimRun)

	taker := in.ClientAs(ctx, t, "e2e-runid-taker", "create")
	bait := in.BareJob(t, "e2e-pc-runid-bait")
	bait.Labels[contract.LabelAgentID] = "agent-e2e-pc-runid-evil"
	bait.Labels[contract.LabelRunID] = victimRun
	if _, err := taker.BatchV1().Jobs(in.Namespace).Create(ctx, bait, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := in.WaitPod(ctx, t, bait.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := log.Write(harness.ClaudeInit, "FORGED LINE", harness.ClaudeResult("FORGED: task done")); err != nil {
		t.Fatal(err)
	}
	in.FinishRun(ctx, t, bait.Name, "0")
	r, reader, _ := in.Relay(t)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got, _ := r.Run(t, reader, victimRun)
		return got != nil && got.Done, nil
	})
	if err != nil {
		t.Fatalf("the relay never finished the bait's run: %v", err)
	}

	// The active run ends; clipjob starts the queued one.
	lines := []string{harness.ClaudeInit, "the queued run's own work", harness.ClaudeResult("the queued run's result")}
	runQueuedAfter(in, ctx, t, a, jobA, podA, jobV, lines)
	res := v.wait(ctx, t)
	harness.ExactlyOnce(t, v.stdout(), lines)
	if res.ErrorCode != "" || res.Summary != "the queued run's result" {
		t.Errorf("the queued run's result: %q %q, summary %q; want its own\n%s", res.ErrorCode, res.ErrorMessage, res.Summary, v.describe())
	}
	// The bare id names the bait's run (the Job the relay saw first).
	if got, _ := r.Run(t, reader, victimRun); got == nil || got.JobUID == string(jobV.UID) || got.Agent != "agent-e2e-pc-runid-evil" {
		t.Errorf("the run id's record: %+v, want the bait's", got)
	}
}

// queuedBehind switches clipjob to Queue mode for the test and starts two
// runs of agent through the adapter: the first, for task-1, runs; the
// second, for task-2, clipjob queues behind it.
func queuedBehind(in *harness.Install, ctx context.Context, t *testing.T, agent, firstRun, secondRun string) (a *adapterRun, jobA *batchv1.Job, podA *corev1.Pod, b *adapterRun, jobB *batchv1.Job) {
	t.Helper()
	original := in.Config(t)
	in.WriteConfig(ctx, t, string(original)+"policy:\n  concurrency:\n    mode: Queue\n    maxQueued: 2\n", true)
	first := paperclipServer(in, t, agent, firstRun)
	first.TaskID = "task-1"
	a = startAdapter(ctx, t, first)
	jobA = jobOfRun(in, ctx, t, a)
	podA = in.WaitPod(ctx, t, jobA.Name, harness.Running)
	second := paperclipServer(in, t, agent, secondRun)
	second.TaskID = "task-2"
	b = startAdapter(ctx, t, second)
	jobB = jobOfRun(in, ctx, t, b)
	if !harness.Suspended(jobB) {
		t.Fatalf("run %s's Job was not queued behind %s: %+v", secondRun, firstRun, jobB.Spec)
	}
	return a, jobA, podA, b, jobB
}

// runQueuedAfter ends the active run a (its agent prints a result "first
// done" and exits 0) and, once clipjob has started the queued Job jobB,
// has that run's agent print lines and exit 0.
func runQueuedAfter(in *harness.Install, ctx context.Context, t *testing.T, a *adapterRun, jobA *batchv1.Job, podA *corev1.Pod, jobB *batchv1.Job, lines []string) {
	t.Helper()
	logA, err := suite.cluster.PodLog(ctx, in.Namespace, podA.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := logA.Write(harness.ClaudeInit); err != nil {
		t.Fatal(err)
	}
	endRun(in, ctx, t, a, logA, jobA, []string{harness.ClaudeInit}, "first done")
	in.WaitStarted(ctx, t, jobB.Name)
	podB := in.WaitPod(ctx, t, jobB.Name, harness.Running)
	logB, err := suite.cluster.PodLog(ctx, in.Namespace, podB.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := logB.Write(lines...); err != nil {
		t.Fatal(err)
	}
	in.FinishRun(ctx, t, jobB.Name, "0")
}

// endRun has the run's agent print its result line (text) and exit 0, and
// checks that the adapter handed on written and that line, each once and
// in order, and returned the run's success with text. It returns the
// lines handed on.
func endRun(in *harness.Install, ctx context.Context, t *testing.T, a *adapterRun, log *cluster.PodLog, job *batchv1.Job, written []string, text string) []string {
	t.Helper()
	last := harness.ClaudeResult(text)
	if err := log.Write(last); err != nil {
		t.Fatal(err)
	}
	lines := append(slices.Clone(written), last)
	in.FinishRun(ctx, t, job.Name, "0")
	res := a.wait(ctx, t)
	harness.ExactlyOnce(t, a.stdout(), lines)
	checkSucceeded(in, t, res, a.spec.RunID, job, text)
	return lines
}

// paperclipServer is what a Paperclip server in the install's namespace
// holds to run the adapter against the install's relay (theRelay).
func paperclipServer(in *harness.Install, t *testing.T, agent, run string) harness.AdapterSpec {
	t.Helper()
	r, _, _ := in.Relay(t)
	return in.PaperclipServer(t, r, agent, run)
}
