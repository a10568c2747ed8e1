package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// agentRun creates a bare agent Job, waits for its pod to run and points
// the pod's log at a file the test writes.
func agentRun(in *harness.Install, ctx context.Context, t *testing.T, name string) (*corev1.Pod, *cluster.PodLog) {
	t.Helper()
	pod, log, err := in.AgentRun(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return pod, log
}

// TestRelayStreamsLinesLive: an SSE client sees each line while the run is
// still writing, then an end event with the exit code and parsed result.
func TestRelayStreamsLinesLive(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	r, token, _ := in.Relay(t)
	pod, log := agentRun(in, ctx, t, "e2e-relay-live")
	run := pod.Labels[contract.LabelRunID]
	r.WaitRun(ctx, t, token, run, func(*store.Run) bool { return true })

	resp, err := r.Get("/v1/runs/"+run+"/log", token, "text/event-stream")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("SSE: %v %v", err, resp)
	}
	defer resp.Body.Close()
	events := make(chan string, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		var ev []string
		for sc.Scan() {
			if sc.Text() == "" {
				events <- strings.Join(ev, "\n")
				ev = nil
				continue
			}
			ev = append(ev, sc.Text())
		}
	}()
	next := func() string {
		t.Helper()
		for {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatal("SSE stream ended early")
				}
				if strings.HasPrefix(e, ":") {
					continue // keepalive
				}
				return e
			case <-time.After(2 * time.Minute):
				t.Fatal("no SSE event within two minutes")
			}
		}
	}
	lines := []string{harness.ClaudeInit, `{"type":"assistant","message":{"content":[{"type":"text","text":"working"}]}}`, "plain progress line", harness.ClaudeResult("all done")}
	for i, l := range lines {
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
		e := next() // arrives before the next line is even written
		if !strings.HasPrefix(e, fmt.Sprintf("id: %d\nevent: line\ndata: ", i+1)) || !strings.Contains(e, jsonString(l)) {
			t.Fatalf("event %d:\n%s\nwant line %q", i+1, e, l)
		}
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	end := next()
	if !strings.HasPrefix(end, "id: 4\nevent: end\ndata: ") {
		t.Fatalf("want the end event (id 4, the last line), got %s", end)
	}
	var data struct {
		Phase    string
		ExitCode *int32
		LastSeq  uint64
		Result   *result.Result
	}
	_ = json.Unmarshal([]byte(strings.TrimPrefix(end, "id: 4\nevent: end\ndata: ")), &data)
	if data.Phase != "Succeeded" || data.ExitCode == nil || *data.ExitCode != 0 || data.LastSeq != 4 ||
		data.Result == nil || data.Result.SessionID != "sess-e2e" || data.Result.Text != "all done" || *data.Result.CostUSD != 0.42 {
		t.Errorf("end event %s", end)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return strings.Trim(string(b), `"`)
}

// TestRelayKilledMidRun: the relay is SIGKILLed while a run writes, then
// started again on the same store: every line is stored exactly once.
func TestRelayKilledMidRun(t *testing.T) {
	in := newInstall(t)
	r, _, _ := in.Relay(t)
	breakMidRun(in, t, "e2e-relay-kill", func(ctx context.Context) error {
		r.Kill()
		return r.Start(ctx)
	})
}

// TestRelayStoppedMidRun: a relay stopped with SIGTERM mid-run (a rolling
// update) stops its API, then its followers, which flush, then closes its
// store; the next one resumes without losing or repeating a line.
func TestRelayStoppedMidRun(t *testing.T) {
	in := newInstall(t)
	r, _, _ := in.Relay(t)
	breakMidRun(in, t, "e2e-relay-term", func(ctx context.Context) error {
		r.Stop()
		return r.Start(ctx)
	})
}

// TestRelayResumesAfterKwokRestart: restarting kwok (the kubelet serving
// the log) breaks the stream mid-run; the relay reconnects and resumes
// without losing or repeating a line.
func TestRelayResumesAfterKwokRestart(t *testing.T) {
	if suite.cluster.Attached() {
		t.Skipf("restarts kwok, which a control plane this run attached to (%s) does not let it: run without it", cluster.AttachEnv)
	}
	// Alone: every test's pods are kwok's.
	in := addInstall(t)
	breakMidRun(in, t, "e2e-relay-kwok", func(context.Context) error { return suite.cluster.Restart("kwok") })
}

// breakMidRun writes 300 lines to a run and calls breakIt once the relay
// has stored some of them (and asserts it had not stored all), finishes
// the run and requires every line stored exactly once.
func breakMidRun(in *harness.Install, t *testing.T, name string, breakIt func(context.Context) error) {
	// Generous: a restarted component (kwok, the relay) takes its time on
	// a busy machine; every wait below is for a condition.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, token, _ := in.Relay(t)
	pod, log := agentRun(in, ctx, t, name)
	run := pod.Labels[contract.LabelRunID]
	var before uint64
	want := writeLinesInBackground(t, log, 300, func(i int) {
		if i == 120 {
			before = waitStored(ctx, t, r, token, run)
			if err := breakIt(ctx); err != nil {
				t.Error(err)
			}
		}
	})
	if before == 0 || before >= 300 {
		t.Fatalf("the relay had stored %d lines when the stream broke; the test must break it mid-run", before)
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	r.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.Done })
	harness.ExactlyOnce(t, r.Lines(t, token, run), want)
	mirror, err := os.ReadFile(filepath.Join(in.SharedDir(), "run-logs", "acme", "agent-"+name, run+".pod.ndjson"))
	if err != nil {
		t.Fatalf("no NDJSON mirror: %v", err)
	}
	harness.ExactlyOnce(t, strings.Split(strings.TrimSuffix(string(mirror), "\n"), "\n"), want)
}

