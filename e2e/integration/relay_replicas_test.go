package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// relayReplicas are three relay processes sharing one PostgreSQL store,
// with the rights the chart gives relays on PostgreSQL, and the NDJSON
// mirror on a volume of their own. r2 reaches the server through a proxy
// the test can cut. Each test has its own, stopped when it ends, so no
// relay of one test follows the pods of the tests after it.
type relayReplicas struct {
	// in is the install whose namespace the replicas collect.
	in     *harness.Install
	pg     *pgtest.Server
	proxy  *socketProxy
	relays []*harness.Relay
	ids    []string
	// group names the replicas' processes and files; schema is their
	// store's; mirror is their shared volume.
	group, schema, mirror string
	token                 string
	// extra are the flags every replica gets besides the store's.
	extra []string
}

// replicasSetup is what the tests' replicas share: the binary.
var replicasSetup struct {
	sync.Once
	bin  string
	err  error
	sets atomic.Int64
}

const replicasSchema = "e2e_replicas"

// readyReplicas starts the test's replicas and returns them once all
// three collect, with the test's context.
func readyReplicas(in *harness.Install, t *testing.T) (context.Context, *relayReplicas) {
	t.Helper()
	return readyReplicasWith(in, t)
}

// readyReplicasWith is readyReplicas with extra flags for every replica.
func readyReplicasWith(in *harness.Install, t *testing.T, extra ...string) (context.Context, *relayReplicas) {
	t.Helper()
	ctx := replicasContext(t)
	// Named by the install (its namespace is new on each run), so that a
	// run on a control plane left running meets no earlier run's files.
	group := fmt.Sprintf("%s-replicas-%d", in.Namespace, replicasSetup.sets.Add(1))
	return ctx, startRelayReplicas(in, ctx, t, group, extra...)
}

// replicasContext is a replica test's context, once what the replica
// tests share is set up.
func replicasContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	replicasSetup.Do(func() {
		replicasSetup.bin = suite.relayBin
	})
	if replicasSetup.err != nil {
		t.Fatal(replicasSetup.err)
	}
	return ctx
}

// startRelayReplicas starts three relay replicas of group on a PostgreSQL of their
// own and returns them once all three collect.
func startRelayReplicas(in *harness.Install, ctx context.Context, t *testing.T, group string, extra ...string) *relayReplicas {
	t.Helper()
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	token, err := harness.ServiceAccountToken(ctx, suite.cluster, in.Namespace, "paperclip-server", harness.LogReaderRules, relay.DefaultTokenAudience)
	if err != nil {
		t.Fatal(err)
	}
	rs := &relayReplicas{in: in, pg: pg, ids: []string{"r0", "r1", "r2"}, group: group, schema: replicasSchema, token: token,
		mirror: filepath.Join(suite.cluster.Dir, group+"-mirror"), extra: extra}
	if i := slices.Index(extra, "--postgres-schema"); i >= 0 && i+1 < len(extra) {
		rs.schema = extra[i+1]
	}
	t.Cleanup(func() {
		for _, r := range rs.relays {
			_ = syscall.Kill(r.PID(), syscall.SIGCONT) // a test may have frozen it
			r.Stop()
		}
		if rs.proxy != nil {
			rs.proxy.close()
		}
		_ = pg.Stop()
	})
	if rs.proxy, err = newSocketProxy(pg.ConnString("postgres")); err != nil {
		t.Fatal(err)
	}
	for i, id := range rs.ids {
		r, err := rs.start(ctx, id, group, rs.conn(i))
		if err != nil {
			t.Fatal(err)
		}
		rs.relays = append(rs.relays, r)
	}
	rs.waitMembers(ctx, t, 0, 1, 2)
	return rs
}

// conn is the connection string of replica i: the third reaches the
// store through the proxy a test may cut.
func (rs *relayReplicas) conn(i int) string {
	if i == 2 {
		return rs.proxy.ConnString("postgres")
	}
	return rs.pg.ConnString("postgres")
}

