package realnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/cmd/clipjob/app"
	"github.com/paperclipai/clipjob/doctor"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// TestChartRelayOnPostgresOnTheRealNode: the chart installed in the
// cluster, as TestChartRunsOnTheRealNode installs it, with the relay on
// PostgreSQL (`relay.store: postgres`, `relay.replicas: 2`, the connection
// string in `relay.postgres.url`, which the chart keeps in a Secret) and a
// server on the machine at the real node's address, where the pods reach
// it:
//   - both relay pods become Ready, each with its row in the store's
//     table of replicas and seeing the other;
//   - a real agent run is collected once and read back through the
//     relay's Service with a reader's token;
//   - the relay pod that collects a running run is deleted with no grace
//     while the agent writes: the other replica takes the run over, and
//     the stored log is the kubelet's, no line lost or twice;
//   - `clipjob doctor`, reading the install's values from the cluster,
//     passes, and the relay's ServiceAccount may do nothing with Leases;
//   - a wrong password in the Secret: the relay pod rolled out with it is
//     never Ready, each of its exits says the store refused it, and the
//     replicas before it keep serving.
func TestChartRelayOnPostgresOnTheRealNode(t *testing.T) {
	requireRealNode(t)
	t.Parallel() // a release and an agent namespace of its own
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const password = "e2e relay's password"
	pg, err := pgtest.StartListening(suite.cluster.RealNodeIP(), password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Error(err)
		}
	})
	r := installRelease(ctx, t, "pg", func(ns string) map[string]any {
		values := inClusterValues(ns)
		relayValues := values["relay"].(map[string]any)
		relayValues["store"], relayValues["replicas"] = "postgres", 2
		relayValues["postgres"] = map[string]any{"url": pg.TCPConnString("postgres", password)}
		return values
	})
	group := r.Name + "-relay"
	if _, err := suite.cs.PolicyV1().PodDisruptionBudgets(r.Namespace).Get(ctx, group, metav1.GetOptions{}); err != nil {
		t.Errorf("the relays' PodDisruptionBudget: %v", err)
	}
	conn := pg.ConnString("postgres")
	members := r.waitRelayMembers(ctx, t, conn, 2)
	t.Logf("relay replicas %v, each with its row in the table of replicas and seeing both", members)

	reader := r.newRelayReader(ctx, t)
	name := "e2e-chart-pg"
	r.in.CreateJob(ctx, t, realJobIn(t, r.in, name, "probe=1 lines=100 rate=100 burst=200"))
	if job := r.in.WaitJobEnded(ctx, t, name, 3*time.Minute); job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	want := kubeletLogIn(ctx, t, r.in.Namespace, r.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true }).Name)
	run := reader.waitRun(ctx, t, name, func(s *store.Run) bool { return s.Done })
	harness.ExactlyOnce(t, reader.log(ctx, t, name), want)
	if run.Result == nil || run.Result.Outcome != "succeeded" {
		t.Errorf("run %s: result %s", name, mustJSON(run.Result))
	}
	collector, err := harness.RunCollector(ctx, conn, "clipjob_relay", name, members)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("run %s: %d lines, collected by %s", name, len(want), collector)

	t.Run("the replica collecting a run is killed", func(t *testing.T) {
		r.killCollectingReplica(ctx, t, reader, conn, members)
	})
	r.waitAvailable(ctx, t, group)
	r.waitRelayMembers(ctx, t, conn, 2)

	t.Run("doctor passes and the relay may not touch Leases", func(t *testing.T) {
		results, code := r.clipjobDoctor(t)
		if code != 0 {
			t.Errorf("doctor on the install on PostgreSQL: exit %d", code)
		}
		for _, res := range results {
			if !res.OK {
				t.Errorf("doctor: %s failed: %s (fix: %s)", res.Check, res.Detail, res.Fix)
			}
		}
		// The relay's replicas divide the runs through the store: its
		// ServiceAccount, whose token a tenant may steal, can do nothing
		// with the release namespace's Leases (the webhook's election
		// among them).
		sa := "system:serviceaccount:" + r.Namespace + ":" + group
		for _, verb := range []string{"get", "list", "create", "update", "delete"} {
			review, err := suite.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + r.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: r.Namespace, Verb: verb, Group: "coordination.k8s.io", Resource: "leases"}}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if review.Status.Allowed {
				t.Errorf("%s may %s Leases in %s", sa, verb, r.Namespace)
			}
		}
	})

	t.Run("a wrong password in the Secret", func(t *testing.T) {
		r.wrongPassword(ctx, t, pg, reader, group, name, want)
	})
}