// waitStored waits until the relay has stored some lines of run and
// returns how many.
func waitStored(ctx context.Context, t *testing.T, r *harness.Relay, token, run string) uint64 {
	t.Helper()
	return r.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.LastSeq > 0 }).LastSeq
}

// writeLinesInBackground writes n lines, three per timestamp (a burst),
// calling during(i) before line i; it returns the lines once all are
// written and the relay had the chance to read them.
func writeLinesInBackground(t *testing.T, log *cluster.PodLog, n int, during func(int)) []string {
	t.Helper()
	var want []string
	ts := time.Now()
	for i := 0; i < n; i++ {
		during(i)
		if i%3 == 0 {
			ts = time.Now()
		}
		l := fmt.Sprintf(`{"type":"assistant","n":%d}`, i)
		if err := log.WriteAt(ts, l); err != nil {
			t.Fatal(err)
		}
		want = append(want, l)
		time.Sleep(3 * time.Millisecond)
	}
	return want
}

// TestRelayKeepsRunAfterJobDeleted: after the TTL controller's kind of
// deletion (Foreground: the pods go first), status, result and the whole
// log are still served; and access is refused without a token for the
// relay's audience (401) or without permission to read pod logs in the
// namespace (404, as if it did not exist).
func TestRelayKeepsRunAfterJobDeleted(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	r, token, stranger := in.Relay(t)
	pod, log := agentRun(in, ctx, t, "e2e-relay-ttl")
	run := pod.Labels[contract.LabelRunID]
	lines := []string{harness.ClaudeInit, "compiling", harness.ClaudeResult("kept")}
	for _, l := range lines {
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
	}
	job := pod.Labels["batch.kubernetes.io/job-name"]
	in.FinishRun(ctx, t, job, "0")
	r.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.Done })
	if err := suite.cs.BatchV1().Jobs(in.Namespace).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatal("pod not deleted")
	}
	got := r.WaitRun(ctx, t, token, run, func(*store.Run) bool { return true })
	if got.Phase != "Succeeded" || got.Result == nil || got.Result.Text != "kept" || got.Job != job || got.Agent != "agent-e2e-relay-ttl" {
		t.Errorf("run after deletion: %+v", got)
	}
	harness.ExactlyOnce(t, r.Lines(t, token, run), lines)
	// The NDJSON mirror, where Paperclip's Claude adapter reads it.
	mirror, err := os.ReadFile(filepath.Join(in.SharedDir(), "run-logs", "acme", "agent-e2e-relay-ttl", run+".pod.ndjson"))
	if err != nil {
		t.Fatalf("no NDJSON mirror: %v", err)
	}
	harness.ExactlyOnce(t, strings.Split(strings.TrimSuffix(string(mirror), "\n"), "\n"), lines)
	// And beside it the done marker, so a reader knows the file is whole.
	done, err := os.ReadFile(filepath.Join(in.SharedDir(), "run-logs", "acme", "agent-e2e-relay-ttl", run+".pod.ndjson.done"))
	if err != nil || !strings.Contains(string(done), `"phase":"Succeeded"`) {
		t.Errorf("mirror done marker %q: %v", done, err)
	}

	// The same reader's token made for the API server is refused: a relay
	// must not accept what it could replay against the API server.
	apiServerToken, err := harness.ServiceAccountToken(ctx, suite.cluster, in.Namespace, "paperclip-server", harness.LogReaderRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"not-a-token", http.StatusUnauthorized}, {apiServerToken, http.StatusUnauthorized}, {stranger, http.StatusNotFound}, {token, http.StatusOK}} {
		for _, path := range []string{"/v1/runs/" + run, "/v1/runs/" + run + "/log"} {
			resp, err := r.Get(path, c.token, "")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("%s with token %.10q: %d, want %d", path, c.token, resp.StatusCode, c.want)
			}
		}
	}
	if _, code := r.Run(t, token, "never-seen"); code != http.StatusNotFound {
		t.Errorf("unknown run: %d, want 404", code)
	}
}