// start runs one relay on the store, as replica id of group.
func (rs *relayReplicas) start(ctx context.Context, id, group, conn string) (*harness.Relay, error) {
	url := filepath.Join(suite.cluster.Dir, "relay-"+group+"-"+id+".pgurl")
	if err := os.WriteFile(url, []byte(conn), 0o600); err != nil {
		return nil, err
	}
	return harness.StartRelay(ctx, suite.cluster, replicasSetup.bin, "relay-"+group+"-"+id, rs.in.Namespace, append([]string{"--store", "postgres",
		"--postgres-url-file", url, "--postgres-schema", replicasSchema, "--replica-id", id, "--mirror-dir", rs.mirror}, rs.extra...)...)
}

// owner is the replica that collects run while all of ids are live, as
// the store's table of replicas says.
func (rs *relayReplicas) owner(t *testing.T, run string, ids ...string) int {
	t.Helper()
	if len(ids) == 0 {
		ids = rs.ids
	}
	id, err := harness.RunCollector(context.Background(), rs.pg.ConnString("postgres"), rs.schema, run, ids)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Index(rs.ids, id)
}

// runsOf are the runs of runs replica i collects while all are live.
func (rs *relayReplicas) runsOf(t *testing.T, i int, runs []string) []string {
	t.Helper()
	var out []string
	for _, run := range runs {
		if rs.owner(t, run) == i {
			out = append(out, run)
		}
	}
	return out
}

// waitMembers waits until every replica named collects and sees exactly
// those replicas live.
func (rs *relayReplicas) waitMembers(ctx context.Context, t *testing.T, live ...int) {
	t.Helper()
	var relays []*harness.Relay
	for _, i := range live {
		relays = append(relays, rs.relays[i])
	}
	if err := harness.WaitCollecting(ctx, len(live), relays...); err != nil {
		t.Fatalf("replicas %v: %v", live, err)
	}
}

// flood is the harness's flood of agent runs, judged by a test.
type flood struct{ *harness.Flood }

// startFlood starts n runs and writes to each until stopped.
func startFlood(in *harness.Install, ctx context.Context, t *testing.T, name string, n int) *flood {
	t.Helper()
	f, err := in.StartFlood(ctx, name, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Stop() }) // a test that failed before its end
	return &flood{f}
}

// end stops writing, finishes every run and waits until the relay r says
// each is done, then checks each run's log, read through every relay of
// rs, is every line written, once, in order.
func (f *flood) end(ctx context.Context, t *testing.T, rs *relayReplicas) {
	t.Helper()
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := f.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, run := range f.Runs {
		rs.relays[0].WaitRun(ctx, t, rs.token, run, func(x *store.Run) bool { return x.Done })
		for _, r := range rs.relays {
			harness.ExactlyOnce(t, r.Lines(t, rs.token, run), f.Want(run))
		}
		mirror, err := f.ReadMirror(ctx, rs.mirror, run)
		if err != nil {
			t.Fatal(err)
		}
		harness.ExactlyOnce(t, mirror, f.Want(run))
		total += len(f.Want(run))
	}
	t.Logf("%d lines of %d runs, read through each of %d replicas and in their mirror files: 0 lost, 0 stored twice", total, len(f.Runs), len(rs.relays))
}

// stored is how many lines of run the store holds, asked through r.
func stored(t *testing.T, r *harness.Relay, token, run string) int {
	x, _ := r.Run(t, token, run)
	if x == nil {
		return 0
	}
	return int(x.LastSeq)
}

// waitStoredAtLeast waits until the store holds n lines of run.
func waitStoredAtLeast(ctx context.Context, t *testing.T, r *harness.Relay, token, run string, n int, why string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return stored(t, r, token, run) >= n, nil
	})
	if err != nil {
		t.Fatalf("run %s: %d lines stored, not %d, %s: %v", run, stored(t, r, token, run), n, why, err)
	}
}

// waitEach waits until the store holds at least n(run) lines of each run.
func waitEach(ctx context.Context, t *testing.T, r *harness.Relay, token string, runs []string, n func(run string) int, why string) {
	t.Helper()
	for _, run := range runs {
		waitStoredAtLeast(ctx, t, r, token, run, n(run), why)
	}
}

