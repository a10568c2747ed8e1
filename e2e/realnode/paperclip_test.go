package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// The real Paperclip server (paperclipai from the npm registry, pinned by
// hack/paperclip/) runs agents through the adapter, installed the way the
// adapter's README tells operators: `npm pack`, the tarball installed with
// npm by the server's user, and both package directories registered with
// Paperclip's adapter manager. Agents are created, woken and read through
// Paperclip's own API; their Jobs run the fake agent on the real node.

var realPaperclip struct {
	sync.Once
	pc  *harness.Paperclip
	err error
}

// closePaperclip stops the server at the end of the suite (its directory
// is kept when the suite failed).
func closePaperclip(failed bool) {
	realPaperclip.Do(func() {}) // waits for a start under way
	if realPaperclip.pc != nil {
		realPaperclip.pc.Close(failed)
	}
}

// adapterPackageDirs are the package directories the README registers.
var adapterPackageDirs = harness.AdapterPackageDirs

// thePaperclip is the server the tests share, started once per test binary
// (ownPaperclip says how): by TestMain beside the serial tests when the
// whole tier runs, else by the first test that needs it. A test that stops
// or restarts the server takes one of its own instead, so the others keep
// running beside it.
func thePaperclip(t *testing.T) *harness.Paperclip {
	t.Helper()
	requireRealNode(t)
	startSharedPaperclip()
	if realPaperclip.err != nil {
		t.Fatal(realPaperclip.err)
	}
	return realPaperclip.pc
}

// startSharedPaperclip starts the shared server, once; a second call
// waits for the first.
func startSharedPaperclip() {
	realPaperclip.Do(func() {
		spec, err := paperclipSpec()
		if err != nil {
			realPaperclip.err = err
			return
		}
		realPaperclip.pc, realPaperclip.err = startPaperclip(spec, true)
	})
}

// ownPaperclip is a server for t alone, stopped when t ends (its
// directory kept if t failed): with the adapter's settings in its
// environment (the README's CLIPJOB_* variables, pointing at the suite's
// API server and relay with the README's Role), and the adapter installed
// as the README says.
func ownPaperclip(t *testing.T) *harness.Paperclip {
	t.Helper()
	requireRealNode(t)
	var pc *harness.Paperclip
	var err error
	select {
	case started := <-spareServers:
		pc, err = started.pc, started.err
	default:
		var spec harness.AdapterSpec
		if spec, err = paperclipSpec(); err == nil {
			pc, err = startPaperclip(spec, false)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(t.Failed()) })
	return pc
}

// spareServers holds own servers started ahead, beside the serial tests
// as the shared one is: a server takes half a minute of the two cores to
// start, and the tests that take one (a restart each) are the tier's
// longest. A test finding none starts its own.
var spareServers = make(chan startedServer, ownServersAhead)

// ownServersAhead is how many tests of the tier call ownPaperclip.
const ownServersAhead = 1

type startedServer struct {
	pc  *harness.Paperclip
	err error
}

// startSpareServers starts ownServersAhead servers for ownPaperclip, one
// after the other.
func startSpareServers() {
	for range ownServersAhead {
		spec, err := paperclipSpec()
		var pc *harness.Paperclip
		if err == nil {
			pc, err = startPaperclip(spec, false)
		}
		spareServers <- startedServer{pc, err}
	}
}

// closeSpareServers stops the servers no test took.
func closeSpareServers() {
	for {
		select {
		case s := <-spareServers:
			if s.pc != nil {
				s.pc.Close(false)
			}
		default:
			return
		}
	}
}

// paperclipSpec is what a server needs to reach the suite's install.
func paperclipSpec() (harness.AdapterSpec, error) {
	r, _, _, err := suite.in.SharedRelay()
	if err != nil {
		return harness.AdapterSpec{}, err
	}
	return suite.in.PaperclipServerSpec(r, "", "")
}

