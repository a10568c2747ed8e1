package realnode

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/collect"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// The tests here run agent Jobs as real containers on the real node (see
// e2e/cluster/node.go): the Paperclip image is the fake agent
// (e2e/images/fakeagent), whose prompt is its script.

// requireRealNode skips, saying why, only where the run asked for no real
// node (CLIPJOB_E2E_NODE=kwok); otherwise the suite would not have started.
func requireRealNode(t *testing.T) {
	t.Helper()
	if !suite.cluster.HasRealNode() {
		t.Skipf("needs the real node; this run asked for none (%s=kwok)", cluster.NodeEnv)
	}
}

// realJob is a bare agent Job, as a Paperclip adapter submits it, placed
// on the real node, whose fake agent follows script.
func realJob(t *testing.T, name, script string) *batchv1.Job {
	t.Helper()
	return realJobIn(t, suite.in, name, script)
}

// realJobIn is realJob in install in's namespace.
func realJobIn(t *testing.T, in *harness.Install, name, script string) *batchv1.Job {
	t.Helper()
	job := in.BareJob(t, name)
	job.Spec.Template.Annotations[contract.AnnotationPrompt] = script
	job.Spec.Template.Spec.NodeSelector, job.Spec.Template.Spec.Tolerations = cluster.RealNodePlacement()
	return job
}

// createJob creates an agent Job in the agent namespace or fails the test.
func createJob(ctx context.Context, t *testing.T, job *batchv1.Job) {
	t.Helper()
	if _, err := suite.cs.BatchV1().Jobs(suite.in.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Job %s: %v", job.Name, err)
	}
}

// waitJobEnded waits for the Job's Complete or Failed condition.
func waitJobEnded(ctx context.Context, t *testing.T, name string, timeout time.Duration) *batchv1.Job {
	t.Helper()
	var job *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		job, err = suite.cs.BatchV1().Jobs(suite.in.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range job.Status.Conditions {
			if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
		t.Fatalf("Job %s did not end: %v; pod %+v; kubelet log %s", name, err, harness.PodSummary(pod), suite.cluster.LogFile("kubelet"))
	}
	return job
}

// kubeletLog is everything the pod's first container wrote, split into
// lines, read from the real node's own log files: the rotated ones, oldest
// first, then the current one. pods/log serves the current file only, and
// the kubelet rotates at ContainerLogMaxSize: a rotation between the run's
// end and this read would otherwise hide the lines before it (it did, on
// a busy machine).
func kubeletLog(ctx context.Context, t *testing.T, pod string) []string {
	t.Helper()
	return kubeletLogIn(ctx, t, suite.in.Namespace, pod)
}

// kubeletLogIn is kubeletLog of a pod in namespace ns.
func kubeletLogIn(ctx context.Context, t *testing.T, ns, pod string) []string {
	t.Helper()
	p, err := suite.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := p.Spec.Containers[0].Name
	restarts := 0
	for _, st := range p.Status.ContainerStatuses {
		if st.Name == c {
			restarts = int(st.RestartCount)
		}
	}
	current := filepath.Join(suite.cluster.PodLogsDir(), fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), c, fmt.Sprintf("%d.log", restarts))
	// Rotated files are named <current>.<YYYYMMDD-HHMMSS>[.gz]: by name is
	// by time.
	rotated, err := filepath.Glob(current + ".*")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(rotated)
	var lines []string
	var partial strings.Builder
	for _, f := range append(rotated, current) {
		for _, entry := range readCRILog(t, f) {
			// An entry is "<time> <stream> <P|F> <text>"; P is part of a
			// line the runtime split, F ends it.
			fields := strings.SplitN(entry, " ", 4)
			if len(fields) < 3 {
				t.Fatalf("%s: not a CRI log entry: %.200q", f, entry)
			}
			text := ""
			if len(fields) == 4 {
				text = fields[3]
			}
			partial.WriteString(text)
			if fields[2] != "P" {
				lines = append(lines, partial.String())
				partial.Reset()
			}
		}
	}
	if len(lines) == 0 {
		t.Fatalf("no log of %s/%s in %s", pod, c, current)
	}
	return lines
}