// atLeast is n lines of any run.
func atLeast(n int) func(string) int { return func(string) int { return n } }

// beyond is n lines more than written to the run so far.
func (f *flood) beyond(n int) func(string) int {
	return func(run string) int { return f.Written(run) + n }
}

// TestRelayReplicasSurviveAKilledReplica: three relays share a PostgreSQL
// store while six runs write a flood. The replica collecting one of them
// is SIGKILLed: the others take its runs over once its row in the table
// of replicas lapses by the server's clock and
// resume them from the stored cursors; when it comes back it gets its
// share back. Every run's log, read through each replica, is every line
// once, in order; and an SSE client following the killed replica's run
// through that replica reconnects to another with Last-Event-ID and, from
// the two responses together, has every line once and the end.
func TestRelayReplicasSurviveAKilledReplica(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-replicas-kill", 6)
	victim := rs.owner(t, f.Runs[0])
	survivor := rs.relays[(victim+1)%3]
	theirs := rs.runsOf(t, victim, f.Runs)
	t.Logf("replica %s collects %v", rs.ids[victim], theirs)

	// The SSE client starts on the victim once it serves the run.
	waitStoredAtLeast(ctx, t, rs.relays[victim], rs.token, f.Runs[0], 1, "before the client follows it")
	sse := followSSE(ctx, rs, f.Runs[0], victim, (victim+2)%3, nil)
	waitEach(ctx, t, survivor, rs.token, f.Runs, atLeast(100), "before the kill")
	rs.relays[victim].Kill()
	killed := time.Now()
	at := map[string]int{}
	for _, run := range theirs {
		at[run] = f.Written(run)
	}
	var takeover time.Duration
	for _, run := range theirs {
		waitStoredAtLeast(ctx, t, survivor, rs.token, run, at[run], "after its replica was killed")
		takeover = max(takeover, time.Since(killed))
	}
	t.Logf("killed replica's runs taken over: every line written before the kill stored %s after it (lease %s, renewal %s)", takeover.Round(100*time.Millisecond),
		relay.DefaultOptions().Replicas.LeaseDuration, relay.DefaultOptions().Replicas.RenewInterval)

	if err := rs.relays[victim].Start(ctx); err != nil {
		t.Fatal(err)
	}
	rs.waitMembers(ctx, t, 0, 1, 2)
	waitEach(ctx, t, rs.relays[victim], rs.token, theirs, f.beyond(60), "after its replica came back")
	f.end(ctx, t, rs)
	harness.ExactlyOnce(t, sse.wait(t), f.Want(f.Runs[0]))
	if sse.reconnects == 0 {
		t.Error("the SSE client never reconnected: it was following the killed replica")
	}
}

// TestRelayReplicaStoppedHandsOverAtOnce: a replica stopped with SIGTERM
// (a rollout, a scale-down) flushes, deletes its row in the table of
// replicas, and the others take its runs over at their next renewal, not
// after the row's duration.
func TestRelayReplicaStoppedHandsOverAtOnce(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-replicas-term", 3)
	leaving := rs.owner(t, f.Runs[0])
	survivor := rs.relays[(leaving+1)%3]
	waitEach(ctx, t, survivor, rs.token, f.Runs, atLeast(100), "before the stop")
	rs.relays[leaving].Stop()
	stopped := time.Now()
	written := f.Written(f.Runs[0])
	if ids, err := harness.ReplicaIDs(ctx, rs.pg.ConnString("postgres"), rs.schema); err != nil || ids[rs.ids[leaving]] != "" {
		t.Errorf("the stopped replica's row is still in the table of replicas (%v, %v): the others wait for it to lapse", ids, err)
	}
	waitStoredAtLeast(ctx, t, survivor, rs.token, f.Runs[0], written+60, "after its replica stopped")
	t.Logf("a stopped replica's run stored on %s after the stop (renewal %s, lease %s)", time.Since(stopped).Round(100*time.Millisecond),
		relay.DefaultOptions().Replicas.RenewInterval, relay.DefaultOptions().Replicas.LeaseDuration)
	if err := rs.relays[leaving].Start(ctx); err != nil {
		t.Fatal(err)
	}
	rs.waitMembers(ctx, t, 0, 1, 2)
	f.end(ctx, t, rs)
}