// relayPods are the release's relay pods, by name.
func (r *chartRelease) relayPods(ctx context.Context) (map[string]*corev1.Pod, error) {
	pods, err := suite.cs.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=relay,app.kubernetes.io/instance=" + r.Name})
	if err != nil {
		return nil, err
	}
	out := map[string]*corev1.Pod{}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			out[pods.Items[i].Name] = &pods.Items[i]
		}
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitRelayMembers waits until n relay pods are Ready, each has its row,
// under its name, among the live ones of the store's table of replicas
// (on the PostgreSQL at conn), no other row is live, and each sees n
// replicas live and collects (its metrics); it returns their names.
func (r *chartRelease) waitRelayMembers(ctx context.Context, t *testing.T, conn string, n int) []string {
	t.Helper()
	var names []string
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := r.relayPods(ctx)
		if err != nil {
			if ctx.Err() == nil { // else last keeps the condition that was not met
				last = err.Error()
			}
			return false, nil
		}
		names = names[:0]
		for name, p := range pods {
			if !podReady(p) {
				last = "pod " + name + " not Ready: " + harness.PodSummary(p)
				return false, nil
			}
			names = append(names, name)
		}
		if len(names) != n {
			last = fmt.Sprintf("%d relay pods, want %d", len(names), n)
			return false, nil
		}
		live, err := liveReplicaNames(ctx, conn)
		if err != nil {
			if ctx.Err() == nil {
				last = err.Error()
			}
			return false, nil
		}
		slices.Sort(names)
		if !slices.Equal(live, names) {
			last = fmt.Sprintf("live rows in the table of replicas %v, want one per pod %v", live, names)
			return false, nil
		}
		for _, name := range names {
			live, err := relayMetric(pods[name], "clipjob_relay_replicas ")
			collecting, err2 := relayMetric(pods[name], "clipjob_relay_replica_collecting ")
			if err != nil || err2 != nil || int(live) != n || collecting != 1 {
				last = fmt.Sprintf("pod %s sees %v replicas live, collecting %v (%v %v)", name, live, collecting, err, err2)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the relays never were %d Ready replicas each live in the table of replicas: %v (last: %s)", n, err, last)
	}
	return names
}

// liveReplicaNames are the names of the live rows of the chart's schema's
// table of replicas, sorted.
func liveReplicaNames(ctx context.Context, conn string) ([]string, error) {
	db, err := pgx.Connect(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer db.Close(context.WithoutCancel(ctx))
	rows, err := db.Query(ctx, `SELECT name FROM clipjob_relay.replicas WHERE expires_at > now() ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// relayMetric reads a relay pod's metric from its metrics port.
func relayMetric(p *corev1.Pod, prefix string) (float64, error) {
	return (&harness.Relay{MetricsAddr: net.JoinHostPort(p.Status.PodIP, "8080")}).Counter(prefix)
}

// killCollectingReplica deletes, with no grace, the relay pod that
// collects a run whose agent is still writing (rendezvous of the run over
// the live replicas' ids in the table of replicas on the PostgreSQL at
// conn), and requires the run's whole log stored, each line once.
func (r *chartRelease) killCollectingReplica(ctx context.Context, t *testing.T, reader *relayReader, conn string, members []string) {
	name := "e2e-chart-pg-kill"
	// 2,400 lines over 30 s: the takeover (a row's 4 s and a renewal at
	// most) happens while the agent writes.
	r.in.CreateJob(ctx, t, realJobIn(t, r.in, name, "lines=2400 rate=80"))
	reader.waitRun(ctx, t, name, func(s *store.Run) bool { return s.LastSeq >= 40 })
	owner, err := harness.RunCollector(ctx, conn, "clipjob_relay", name, members)
	if err != nil {
		t.Fatal(err)
	}
	job, err := suite.cs.BatchV1().Jobs(r.in.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if job.Status.Active != 1 {
		t.Fatalf("the agent of %s is not running any more (%+v): the kill would prove nothing", name, job.Status)
	}
	before := reader.waitRun(ctx, t, name, func(*store.Run) bool { return true })
	if err := suite.cs.CoreV1().Pods(r.Namespace).Delete(ctx, owner, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	agent := r.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true }).Name
	written := uint64(len(kubeletLogIn(ctx, t, r.in.Namespace, agent)))
	t.Logf("killed relay pod %s, which collects %s, with %d lines stored, %d written", owner, name, before.LastSeq, written)
	// The agent is still writing: a line written after the kill is stored
	// by another replica.
	reader.waitRun(ctx, t, name, func(s *store.Run) bool { return s.LastSeq > written })
	t.Logf("the run's lines written after the kill stored from %s after it", time.Since(killed).Round(100*time.Millisecond))
	if job := r.in.WaitJobEnded(ctx, t, name, 4*time.Minute); job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	want := kubeletLogIn(ctx, t, r.in.Namespace, agent)
	if written >= uint64(len(want)) {
		t.Fatalf("the relay had stored all %d lines before the kill: it proved nothing", len(want))
	}
	reader.waitRun(ctx, t, name, func(s *store.Run) bool { return s.Done })
	harness.ExactlyOnce(t, reader.log(ctx, t, name), want)
	t.Logf("%d lines, %d of them written after the kill, each stored once", len(want), uint64(len(want))-written)
}

// clipjobDoctor runs `clipjob doctor` on the release, as an operator does
// (no --values: it reads them from the cluster), and returns its results
// and exit code.
func (r *chartRelease) clipjobDoctor(t *testing.T) ([]doctor.Result, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := app.Main([]string{"doctor", "--kubeconfig", suite.cluster.Kubeconfig, "--namespace", r.Namespace,
		"--release", r.Name, "-o", "json", "--timeout", "3m"}, nil, &stdout, &stderr)
	var results []doctor.Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		t.Fatalf("doctor exit %d: %v: %s %s", code, err, stdout.String(), stderr.String())
	}
	for _, res := range results {
		t.Logf("doctor: %v %s: %s %s", res.OK, res.Check, res.Detail, res.Fix)
	}
	return results, code
}

// wrongPassword rolls the relays out with a wrong password in the chart's
// Secret: the new pod is never Ready, and each time it stops its log says
// the store refused the password (without the password); the rollout
// waits on it (maxUnavailable 0), so the replicas before it stay Ready and
// keep serving the runs.
func (r *chartRelease) wrongPassword(ctx context.Context, t *testing.T, pg *pgtest.Server, reader *relayReader, group, run string, want []string) {
	before, err := r.relayPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const wrong = "not the relay's password"
	secret := map[string]any{"stringData": map[string]string{"url": pg.TCPConnString("postgres", wrong)}}
	patch, _ := json.Marshal(secret)
	if _, err := suite.cs.CoreV1().Secrets(r.Namespace).Patch(ctx, group+"-postgres", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.clipjob.paperclip.io/restarted":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := suite.cs.AppsV1().Deployments(r.Namespace).Patch(ctx, group, types.StrategicMergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The new pod, once it has stopped twice (a crash loop), with the log
	// of its last run.
	var bad *corev1.Pod
	var logs []byte
	var last string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := r.relayPods(ctx)
		if err != nil {
			return false, nil
		}
		for name, p := range pods {
			if before[name] != nil {
				continue
			}
			bad, last = p, harness.PodSummary(p)
			if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 2 {
				return false, nil
			}
			// The log of its last run: the current container's while it
			// waits to restart, else the previous one's (the kubelet keeps
			// one dead container).
			for _, previous := range []bool{false, true} {
				logs, err = suite.cs.CoreV1().Pods(p.Namespace).GetLogs(name, &corev1.PodLogOptions{Container: "relay", Previous: previous}).DoRaw(ctx)
				if err == nil && bytes.Contains(logs, []byte("clipjob-relay stopped")) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no relay pod rolled out with the wrong password stopped twice, logging why: %v (last: %s; log %.2000s)", err, last, logs)
	}
	if podReady(bad) {
		t.Errorf("relay pod %s is Ready with a wrong password", bad.Name)
	}
	st := bad.Status.ContainerStatuses[0]
	term := st.LastTerminationState.Terminated
	if term == nil || term.ExitCode == 0 {
		t.Fatalf("relay pod %s with a wrong password: last state %+v, want a failed exit", bad.Name, st.LastTerminationState)
	}
	t.Logf("relay pod %s: %d restarts, last exit %d: %s", bad.Name, st.RestartCount, term.ExitCode, term.Message)
	// Its log, and its status (the chart's FallbackToLogsOnError), say the
	// store refused the password, and do not show it.
	for what, said := range map[string]string{"log": string(logs), "termination message": term.Message} {
		for _, w := range []string{"postgres store", "password authentication failed for user"} {
			if !strings.Contains(said, w) {
				t.Errorf("the %s of relay pod %s, stopped with a wrong password, does not say %q:\n%s", what, bad.Name, w, said)
			}
		}
		if strings.Contains(said, wrong) {
			t.Errorf("the %s of relay pod %s shows the password", what, bad.Name)
		}
	}
	pods, err := r.relayPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name := range before {
		if p := pods[name]; p == nil || !podReady(p) {
			t.Errorf("relay pod %s, running before the rollout, is gone or not Ready", name)
		}
	}
	harness.ExactlyOnce(t, reader.log(ctx, t, run), want)
}