// readCRILog returns the entries of one of the kubelet's log files,
// gunzipping a compressed rotated one.
func readCRILog(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer gz.Close()
		r = gz
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// sseRun reads a run's SSE stream from its first line to its end event,
// returning the lines and the end event's data.
func sseRun(t *testing.T, r *harness.Relay, token, run string) ([]string, string) {
	t.Helper()
	resp, err := r.Get("/v1/runs/"+run+"/log", token, "text/event-stream")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("SSE: %v %v", err, resp)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 8<<20)
	var lines []string
	var event, data string
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "event: "):
			event = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "data: "):
			data = strings.TrimPrefix(l, "data: ")
		case l == "":
			switch event {
			case "line":
				var line store.Line
				if err := json.Unmarshal([]byte(data), &line); err != nil {
					t.Fatalf("SSE line event %.200s: %v", data, err)
				}
				lines = append(lines, line.Line)
			case "end":
				return lines, data
			}
			event, data = "", ""
		}
	}
	t.Fatalf("SSE stream of %s ended without an end event (%v) after %d lines", run, sc.Err(), len(lines))
	return nil, ""
}

// TestRealAgentRunHoldsTheFloor: a bare Job becomes a running fake agent on
// a real kubelet; from inside its container the promised floor holds (uid
// and groups, no capabilities, seccomp filtering, no privilege gained by a
// mount or a namespace, no ServiceAccount token, a read-only root with a
// writable /tmp, the shared volume writable with the fsGroup, none of the
// server's own env); its output, paced, in a burst and with a 1 MiB line,
// reaches the relay through the kubelet and comes back over SSE and as
// text each line once and in order, its result parsed, and the mirror file
// is on the shared volume.
func TestRealAgentRunHoldsTheFloor(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, token, _ := suite.in.Relay(t)
	name := "e2e-real-floor"
	// The agent writes in its workspace: kubelet made the directory (the
	// server's home is not on this volume), and the agent can write it.
	workspace := "instances/default/workspaces/agent-" + name
	// The agent writes its first line, then the rest once the relay has
	// stored that one: its burst and its 1 MiB line rotate the log file,
	// and a file rotated as the container exits is out of reach of every
	// pods/log reader that was not following it yet (docs/security.md).
	// On a busy machine the relay's first read came after that.
	gate := workspace + "/gate-" + name
	script := "gate=/paperclip/" + gate + " probe=1 write=/paperclip/" + workspace + "/probe-" + name + " leak=ANTHROPIC_API_KEY lines=40 rate=100 burst=500 bigline=1"
	created := suite.in.CreateJob(ctx, t, realJob(t, name, script))
	r.WaitRun(ctx, t, token, created.Labels[contract.LabelRunID], func(x *store.Run) bool { return x.LastSeq >= 1 })
	if err := os.WriteFile(filepath.Join(suite.in.SharedDir(), gate), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	job := suite.in.WaitJobEnded(ctx, t, name, 3*time.Minute)
	if job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	if pod.Spec.NodeName != cluster.RealNodeName {
		t.Fatalf("the run ran on %s, not the real node", pod.Spec.NodeName)
	}
	want := kubeletLog(ctx, t, pod.Name)
	if n := len(want); n != 1+1+1+40+500+1+1 {
		t.Fatalf("the container wrote %d lines, want %d", n, 1+1+1+40+500+1+1)
	}
	// The agent printed its API key (the example's llm-keys Secret); the
	// relay stores and serves it redacted.
	const key = "sk-ant-demo-not-a-real-key"
	if !strings.Contains(want[2], "ANTHROPIC_API_KEY="+key) {
		t.Fatalf("the agent did not print its key: %.300q", want[2])
	}
	want[2] = strings.ReplaceAll(want[2], key, "[REDACTED]")

	checkFloor(t, pod, want[1])
	written, err := os.ReadFile(filepath.Join(suite.in.SharedDir(), workspace, "probe-"+name))
	if err != nil || string(written) != "written by fakeagent\n" {
		t.Errorf("the agent's file on the shared volume, from the host: %q %v", written, err)
	}

	run := pod.Labels[contract.LabelRunID]
	stored := r.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.Done })
	harness.ExactlyOnce(t, r.Lines(t, token, run), want)
	sse, end := sseRun(t, r, token, run)
	harness.ExactlyOnce(t, sse, want)
	var endData struct {
		Phase    string
		ExitCode *int32
		Result   *result.Result
	}
	if err := json.Unmarshal([]byte(end), &endData); err != nil {
		t.Fatal(err)
	}
	res := stored.Result
	if endData.Phase != "Succeeded" || endData.ExitCode == nil || *endData.ExitCode != 0 || res == nil ||
		res.Outcome != "succeeded" || res.CostUSD == nil || *res.CostUSD != 0.0123 || res.Usage == nil ||
		res.Usage.OutputTokens != 40+500+1 || !strings.HasPrefix(res.SessionID, "fake-") {
		t.Errorf("end %s; stored result %s", end, mustJSON(res))
	}
	mirror, err := os.ReadFile(filepath.Join(suite.in.SharedDir(), "run-logs", "acme", "agent-"+name, run+".pod.ndjson"))
	if err != nil {
		t.Fatalf("no NDJSON mirror on the shared volume: %v", err)
	}
	harness.ExactlyOnce(t, strings.Split(strings.TrimSuffix(string(mirror), "\n"), "\n"), want)
	if strings.Contains(string(mirror), key) {
		t.Error("the API key reached the mirror file")
	}
	t.Logf("run %s: %d lines, %d bytes through the kubelet", run, len(want), stored.Bytes)
}