// TestRelayReplicasServeAnotherReplicasLinesLive: a client follows a run
// over SSE through a replica that does not collect it; each line reaches
// it as the collecting replica commits it (LISTEN/NOTIFY), well within the
// 15 s at which a follower re-reads the store without being told.
func TestRelayReplicasServeAnotherReplicasLinesLive(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	pod, log := agentRun(in, ctx, t, "e2e-replicas-live")
	run := pod.Labels[contract.LabelRunID]
	reader := (rs.owner(t, run) + 1) % 3
	rs.relays[reader].WaitRun(ctx, t, rs.token, run, func(*store.Run) bool { return true })
	const n = 40
	var mu sync.Mutex
	written, latency := map[string]time.Time{}, []time.Duration{}
	sse := followSSE(ctx, rs, run, reader, reader, func(line string) {
		mu.Lock()
		defer mu.Unlock()
		latency = append(latency, time.Since(written[line]))
	})
	var want []string
	for i := range n {
		l := fmt.Sprintf(`{"type":"assistant","n":%d}`, i)
		mu.Lock()
		written[l] = time.Now()
		mu.Unlock()
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
		want = append(want, l)
		time.Sleep(100 * time.Millisecond) // an agent's pace, not a wait for the relay
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	harness.ExactlyOnce(t, sse.wait(t), want)
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(latency)
	t.Logf("line written to SSE client through a replica that does not collect the run: p50 %s, p99 %s, max %s",
		latency[len(latency)/2].Round(time.Millisecond), latency[len(latency)*99/100].Round(time.Millisecond), latency[len(latency)-1].Round(time.Millisecond))
	if worst := latency[len(latency)-1]; worst >= 10*time.Second {
		t.Errorf("a line took %s to reach the client through another replica: it was not told of the commit", worst)
	}
}

// TestRelayReplicasSurviveAPostgresRestart: PostgreSQL crashes and comes
// back while three replicas store a flood; every line is stored once, and
// every replica is ready and collecting again.
func TestRelayReplicasSurviveAPostgresRestart(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-replicas-pg", 3)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, atLeast(100), "before the restart")
	if err := rs.pg.Restart(); err != nil {
		t.Fatal(err)
	}
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(60), "after PostgreSQL restarted")
	rs.waitMembers(ctx, t, 0, 1, 2)
	f.end(ctx, t, rs)
}

// TestRelayReplicaCutOffFromPostgres: one replica loses PostgreSQL but not
// the API server. It says so in readiness, stops collecting and leaves its
// runs to the others, which store them on; reconnected, it is ready and
// collects its share again. No line is lost or stored twice.
func TestRelayReplicaCutOffFromPostgres(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-replicas-cut", 6)
	theirs := rs.runsOf(t, 2, f.Runs)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, atLeast(60), "before the cut")
	rs.proxy.cut()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		code, body := readyz(rs.relays[2])
		return code != http.StatusOK && strings.Contains(body, "[-]store") && strings.Contains(body, "[-]collecting"), nil
	})
	if err != nil {
		code, body := readyz(rs.relays[2])
		t.Fatalf("the replica cut off from PostgreSQL does not say so in readiness: %d %s", code, body)
	}
	rs.waitMembers(ctx, t, 0, 1)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(60), "while replica r2 was cut off")
	t.Logf("runs of the cut-off replica %v stored on by the others", theirs)
	rs.proxy.restore()
	rs.waitMembers(ctx, t, 0, 1, 2)
	if code, body := readyz(rs.relays[2]); code != http.StatusOK {
		t.Errorf("reconnected, the replica is not ready: %d %s", code, body)
	}
	f.end(ctx, t, rs)
}