// startPaperclip starts a server; the shared one (onVolume) keeps its home
// on the agents' volume at /paperclip, as Paperclip's image does, so the
// runs' directories are where the server keeps them.
func startPaperclip(spec harness.AdapterSpec, onVolume bool) (*harness.Paperclip, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var o harness.ServerOptions
	if onVolume {
		o.VolumeDir = suite.in.SharedDir()
	}
	return harness.StartPaperclipServer(ctx, spec, o)
}

type (
	pcCompany = harness.PaperclipCompany
	pcAgent   = harness.PaperclipAgent
	pcRun     = harness.PaperclipRun
	pcLogLine = harness.PaperclipLogLine
)

func newCompany(ctx context.Context, t *testing.T, pc *harness.Paperclip, name string) pcCompany {
	t.Helper()
	c, err := pc.NewCompany(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newAgent makes an agent (harness.Paperclip.NewAgent).
func newAgent(ctx context.Context, t *testing.T, pc *harness.Paperclip, company, name, adapterType string, adapterConfig, runtimeConfig map[string]any) pcAgent {
	t.Helper()
	body := map[string]any{"name": name, "adapterType": adapterType, "adapterConfig": adapterConfig}
	if runtimeConfig != nil {
		body["runtimeConfig"] = runtimeConfig
	}
	return newAgentWith(ctx, t, pc, company, body)
}

// newAgentWith is newAgent with the whole create request (an
// instructionsBundle, say).
func newAgentWith(ctx context.Context, t *testing.T, pc *harness.Paperclip, company string, body map[string]any) pcAgent {
	t.Helper()
	a, err := pc.NewAgent(ctx, company, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// wake asks Paperclip for a run of agent, as the board's "Run now" does,
// and returns the run it queued.
func wake(ctx context.Context, t *testing.T, pc *harness.Paperclip, agent string, reason string) pcRun {
	t.Helper()
	r, err := pc.Wake(ctx, agent, reason)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitRunEnds waits (generously: a pod on a busy machine) until Paperclip
// records run id as ended.
func waitRunEnds(ctx context.Context, t *testing.T, pc *harness.Paperclip, id string) pcRun {
	t.Helper()
	var r pcRun
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		r, err = pc.Run(ctx, id)
		return err == nil && r.Ended(), nil
	})
	if err != nil {
		t.Fatalf("run %s did not end: last %+v\n%s\n%s", id, r, runLogText(context.Background(), pc, id), runJobs(id))
	}
	return r
}

// runJobs says what the cluster holds of run id's Jobs and pods, in any
// namespace: why a run never started shows there, not in Paperclip.
func runJobs(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: "paperclip.io/run-id=" + id}
	var b strings.Builder
	jobs, err := suite.cs.BatchV1().Jobs("").List(ctx, sel)
	if err != nil {
		return "listing the run's Jobs: " + err.Error()
	}
	namespaces := map[string]bool{}
	for _, j := range jobs.Items {
		namespaces[j.Namespace] = true
		fmt.Fprintf(&b, "Job %s/%s: suspend %v, annotations %v, status %+v\n", j.Namespace, j.Name, j.Spec.Suspend, j.Annotations, j.Status)
	}
	pods, _ := suite.cs.CoreV1().Pods("").List(ctx, sel)
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s: %s %+v\n", p.Namespace, p.Name, p.Status.Phase, p.Status.ContainerStatuses)
	}
	for ns := range namespaces {
		events, _ := suite.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		for _, e := range events.Items {
			if strings.Contains(e.InvolvedObject.Name, id) {
				fmt.Fprintf(&b, "event %s %s: %s %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	return b.String()
}

// waitRunStatus waits until run id's status is one of want.
func waitRunStatus(ctx context.Context, t *testing.T, pc *harness.Paperclip, id string, want ...string) pcRun {
	t.Helper()
	var r pcRun
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		r, err = pc.Run(ctx, id)
		return err == nil && slices.Contains(want, r.Status), nil
	})
	if err != nil {
		t.Fatalf("run %s never became %v: last %+v\n%s", id, want, r, runLogText(ctx, pc, id))
	}
	return r
}

// runLogText is the run's log, for a failure message.
func runLogText(ctx context.Context, pc *harness.Paperclip, id string) string {
	lines, err := pc.RunLog(ctx, id)
	var b strings.Builder
	fmt.Fprintf(&b, "Paperclip's log of run %s (%d records, err %v):\n", id, len(lines), err)
	for _, l := range lines {
		fmt.Fprintf(&b, "  %s: %s", l.Stream, strings.TrimRight(truncateText(l.Chunk, 400), "\n")+"\n")
	}
	return b.String()
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// paperclipOnTheRealNode is a test's start: pc (the shared server or one
// of the test's own), a context of timeout and a company of its own named
// name.
func paperclipOnTheRealNode(t *testing.T, pc *harness.Paperclip, timeout time.Duration, name string) (context.Context, pcCompany) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx, newCompany(ctx, t, pc, name)
}

// checkAdaptersLoaded: Paperclip's adapter manager lists both of clipjob's
// types as external adapters it loaded, overriding no built-in type,
// after how (the way they were registered).
func checkAdaptersLoaded(ctx context.Context, t *testing.T, pc *harness.Paperclip, how string) {
	t.Helper()
	var listed []map[string]any
	if err := pc.Do(ctx, http.MethodGet, "/api/adapters", nil, &listed); err != nil {
		t.Fatal(err)
	}
	for typ := range adapterPackageDirs {
		i := slices.IndexFunc(listed, func(a map[string]any) bool { return a["type"] == typ })
		if i < 0 {
			t.Fatalf("the adapter manager does not list %s after %s: %v", typ, how, listed)
		}
		a := listed[i]
		if a["source"] != "external" || a["loaded"] != true || a["overriddenBuiltin"] != false {
			t.Errorf("adapter %s after %s: %v, want external, loaded, not overriding a built-in type", typ, how, a)
		}
	}
}

// runFirstAgent makes a company named company with a claude_k8s agent
// whose fake agent follows script (six lines), wakes it, and holds what
// Paperclip records of the run to the agent's: succeeded, its six lines
// in order in the run log, its session and its cost.
func runFirstAgent(ctx context.Context, t *testing.T, pc *harness.Paperclip, company, script string) (run, done pcRun) {
	t.Helper()
	c := newCompany(ctx, t, pc, company)
	agent := newAgent(ctx, t, pc, c.ID, "Builder", "claude_k8s", map[string]any{"promptTemplate": script}, nil)
	run = wake(ctx, t, pc, agent.ID, "e2e: the first run")
	done = waitRunEnds(ctx, t, pc, run.ID)
	if done.Status != "succeeded" {
		t.Fatalf("run %s: %+v\n%s\n%s", run.ID, done, runLogText(ctx, pc, run.ID), runJobs(run.ID))
	}
	lines, err := pc.RunLog(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"line 1", "line 2", "line 3", "line 4", "line 5", "line 6"}
	if got := harness.AgentTexts(lines); !slices.Equal(got, want) {
		t.Errorf("the agent's lines in Paperclip's run log: %q, want %q\n%s", got, want, runLogText(ctx, pc, run.ID))
	}
	if done.SessionAfter == "" || !strings.HasPrefix(done.SessionAfter, "fake-") {
		t.Errorf("session recorded after the run: %q, want the fake agent's", done.SessionAfter)
	}
	if cost, _ := done.UsageJSON["costUsd"].(float64); cost != 0.0123 {
		t.Errorf("usage recorded: %v, want costUsd 0.0123", done.UsageJSON)
	}
	return run, done
}

// agentRuns are the agent's runs as Paperclip lists them.
func agentRuns(ctx context.Context, t *testing.T, pc *harness.Paperclip, company, agent string) []pcRun {
	t.Helper()
	var runs []pcRun
	if err := pc.Do(ctx, http.MethodGet, "/api/companies/"+company+"/heartbeat-runs?agentId="+agent+"&limit=100", nil, &runs); err != nil {
		t.Fatal(err)
	}
	return runs
}

// costOf is what Paperclip recorded as the run's cost.
func costOf(r pcRun) float64 {
	c, _ := r.UsageJSON["costUsd"].(float64)
	return c
}

// agentJobs are the agent's Jobs in the suite's namespace.
func agentJobs(ctx context.Context, t *testing.T, agent string) []string {
	t.Helper()
	list, err := suite.cs.BatchV1().Jobs(suite.in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "paperclip.io/agent-id=" + agent})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range list.Items {
		if j.DeletionTimestamp == nil {
			names = append(names, j.Name)
		}
	}
	return names
}

// waitAgentJobs waits until the agent has n Jobs not being deleted.
func waitAgentJobs(ctx context.Context, t *testing.T, agent string, n int) {
	t.Helper()
	var jobs []string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		jobs = agentJobs(ctx, t, agent)
		return len(jobs) == n, nil
	}); err != nil {
		t.Fatalf("agent %s's Jobs: %v, want %d", agent, jobs, n)
	}
}