// TestRealAgentFailureIsReported: an agent that fails (exit 3 with an
// error result) fails its Job, and the relay reports the exit code and
// the agent's own error; a 512 KiB line it wrote on the way (the kubelet
// hands it over in 16 KiB pieces) is stored cut at the relay's limit with
// the marker saying so, and the line after it is whole.
//
// The relay is one of its own with a 256 KiB line limit, so the whole log
// stays under the node's rotation size (cluster.ContainerLogMaxSize): with
// the default 1 MiB limit the line had to pass 1 MiB, the log became
// eligible for rotation, and when the kubelet's 3 s check came within the
// agent's 70 ms of life it rotated the file before the relay's stream
// opened. pods/log serves the newest file only, so every reader (kubectl
// logs too) saw an empty log and the relay stored 0 lines (docs/security.md
// names the limit). TestRealAgentLogRotationLosesNoLine is the test of
// rotation.
func TestRealAgentFailureIsReported(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const maxLine = 256 << 10
	bin, err := harness.Build(suite.cluster.Dir, "clipjob-relay")
	if err != nil {
		t.Fatal(err)
	}
	r, err := harness.StartRelay(ctx, suite.cluster, bin, "relay-real-fail", suite.in.Namespace, "--max-line-bytes", fmt.Sprint(maxLine))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	_, token, _ := suite.in.Relay(t)
	name := "e2e-real-fail"
	suite.in.CreateJob(ctx, t, realJob(t, name, fmt.Sprintf("lines=2 bigline=1 bigsize=%d exit=3", 2*maxLine)))
	if job := suite.in.WaitJobEnded(ctx, t, name, 3*time.Minute); job.Status.Failed == 0 {
		t.Fatalf("Job %s did not fail: %+v", name, job.Status)
	}
	got := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.Done })
	if got.ExitCode == nil || *got.ExitCode != 3 || got.Result == nil || got.Result.Outcome != "failed" ||
		!slices.Contains(got.Result.Errors, "failed with exit code 3") {
		t.Errorf("run %+v, result %s", got, fmt.Sprint(got.Result))
	}
	lines := r.Lines(t, token, name)
	if len(lines) != 5 {
		t.Fatalf("stored %d lines, want 5 (init, 2, the long one, the result)", len(lines))
	}
	long := lines[3]
	if !strings.HasSuffix(long, collect.TruncatedMarker) || len(long) > maxLine+len(collect.TruncatedMarker) || len(long) < maxLine-100 ||
		!strings.HasPrefix(long, `{"message":{"content":[{"text":"line 3 xxx`) {
		t.Errorf("the 512 KiB line is stored as %d bytes: %.100q … %q", len(long), long, long[max(0, len(long)-60):])
	}
	if !strings.Contains(lines[4], `"type":"result"`) {
		t.Errorf("the line after the long one: %.300q", lines[4])
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// checkFloor reads the fake agent's probe line and checks the promised
// floor from inside the container: uid and groups as the pod asks, no
// capabilities, seccomp filtering with no_new_privs, no mount or mount
// namespace, no ServiceAccount token, a read-only root with a writable
// /tmp, the shared volume written with the fsGroup (when the script asked
// for a write), the profile's env keys and none of the server's own.
func checkFloor(t *testing.T, pod *corev1.Pod, line string) {
	t.Helper()
	var probe struct {
		UID, GID                  int
		Groups                    []int
		CapEff, CapPrm, Seccomp   string
		NoNewPrivs                string
		ServiceAccountToken       bool
		RootWritable, TmpWritable bool
		Write, WriteError         string
		WriteGID                  int
		Unshare, Mount            string
		Env                       []string
		Mounts                    []struct {
			Path     string
			ReadOnly bool
		}
		HomeWritable bool
	}
	var ev struct{ Probe json.RawMessage }
	if err := json.Unmarshal([]byte(line), &ev); err != nil || json.Unmarshal(ev.Probe, &probe) != nil {
		t.Fatalf("no probe line: %.300s (%v)", line, err)
	}
	floor := pod.Spec.SecurityContext
	if probe.UID == 0 || floor == nil || floor.RunAsUser == nil || int64(probe.UID) != *floor.RunAsUser {
		t.Errorf("uid %d; the pod asks for %v", probe.UID, floor)
	}
	if floor.FSGroup == nil || !slices.Contains(probe.Groups, int(*floor.FSGroup)) {
		t.Errorf("groups %v lack the fsGroup %v", probe.Groups, floor.FSGroup)
	}
	if probe.CapEff != "0000000000000000" || probe.CapPrm != "0000000000000000" {
		t.Errorf("capabilities: effective %s, permitted %s; want none", probe.CapEff, probe.CapPrm)
	}
	if probe.Seccomp != "2" || probe.NoNewPrivs != "1" {
		t.Errorf("seccomp mode %q, no_new_privs %q; want 2 (filter) and 1", probe.Seccomp, probe.NoNewPrivs)
	}
	if probe.Unshare == "" || probe.Mount == "" {
		t.Errorf("a new mount namespace (%q) or a mount (%q) worked inside the agent", probe.Unshare, probe.Mount)
	}
	if probe.ServiceAccountToken {
		t.Error("a ServiceAccount token is mounted; the profile mounts none")
	}
	// What of the shared volume the run reaches: its own directories and
	// nothing else, as the kernel sees the container's mounts.
	agent, company := pod.Labels[contract.LabelAgentID], pod.Labels[contract.LabelCompanyID]
	root := "/paperclip/instances/default/"
	want := map[string]bool{ // path: read-only
		root + "workspaces/" + agent:                                         false,
		root + "projects/" + company:                                         false,
		root + "companies/" + company + "/agents/" + agent + "/home":         false,
		root + "companies/" + company + "/agents/" + agent + "/instructions": true,
		root + "skills/" + company:                                           true,
	}
	got := map[string]bool{}
	for _, m := range probe.Mounts {
		got[m.Path] = m.ReadOnly
	}
	if !maps.Equal(got, want) {
		t.Errorf("the agent's mounts under /paperclip: %v; want exactly %v (path: read-only)", got, want)
	}
	if !probe.HomeWritable {
		t.Error("the agent cannot write its home")
	}
	if probe.RootWritable || !probe.TmpWritable {
		t.Errorf("root writable %v, /tmp writable %v; want a read-only root and a writable /tmp", probe.RootWritable, probe.TmpWritable)
	}
	if probe.Write != "" && (probe.WriteError != "" || probe.WriteGID != harness.SharedGID) {
		t.Errorf("writing the shared volume: %q, file group %d (want %d)", probe.WriteError, probe.WriteGID, harness.SharedGID)
	}
	for _, server := range []string{"DATABASE_URL", "BETTER_AUTH_SECRET"} {
		if slices.Contains(probe.Env, server) {
			t.Errorf("the server's %s reached the agent", server)
		}
	}
	if !slices.Contains(probe.Env, "ANTHROPIC_API_KEY") || !slices.Contains(probe.Env, "PAPERCLIP_API_URL") {
		t.Errorf("env %v lacks the profile's keys", probe.Env)
	}
}

// agentSequence checks a stored log is the fake agent's: an init event,
// then assistant lines "<prefix> 1" … "<prefix> n" each once and in order,
// and (when withResult) its result; it returns how many lines it read.
func agentSequence(t *testing.T, lines []string, prefix string, n int, withResult bool) int {
	t.Helper()
	if len(lines) == 0 || !strings.Contains(lines[0], `"subtype":"init"`) {
		t.Fatalf("the log does not start with the init event: %.200q", harness.Head(lines))
	}
	i := 1
	for k := 1; k <= n; k, i = k+1, i+1 {
		if i >= len(lines) {
			t.Fatalf("%d lines stored; %s %d and on are missing", len(lines), prefix, k)
		}
		if want := fmt.Sprintf(`"text":"%s %d`, prefix, k); !strings.Contains(lines[i], want+`"`) && !strings.Contains(lines[i], want+" ") {
			t.Fatalf("line %d is %.120q, want %s %d (lost, duplicated or out of order)", i, lines[i], prefix, k)
		}
	}
	if withResult {
		if i >= len(lines) || !strings.Contains(lines[i], `"type":"result"`) {
			t.Fatalf("no result after %s %d", prefix, n)
		}
		i++
	}
	return i
}

// TestRealAgentLogRotationLosesNoLine: an agent writes 4 MiB in ten seconds
// while the kubelet rotates its log at 1 MiB (checked every 3 s, 3 files
// kept): the relay, following through the kubelet, stores every line once
// and in order, and the rotation did happen.
func TestRealAgentLogRotationLosesNoLine(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, token, _ := suite.in.Relay(t)
	name := "e2e-real-rotate"
	const n = 4000
	suite.in.CreateJob(ctx, t, realJob(t, name, fmt.Sprintf("lines=%d rate=400 pad=1024", n)))
	if job := suite.in.WaitJobEnded(ctx, t, name, 3*time.Minute); job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	rotated, _ := filepath.Glob(filepath.Join(suite.cluster.PodLogsDir(), suite.in.Namespace+"_"+pod.Name+"_*", "agent", "0.log.*"))
	if len(rotated) == 0 {
		t.Fatalf("the kubelet never rotated the log (containerLogMaxSize %s): the test proved nothing", cluster.ContainerLogMaxSize)
	}
	run := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.Done })
	lines := r.Lines(t, token, name)
	if got := agentSequence(t, lines, "line", n, true); got != len(lines) {
		t.Errorf("%d lines stored after the result", len(lines)-got)
	}
	t.Logf("%d lines, %d bytes through %d rotated files", len(lines), run.Bytes, len(rotated))
}