// restartBehindAPIProxy restarts replica r2 reaching the API server
// through a proxy of its own (its kubeconfig's server), and returns the
// proxy once r2 is a member again.
func (rs *relayReplicas) restartBehindAPIProxy(ctx context.Context, t *testing.T) *socketProxy {
	t.Helper()
	u, err := url.Parse(suite.cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := newTCPProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.close)
	path, err := harness.ChartServiceAccountKubeconfig(ctx, suite.cluster, "clipjob-relay")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + proxy.listen
	}
	proxied := filepath.Join(suite.cluster.Dir, rs.group+"-r2-proxied.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, proxied); err != nil {
		t.Fatal(err)
	}
	rs.relays[2].Stop()
	extra := rs.extra
	rs.extra = append(slices.Clone(extra), "--kubeconfig", proxied)
	r2, err := rs.start(ctx, rs.ids[2], rs.group, rs.conn(2))
	rs.extra = extra
	if err != nil {
		t.Fatal(err)
	}
	rs.relays[2] = r2
	rs.waitMembers(ctx, t, 0, 1, 2)
	return proxy
}

// TestRelayReplicaCutOffFromTheAPIServer: one replica loses the API
// server but not PostgreSQL. It can follow no log, so it leaves the table
// of replicas rather than keep runs nobody collects: it says why in
// readiness, and the others collect its runs; reconnected, it collects
// its share again. No line is lost or stored twice.
func TestRelayReplicaCutOffFromTheAPIServer(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	proxy := rs.restartBehindAPIProxy(ctx, t)

	f := startFlood(in, ctx, t, "e2e-replicas-apicut", 6)
	theirs := rs.runsOf(t, 2, f.Runs)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, atLeast(60), "before the cut")
	proxy.cut()
	cut := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		code, body := readyz(rs.relays[2])
		return code != http.StatusOK && strings.Contains(body, "[-]collecting"), nil
	})
	if err != nil {
		code, body := readyz(rs.relays[2])
		t.Fatalf("the replica cut off from the API server does not say so in readiness: %d %s", code, body)
	}
	rs.waitMembers(ctx, t, 0, 1)
	t.Logf("the others collect alone %s after the cut", time.Since(cut).Round(100*time.Millisecond))
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(60), "while replica r2 was cut off from the API server")
	t.Logf("runs of the cut-off replica %v stored on by the others", theirs)
	if err := proxy.restore(); err != nil {
		t.Fatal(err)
	}
	rs.waitMembers(ctx, t, 0, 1, 2)
	f.end(ctx, t, rs)
}