// Two runs of one agent at once (Paperclip allows 20 by default): each is
// its own run, never attached to the other's Job nor billed its cost. With
// clipjob in Reject mode the second is refused as busy, in terms Paperclip
// retries (nothing ran, transient): its retry runs once the first is done.
func TestPaperclipRunsOfOneAgentAtOnce(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, company := paperclipOnTheRealNode(t, pc, 10*time.Minute, "Concurrent Co")
	// The first run holds the agent until the test has seen the second
	// refused, then ends well before Paperclip retries the second (30 s
	// later): on a busy machine a fixed sleep either ends too soon or
	// outlasts the retry.
	const endFirst = "end-the-first-run"
	agent := newAgent(ctx, t, pc, company.ID, "Twice", "claude_k8s", map[string]any{
		"promptTemplate": "lines=3 sleep=300 until=" + instanceRoot + "workspaces/{{agent.id}}/" + endFirst}, nil)
	first := wake(ctx, t, pc, agent.ID, "e2e: first")
	waitAgentJobs(ctx, t, agent.ID, 1) // the first run holds the agent
	second := wake(ctx, t, pc, agent.ID, "e2e: second, while the first runs")

	refused := waitRunEnds(ctx, t, pc, second.ID)
	if refused.Status != "failed" || refused.ErrorCode != "k8s_concurrent_run_blocked" {
		t.Fatalf("the second run: %+v, want failed with k8s_concurrent_run_blocked\n%s", refused, runLogText(ctx, pc, second.ID))
	}
	if err := os.WriteFile(filepath.Join(suite.in.SharedDir(), "instances", "default", "workspaces", agent.ID, endFirst), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if costOf(refused) != 0 {
		t.Errorf("the refused run was billed %v: another run's cost", refused.UsageJSON)
	}
	lines, _ := pc.RunLog(ctx, second.ID)
	if got := harness.AgentTexts(lines); len(got) != 0 {
		t.Errorf("the refused run's log holds agent output %q: another run's", got)
	}
	done := waitRunEnds(ctx, t, pc, first.ID)
	if done.Status != "succeeded" || costOf(done) != 0.0123 {
		t.Fatalf("the first run: %+v", done)
	}
	// Paperclip runs the refused one again (its bounded retry, 30 s later).
	var retry pcRun
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, r := range agentRuns(ctx, t, pc, company.ID, agent.ID) {
			if r.RetryOf == second.ID && r.Ended() {
				retry = r
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("Paperclip did not run the refused run again: %v", agentRuns(ctx, t, pc, company.ID, agent.ID))
	}
	if retry.Status != "succeeded" || costOf(retry) != 0.0123 {
		t.Errorf("the retry of the refused run: %+v\n%s", retry, runLogText(ctx, pc, retry.ID))
	}
	total := 0.0
	for _, r := range agentRuns(ctx, t, pc, company.ID, agent.ID) {
		total += costOf(r)
	}
	if total < 0.0245 || total > 0.0247 {
		t.Errorf("the agent's runs cost %v in all, want two runs' 0.0246", total)
	}
}

// With maxConcurrentRuns 1 (what the README tells operators to set)
// Paperclip itself queues the second run; none is refused.
func TestPaperclipQueuesAnAgentsSecondRunWithOneSlot(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, company := paperclipOnTheRealNode(t, pc, 10*time.Minute, "One Slot Co")
	agent := newAgent(ctx, t, pc, company.ID, "Once", "claude_k8s", map[string]any{"promptTemplate": "lines=2 sleep=4"},
		map[string]any{"heartbeat": map[string]any{"maxConcurrentRuns": 1}})
	first := wake(ctx, t, pc, agent.ID, "e2e: first")
	second := wake(ctx, t, pc, agent.ID, "e2e: second")
	for _, id := range []string{first.ID, second.ID} {
		if r := waitRunEnds(ctx, t, pc, id); r.Status != "succeeded" || costOf(r) != 0.0123 {
			t.Errorf("run %s: %+v\n%s", id, r, runLogText(ctx, pc, id))
		}
	}
}

// The server's local paths and loopback URLs never reach the pod: the
// fake agent's probe lists the names of its environment. With the
// server's home on the volume (as here), a path there reaches the pod only
// when the pod mounts it: AGENT_HOME, the agent's workspace, does; the
// server's own GH_CONFIG_DIR ($HOME/.config/gh) does not.
func TestPaperclipRunEnvHoldsNoServerPaths(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, company := paperclipOnTheRealNode(t, pc, 10*time.Minute, "Env Co")
	agent := newAgent(ctx, t, pc, company.ID, "Prober", "claude_k8s", map[string]any{
		"promptTemplate": "lines=1 probe=1",
		// An agent's own env that names a loopback URL is left out too.
		"env": map[string]any{"MY_LOCAL_URL": "http://127.0.0.1:3100/api", "MY_SETTING": "kept"},
	}, nil)
	run := wake(ctx, t, pc, agent.ID, "e2e: probe")
	if r := waitRunEnds(ctx, t, pc, run.ID); r.Status != "succeeded" {
		t.Fatalf("run: %+v\n%s", r, runLogText(ctx, pc, run.ID))
	}
	var probe struct{ Env []string }
	if !fakeAgentEvent(ctx, pc, run.ID, "fake_agent_probe", "probe", &probe) {
		t.Fatalf("no probe line in the run's log\n%s", runLogText(ctx, pc, run.ID))
	}
	names := probe.Env
	lines, _ := pc.RunLog(ctx, run.ID)
	for _, k := range []string{"TMPDIR", "TMP", "TEMP", "PAPERCLIP_RUN_SCRATCH_DIR", "GH_CONFIG_DIR", "MY_LOCAL_URL", "PAPERCLIP_RUNTIME_TOOLS_MCP_URL"} {
		if slices.Contains(names, k) {
			t.Errorf("%s reached the pod (its env: %v)", k, names)
		}
	}
	if !slices.Contains(names, "MY_SETTING") || !slices.Contains(names, "PAPERCLIP_RUN_ID") || !slices.Contains(names, "AGENT_HOME") {
		t.Errorf("the run's own env did not reach the pod: %v", names)
	}
	var notes []string
	for _, l := range lines {
		if l.Stream == "stderr" && strings.Contains(l.Chunk, "left out of the pod's env") {
			notes = append(notes, l.Chunk)
		}
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "TMPDIR") || !strings.Contains(notes[0], "MY_LOCAL_URL") || !strings.Contains(notes[0], "GH_CONFIG_DIR") || strings.Contains(notes[0], "127.0.0.1") {
		t.Errorf("the run's log should name what was left out, not its values: %q", notes)
	}
}

// envCheck is one check of Paperclip's adapter environment test.
type envCheck struct{ Code, Level, Message, Hint string }

// testEnvironment is Paperclip's "Test environment" of claude_k8s for
// company, through its API.
func testEnvironment(ctx context.Context, t *testing.T, pc *harness.Paperclip, company string) (res struct {
	Status string
	Checks []envCheck
}) {
	t.Helper()
	if err := pc.Do(ctx, http.MethodPost, "/api/companies/"+company+"/adapters/claude_k8s/test-environment", map[string]any{"adapterConfig": map[string]any{}}, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// Paperclip's "Test environment" for the adapter, through its API, on the
// server the README's install (npm install of the package, then the
// adapter manager) registered both types in. A run of each type through
// a server is TestPaperclipInTheCluster's, on the image's install.
func TestPaperclipTestEnvironment(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	checkAdaptersLoaded(ctx, t, pc, "the README's install")
	company := newCompany(ctx, t, pc, "Checks Co")
	res := testEnvironment(ctx, t, pc, company.ID)
	for _, c := range res.Checks {
		if c.Level == "error" {
			t.Errorf("check %s: %s (%s)", c.Code, c.Message, c.Hint)
		}
	}
	if res.Status == "fail" || len(res.Checks) == 0 {
		t.Errorf("the environment test through Paperclip: %+v", res)
	}
}

// The adapter types offer the models of Paperclip's built-in adapter of
// the same CLI, as Paperclip lists them.
func TestPaperclipListsTheBuiltInAdaptersModels(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	company := newCompany(ctx, t, pc, "Models Co")
	ids := func(typ string) []string {
		var models []struct{ ID string }
		if err := pc.Do(ctx, http.MethodGet, "/api/companies/"+company.ID+"/adapters/"+typ+"/models", nil, &models); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range models {
			out = append(out, m.ID)
		}
		return out
	}
	for ours, builtin := range map[string]string{"claude_k8s": "claude_local", "opencode_k8s": "opencode_local"} {
		got, want := ids(ours), ids(builtin)
		if len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("%s lists models %v; %s lists %v", ours, got, builtin, want)
		}
	}
}

// workAnIssue makes an opencode_k8s agent in company, assigns it an
// issue, and holds what Paperclip records of the run the assignment
// wakes: succeeded, its cost, its four lines in order, and its final
// message posted as a comment on the issue.
func workAnIssue(ctx context.Context, t *testing.T, pc *harness.Paperclip, company string) {
	t.Helper()
	agent := newAgent(ctx, t, pc, company, "Coder", "opencode_k8s", map[string]any{"promptTemplate": "lines=4"}, nil)
	var issue struct{ ID string }
	if err := pc.Do(ctx, http.MethodPost, "/api/companies/"+company+"/issues", map[string]any{"title": "Fix the failing test", "assigneeAgentId": agent.ID}, &issue); err != nil {
		t.Fatal(err)
	}
	// The assignment wakes the agent.
	var run pcRun
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		runs := agentRuns(ctx, t, pc, company, agent.ID)
		if len(runs) > 0 {
			run = runs[0]
		}
		return len(runs) > 0, nil
	}); err != nil {
		t.Fatal("the assignment woke no run of the agent")
	}
	done := waitRunEnds(ctx, t, pc, run.ID)
	if done.Status != "succeeded" || costOf(done) != 0.0123 {
		t.Fatalf("the OpenCode run: %+v\n%s\n%s", done, runLogText(ctx, pc, run.ID), runJobs(run.ID))
	}
	lines, _ := pc.RunLog(ctx, run.ID)
	var texts []string
	for _, l := range harness.StdoutLines(lines) {
		var ev struct {
			Type string
			Part struct{ Text string }
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == "text" {
			texts = append(texts, ev.Part.Text)
		}
	}
	if want := []string{"line 1", "line 2", "line 3", "line 4"}; !slices.Equal(texts, want) {
		t.Errorf("the OpenCode agent's lines in Paperclip's log: %q, want %q", texts, want)
	}
	// Paperclip comments with the agent's final message. It may post
	// comments of its own too (asking for the issue's disposition), before
	// or after that one: the agent's is looked for among them.
	var comments []struct{ Body string }
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := pc.Do(ctx, http.MethodGet, "/api/issues/"+issue.ID+"/comments?order=asc", nil, &comments); err != nil {
			return false, nil
		}
		return slices.ContainsFunc(comments, func(c struct{ Body string }) bool { return strings.Contains(c.Body, "line 4") }), nil
	})
	if err != nil {
		t.Fatalf("Paperclip posted no comment with the agent's final message (line 4) on the issue after the run: %q; result %+v", comments, done.ResultJSON)
	}
}