// TestRealAgentPodDeletedMidRun: the agent's pod is deleted while it
// writes; the relay keeps every line it stored, each once and in order,
// and marks the run cut short.
func TestRealAgentPodDeletedMidRun(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, token, _ := suite.in.Relay(t)
	name := "e2e-real-deleted"
	suite.in.CreateJob(ctx, t, realJob(t, name, "lines=3000 rate=50"))
	before := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.LastSeq >= 30 })
	pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	if err := suite.cs.CoreV1().Pods(suite.in.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	run := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.Done })
	lines := r.Lines(t, token, name)
	got := agentSequence(t, lines, "line", len(lines)-1, false)
	// Every line stored before the delete is kept; what the agent wrote
	// after the relay's last read goes with the pod's log files (on a
	// busy machine, possibly every line after the delete).
	if got != len(lines) || uint64(len(lines)) < before.LastSeq || len(lines) > 3001 {
		t.Fatalf("stored %d lines, %d of them before the pod was deleted", len(lines), before.LastSeq)
	}
	if run.Result == nil || !run.Result.Truncated || run.Result.Outcome == "succeeded" {
		t.Errorf("run %s ended as %s, want it marked cut short", name, mustJSON(run.Result))
	}
	t.Logf("pod deleted after %d lines; run %s: phase %s, result %s", len(lines)-1, name, run.Phase, mustJSON(run.Result))
}