// TestRelayCollectsRunFinishedBeforeItWasSeen: a relay that starts after a
// run ended (a new install, or one that was down) still collects the whole
// log and result while the pod exists.
func TestRelayCollectsRunFinishedBeforeItWasSeen(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	_, token, _ := in.Relay(t)
	pod, log := agentRun(in, ctx, t, "e2e-relay-late")
	lines := []string{harness.ClaudeInit, "step 1", "step 2", harness.ClaudeResult("done before the relay came")}
	for _, l := range lines {
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")

	bin := suite.relayBin
	late, err := harness.StartRelay(ctx, suite.cluster, bin, in.Namespace+"-relay-late", in.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Stop()
	run := pod.Labels[contract.LabelRunID]
	got := late.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.Done })
	if got.Phase != "Succeeded" || got.Result == nil || got.Result.Text != "done before the relay came" {
		t.Errorf("late relay's run: %+v", got)
	}
	harness.ExactlyOnce(t, late.Lines(t, token, run), lines)
}

// TestRelayRunCannotBeTakenOver: the run id is a label anyone who creates
// pods can copy. A Job in another namespace whose pods carry a run's id,
// and a bare pod beside the run with it, are refused at admission (they
// carry paperclip.io/ labels); the relay, which would keep them apart
// anyway (TestCollectorKeepsOtherJobsApart), keeps the run in its namespace,
// so a reader allowed only elsewhere cannot read it, with only its lines.
func TestRelayRunCannotBeTakenOver(t *testing.T) {
	in := newInstall(t, harness.InstallOptions{Also: []string{"b"}})
	ctx := ctxT(t)
	other := in.Namespaces[1]
	_, reader, _ := in.Relay(t)
	otherReader, err := harness.ServiceAccountToken(ctx, suite.cluster, other, "reader", harness.LogReaderRules, relay.DefaultTokenAudience)
	if err != nil {
		t.Fatal(err)
	}
	bin := suite.relayBin
	r, err := harness.StartRelay(ctx, suite.cluster, bin, in.Namespace+"-relay-takeover", in.Namespace, "--namespace", other)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()

	pod, log := agentRun(in, ctx, t, "e2e-relay-takeover")
	run := pod.Labels[contract.LabelRunID]
	if err := log.Write("the agent's line"); err != nil {
		t.Fatal(err)
	}
	r.WaitRun(ctx, t, reader, run, func(x *store.Run) bool { return x.LastSeq >= 1 })

	labels := map[string]string{contract.LabelRunID: run, contract.LabelAgentID: pod.Labels[contract.LabelAgentID]}
	// Its own label keeps the API server from copying the template's labels
	// onto the Job.
	intruder := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "intruder", Namespace: other, Labels: map[string]string{"app": "intruder"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "agent", Image: "busybox:1.36", Command: []string{"true"}}}}}}}
	if _, err := suite.cs.BatchV1().Jobs(other).Create(ctx, intruder, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a Job elsewhere copying the run id: want 403, got %v", err)
	}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-bare-intruder", Namespace: in.Namespace, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "busybox:1.36"}}}}
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Create(ctx, bare, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a bare pod copying the run id: want 403, got %v", err)
	}

	got, code := r.Run(t, reader, run)
	if code != http.StatusOK || got.Namespace != in.Namespace || got.Pod != pod.Name || got.Done {
		t.Fatalf("run after the attempts (HTTP %d): %+v", code, got)
	}
	if _, code := r.Run(t, otherReader, run); code == http.StatusOK {
		t.Error("a reader allowed only in the other namespace reads the run")
	}
	harness.ExactlyOnce(t, r.Lines(t, reader, run), []string{"the agent's line"})
}