// refusals is how many commits r's store refused because another writer
// had moved the stream's cursor (its debug log says so).
func refusals(t *testing.T, r *harness.Relay) int {
	t.Helper()
	n, err := r.RefusedCommits()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// readyz is r's readiness, verbose.
func readyz(r *harness.Relay) (int, string) {
	resp, err := http.Get("http://" + r.ProbeAddr + "/readyz?verbose")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sseClient follows a run's log over SSE, reconnecting to the next relay
// with Last-Event-ID when a response breaks.
type sseClient struct {
	lines      []string
	reconnects int
	done       chan error
	// got, when set, is called with each line as it arrives.
	got func(line string)
}

func followSSE(ctx context.Context, rs *relayReplicas, run string, first, then int, got func(string)) *sseClient {
	c := &sseClient{done: make(chan error, 1), got: got}
	go func() {
		last, relayIdx := "", first
		for {
			ended, err := c.read(ctx, rs.relays[relayIdx], rs.token, run, &last)
			if ended {
				c.done <- nil
				return
			}
			if ctx.Err() != nil {
				c.done <- fmt.Errorf("SSE: %v (last error %v)", ctx.Err(), err)
				return
			}
			c.reconnects++
			relayIdx = then
			time.Sleep(100 * time.Millisecond) // a browser's EventSource waits too
		}
	}()
	return c
}

// read is one SSE response: it appends the lines and records the last id,
// and says whether the end event came.
func (c *sseClient) read(ctx context.Context, r *harness.Relay, token, run string, last *string) (bool, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+r.APIAddr+"/v1/runs/"+run+"/log", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	if *last != "" {
		req.Header.Set("Last-Event-ID", *last)
	}
	resp, err := suite.cluster.CA.HTTPClient().Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("SSE: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var id, event, data string
	for sc.Scan() {
		switch l := sc.Text(); {
		case l == "":
			switch event {
			case "line":
				var line store.Line
				if err := json.Unmarshal([]byte(data), &line); err != nil {
					return false, err
				}
				c.lines, *last = append(c.lines, line.Line), id
				if c.got != nil {
					c.got(line.Line)
				}
			case "end":
				return true, nil
			}
			id, event, data = "", "", ""
		case strings.HasPrefix(l, "id: "):
			id = strings.TrimPrefix(l, "id: ")
		case strings.HasPrefix(l, "event: "):
			event = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "data: "):
			data = strings.TrimPrefix(l, "data: ")
		}
	}
	return false, sc.Err()
}

// wait returns every line the client received once it saw the end.
func (c *sseClient) wait(t *testing.T) []string {
	t.Helper()
	select {
	case err := <-c.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the SSE client saw no end within five minutes of the run's end")
	}
	return c.lines
}

// socketProxy forwards connections to a server from an address of its
// own, and can cut them: a replica reaching PostgreSQL (or the API
// server) through it loses that server, not the other.
type socketProxy struct {
	network, listen, target string
	dir                     string // the PostgreSQL proxy's socket directory
	mu                      sync.Mutex
	ln                      net.Listener
	conns                   map[net.Conn]bool
	// pairs are the connections forwarded, for swallow.
	pairs []*proxied
}

// proxied is one connection through a socketProxy, and whether it
// forwards nothing more (swallow).
type proxied struct {
	mu    sync.Mutex
	stuck bool
}

// pipe copies src to dst until either fails, dropping everything once
// the connection is stuck.
func (c *proxied) pipe(dst, src net.Conn) {
	defer func() { dst.Close(); src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		c.mu.Lock()
		stuck := c.stuck
		c.mu.Unlock()
		if stuck {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// swallow makes the connections open now forward nothing more, without
// closing them, as a network path that drops packets does (both ends
// wait for bytes that never come); connections opened after are
// forwarded. It returns how many it swallowed.
func (p *socketProxy) swallow() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.pairs {
		c.mu.Lock()
		if !c.stuck {
			c.stuck = true
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// newSocketProxy proxies the server connString reaches (a unix socket
// directory in host=, the port in port=).
func newSocketProxy(connString string) (*socketProxy, error) {
	kv := map[string]string{}
	for _, f := range strings.Fields(connString) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	dir, err := os.MkdirTemp("", "pgproxy-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	p := &socketProxy{network: "unix", listen: filepath.Join(dir, ".s.PGSQL.5432"), target: filepath.Join(kv["host"], ".s.PGSQL."+kv["port"]),
		dir: dir, conns: map[net.Conn]bool{}}
	return p, p.restore()
}

// newTCPProxy proxies the TCP address target from a port of its own on
// the loopback.
func newTCPProxy(target string) (*socketProxy, error) {
	ports, err := cluster.FreePorts(1)
	if err != nil {
		return nil, err
	}
	p := &socketProxy{network: "tcp", listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), target: target, conns: map[net.Conn]bool{}}
	return p, p.restore()
}

// ConnString reaches database db through the proxy.
func (p *socketProxy) ConnString(db string) string {
	return fmt.Sprintf("host=%s port=5432 user=clipjob dbname=%s sslmode=disable", p.dir, db)
}

// restore listens again.
func (p *socketProxy) restore() error {
	ln, err := net.Listen(p.network, p.listen)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial(p.network, p.target)
			if err != nil {
				c.Close()
				continue
			}
			pc := &proxied{}
			p.mu.Lock()
			p.conns[c], p.conns[s] = true, true
			p.pairs = append(p.pairs, pc)
			p.mu.Unlock()
			go pc.pipe(s, c)
			go pc.pipe(c, s)
		}
	}()
	return nil
}

// close cuts the proxy and removes its socket's directory, if any.
func (p *socketProxy) close() {
	p.cut()
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

// cut closes the listener (its socket goes: new connections are refused)
// and every connection through it.
func (p *socketProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}