// TestRealAgentJobTTLKeepsTheLog: the Job's TTL deletes it and its pod
// soon after it ends (the TTL controller, as in production); the relay
// still serves the whole log and the result.
func TestRealAgentJobTTLKeepsTheLog(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, token, _ := suite.in.Relay(t)
	name := "e2e-real-ttl"
	job := realJob(t, name, "lines=50")
	job.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
	suite.in.CreateJob(ctx, t, job)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := suite.cs.BatchV1().Jobs(suite.in.Namespace).Get(ctx, name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		pods, err := suite.cs.CoreV1().Pods(suite.in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + name})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("the TTL controller did not delete Job %s and its pod: %v", name, err)
	}
	run := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.Done })
	lines := r.Lines(t, token, name)
	if got := agentSequence(t, lines, "line", 50, true); got != len(lines) {
		t.Errorf("%d lines after the result", len(lines)-got)
	}
	if run.Result == nil || run.Result.Outcome != "succeeded" || run.ExitCode == nil || *run.ExitCode != 0 {
		t.Errorf("after the TTL: run %s", mustJSON(run))
	}
}

// TestRealAgentContainerRestartIsFollowed: with restartPolicy OnFailure the
// agent's first container fails and the kubelet restarts it in the same
// pod; the relay stores both containers' lines, each once, in order: the
// first's 20 lines with no result, then the second's from its init event
// to its result.
func TestRealAgentContainerRestartIsFollowed(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, token, _ := suite.in.Relay(t)
	name := "e2e-real-restart"
	job := realJob(t, name, "lines=20 rate=20 failonce=1")
	job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	job.Spec.BackoffLimit = ptr.To[int32](3)
	suite.in.CreateJob(ctx, t, job)
	if job := suite.in.WaitJobEnded(ctx, t, name, 3*time.Minute); job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	if rc := pod.Status.ContainerStatuses[0].RestartCount; rc != 1 {
		t.Fatalf("the agent container restarted %d times, want 1", rc)
	}
	run := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.Done })
	lines := r.Lines(t, token, name)
	first := agentSequence(t, lines, "line", 20, false)
	if second := agentSequence(t, lines[first:], "again", 20, true); first+second != len(lines) {
		t.Errorf("%d lines stored, want %d", len(lines), first+second)
	}
	if run.Result == nil || run.Result.Outcome != "succeeded" {
		t.Errorf("the restarted run ended as %s", mustJSON(run.Result))
	}
}