// TestAdapterReattachesToARunningRun: an adapter that restarts mid-run
// finds its agent's running run through the relay
// (/v1/runs?agent=…&phase=Running), and follows it from the last line it
// had (after=N): the rest arrives exactly once, then the end.
func TestAdapterReattachesToARunningRun(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	r, token, _ := in.Relay(t)
	pod, log := agentRun(in, ctx, t, "e2e-relay-reattach")
	run, agent := pod.Labels[contract.LabelRunID], pod.Labels[contract.LabelAgentID]
	lines := []string{harness.ClaudeInit, "first", "second", "third", harness.ClaudeResult("reattached")}
	for _, l := range lines[:3] {
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
	}
	r.WaitRun(ctx, t, token, run, func(x *store.Run) bool { return x.LastSeq >= 3 })

	// The adapter, restarted, knows only its agent.
	resp, err := r.Get("/v1/runs?agent="+agent+"&phase=Running", token, "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("listing the agent's running runs: %v %v", err, resp)
	}
	var listed struct{ Runs []store.Run }
	err = json.NewDecoder(resp.Body).Decode(&listed)
	resp.Body.Close()
	if err != nil || len(listed.Runs) != 1 || listed.Runs[0].ID != run || listed.Runs[0].LastSeq < 3 {
		t.Fatalf("running runs of %s: %+v (%v)", agent, listed.Runs, err)
	}
	// It had handed lines 1..3 to Paperclip: it follows from there.
	resp, err = r.Get("/v1/runs/"+run+"/log?after=3", token, "application/x-ndjson")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("follow: %v %v", err, resp)
	}
	defer resp.Body.Close()
	for _, l := range lines[3:] {
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	var got []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Type string
			Seq  uint64
			Line string
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%v: %s", err, sc.Text())
		}
		if ev.Type == "end" {
			break
		}
		got = append(got, ev.Line)
	}
	harness.ExactlyOnce(t, got, lines[3:])
}

// TestRelayReportsATimedOutRun: a run whose Job's deadline passes is
// reported timed out, which its pod alone (killed) does not say: the relay
// reads the Job's DeadlineExceeded.
func TestRelayReportsATimedOutRun(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	r, token, _ := in.Relay(t)
	job := in.BareJob(t, "e2e-relay-deadline")
	job.Spec.ActiveDeadlineSeconds = ptr.To[int64](3)
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := in.WaitPod(ctx, t, job.Name, harness.Running)
	log, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := log.Write(`{"type":"assistant","message":{"content":[{"type":"text","text":"thinking"}]}}`); err != nil {
		t.Fatal(err)
	}
	run := pod.Labels[contract.LabelRunID]
	got := r.WaitRun(ctx, t, token, run, func(x *store.Run) bool {
		return x.Done && x.Result != nil && x.Result.Outcome == result.OutcomeTimedOut
	})
	if got.Result.Outcome != result.OutcomeTimedOut {
		t.Errorf("outcome %q, want timed_out", got.Result.Outcome)
	}
}