// TestRealAgentAskingForRootGetsTheFloor: a hostile client's bare Job asks
// for root (pod and container runAsUser 0, group 0, privilege escalation)
// and a token. Either clipjob refuses it, naming the field, or what runs
// on the real kubelet is the floor anyway: never uid 0, no capability.
func TestRealAgentAskingForRootGetsTheFloor(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	name := "e2e-real-root"
	job := realJob(t, name, "probe=1 lines=1")
	job.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0), RunAsGroup: ptr.To[int64](0), FSGroup: ptr.To[int64](0)}
	job.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", SecurityContext: &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(false), AllowPrivilegeEscalation: ptr.To(true)}}}
	_, err := suite.cs.BatchV1().Jobs(suite.in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		if !strings.Contains(err.Error(), "runAsNonRoot") && !strings.Contains(err.Error(), "allowPrivilegeEscalation") && !strings.Contains(err.Error(), "runAsUser") {
			t.Fatalf("refused without naming the field: %v", err)
		}
		t.Logf("refused: %v", err)
		return
	}
	suite.in.WaitJobEnded(ctx, t, name, 3*time.Minute)
	pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	checkFloor(t, pod, kubeletLog(ctx, t, pod.Name)[1])
}

// floodLine is an agent line of the flood, its number.
var floodLine = regexp.MustCompile(`"text":"line (\d+)"`)

// TestRealAgentFloodKeepsItsTailAndResult: an agent floods its log (300,000
// lines as fast as it can, the kubelet rotating it every few seconds),
// pauses, and writes its result. The kubelet's follow may skip whole
// rotated files under such a writer (docs/real-node.md), and is left
// behind at the end: the result, in the newest file, must be stored and
// parsed all the same, the relay reading a log that ended while followed
// once more from its cursor. The pause lets the kubelet rotate the flood
// out of the current file while the container still runs: a file over the
// rotation size when the container exits can be rotated as it exits, and
// a finished container's newest file is all that pods/log reads
// (docs/security.md).
func TestRealAgentFloodKeepsItsTailAndResult(t *testing.T) {
	t.Parallel() // own Jobs on the shared install, its config untouched
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	r, token, _ := suite.in.Relay(t)
	name := "e2e-real-flood"
	const n = 300000
	suite.in.CreateJob(ctx, t, realJob(t, name, fmt.Sprintf("lines=0 burst=%d sleep=10", n)))
	suite.in.WaitJobEnded(ctx, t, name, 4*time.Minute)
	run := r.WaitRun(ctx, t, token, name, func(x *store.Run) bool { return x.Done })
	lines := r.Lines(t, token, name)
	if len(lines) < 2 || !strings.Contains(lines[len(lines)-1], `"type":"result"`) {
		t.Fatalf("the flood's end was lost: %d lines stored, last %.200q", len(lines), lines[max(0, len(lines)-2):])
	}
	// The init line, then agent lines in order, each once and whole but
	// where the follow skipped the rest of a rotated file: there one line
	// may be cut. The runtime's copy of the container's output switches
	// files between two reads, not two lines, so a line written across a
	// rotation is split into a partial record ending the old file and the
	// rest starting the new one; the kubelet, which hides the records'
	// partial marks, serves a reader that skipped either part the other
	// as a line, or the head joined to the next line it reads
	// (docs/security.md).
	last, cut := 0, ""
	for i, l := range lines[1 : len(lines)-1] {
		m := floodLine.FindStringSubmatch(l)
		if m == nil || strings.Count(l, `"session_id"`) != 1 {
			if l == lines[len(lines)-1] {
				t.Fatalf("stored line %d is the result again: %.160q", i+1, l)
			}
			if cut != "" || i == 0 {
				t.Fatalf("stored line %d is %.160q after agent line %d: not a whole agent line, and not the one cut line a gap may hold", i+1, l, last)
			}
			cut = l
			continue
		}
		k, _ := strconv.Atoi(m[1])
		if k <= last {
			t.Fatalf("stored line %d is %.120q after agent line %d: lines out of order or duplicated", i+1, l, last)
		}
		if cut != "" && k == last+1 {
			t.Fatalf("stored line %d is %.160q between agent lines %d and %d: a line cut where none was lost", i, cut, last, k)
		}
		if cut != "" {
			t.Logf("lines %d to %d not reached (a rotated file's end), and one cut line: %.160q", last+1, k-1, cut)
		}
		last, cut = k, ""
	}
	if cut != "" {
		t.Logf("after agent line %d the rest was not reached, and one cut line: %.160q", last, cut)
	}
	if run.Result == nil || run.Result.Outcome != "succeeded" || run.Result.CostUSD == nil || run.Result.Truncated {
		t.Errorf("after the flood the run's result is %s", mustJSON(run.Result))
	}
	t.Logf("flood: %d of %d lines stored (the kubelet's follow skips rotated files it did not reach)", len(lines), n+2)
}
