package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store"
)

// The relay's replicas on PostgreSQL, attacked: by whoever can write the
// Leases of the release's namespace, by a client of the API, and by an
// operator who names things carelessly.

// runOwnedBy is a run id (a Job name) starting with prefix that
// rendezvous hashing with the group's secret gives member among members.
func runOwnedBy(secret []byte, prefix, member string, members []string) string {
	for i := 0; ; i++ {
		run := fmt.Sprintf("%s-%d", prefix, i)
		if replicas.Pick(secret, members, run) == member {
			return run
		}
	}
}

// waitLiveSeen waits until replica i sees n replicas live.
func (rs *relayReplicas) waitLiveSeen(ctx context.Context, t *testing.T, i, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		v, err := rs.relays[i].Counter("clipjob_relay_replicas ")
		return err == nil && int(v) == n, nil
	})
	if err != nil {
		v, _ := rs.relays[i].Counter("clipjob_relay_replicas ")
		t.Fatalf("replica %s sees %.0f replicas live, not %d: %v", rs.ids[i], v, n, err)
	}
}

// TestHostileRelayGhostLeaseFromASkewedClockLapses: a Lease for a replica
// that does not exist, with the usual duration and a renewal time far in
// the future (a clock hours ahead), written once. Every replica measures
// renewals by its own clock, not by the time written: the ghost lapses
// after its duration, and the runs the hash gives it are collected.
func TestHostileRelayGhostLeaseFromASkewedClockLapses(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	leases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	ghost := "skewed"
	secs := int32(10)
	ahead := metav1.NewMicroTime(time.Now().Add(24 * time.Hour))
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: replicas.LeaseName(rs.group, ghost), Labels: map[string]string{replicas.LabelGroup: rs.group}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &ghost, LeaseDurationSeconds: &secs, AcquireTime: &ahead, RenewTime: &ahead},
	}
	replicas.SignLease(rs.secret, l) // a replica of the group, its clock a day ahead
	if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leases.Delete(context.Background(), l.Name, metav1.DeleteOptions{}) })
	rs.waitLiveSeen(ctx, t, 0, 4)
	run := runOwnedBy(rs.secret, "e2e-hostile-skew", ghost, append(slices.Clone(rs.ids), ghost))
	pod, log := agentRun(in, ctx, t, run)
	if err := log.Write(`{"type":"assistant","n":1}`, `{"type":"assistant","n":2}`, `{"type":"assistant","n":3}`); err != nil {
		t.Fatal(err)
	}
	rs.waitMembers(ctx, t, 0, 1, 2)
	waitStoredAtLeast(ctx, t, rs.relays[0], rs.token, run, 3, "after the ghost's Lease lapsed")
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	rs.relays[1].WaitRun(ctx, t, rs.token, run, func(r *store.Run) bool { return r.Done })
}

// TestHostileRelayDeletedLeasesLoseNoLine: every replica's Lease is
// deleted again and again while a flood is stored. Each replica then sees
// few others, and several collect one run at once: every line is still
// stored once, and once the deletions stop every replica is a member again.
func TestHostileRelayDeletedLeasesLoseNoLine(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-hostile-del", 3)
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, atLeast(60), "before the deletions")
	leases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var deleted atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, id := range rs.ids {
				if err := leases.Delete(ctx, replicas.LeaseName(rs.group, id), metav1.DeleteOptions{}); err == nil {
					deleted.Add(1)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	// Each replica's Lease deleted ten times at least (it renews every 2 s).
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return deleted.Load() >= int64(10*len(rs.ids)), nil
	})
	if err != nil {
		t.Fatalf("%d Leases deleted: %v", deleted.Load(), err)
	}
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, f.beyond(300), "while the replicas' Leases were deleted")
	close(stop)
	wg.Wait()
	t.Logf("%d Leases deleted under the replicas", deleted.Load())
	rs.waitMembers(ctx, t, 0, 1, 2)
	f.end(ctx, t, rs)
}

// TestHostileRelaySchemaNamedLikeSQL: three replicas start at once on a
// schema whose name is SQL (quotes, a statement, a comment) and which does
// not exist yet. One migrates while the others wait; every replica
// collects; a replica that does not collect a run serves its lines live
// (the notification channel is the schema's name); and the statement in
// the name ran nowhere.
func TestHostileRelaySchemaNamedLikeSQL(t *testing.T) {
	in := newInstall(t)
	ctx, base := readyReplicas(in, t)
	for _, r := range base.relays {
		r.Stop() // this test's replicas are the three below
	}
	const schema = `Hostile"; DROP SCHEMA public CASCADE; --`
	rs := &relayReplicas{pg: base.pg, ids: []string{"h0", "h1", "h2"}, group: base.group + "-sql", token: base.token,
		mirror: filepath.Join(suite.cluster.Dir, base.group+"-sql-mirror")}
	urlFile := filepath.Join(suite.cluster.Dir, "relay-"+rs.group+".pgurl")
	if err := os.WriteFile(urlFile, []byte(rs.pg.ConnString("postgres")), 0o600); err != nil {
		t.Fatal(err)
	}
	rs.relays = make([]*harness.Relay, len(rs.ids))
	errs := make([]error, len(rs.ids))
	var wg sync.WaitGroup
	for i, id := range rs.ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs.relays[i], errs[i] = harness.StartRelay(ctx, suite.cluster, replicasSetup.bin, "relay-"+rs.group+"-"+id, in.Namespace, "--store", "postgres",
				"--postgres-url-file", urlFile, "--postgres-schema", schema, "--lease-namespace", harness.Release.Namespace,
				"--lease-group", rs.group, "--replica-id", id, "--mirror-dir", rs.mirror)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, r := range rs.relays {
			if r != nil {
				r.Stop()
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %s: %v", rs.ids[i], err)
		}
	}
	rs.waitMembers(ctx, t, 0, 1, 2)

	pod, log := agentRun(in, ctx, t, "e2e-hostile-schema")
	run := pod.Labels[contract.LabelRunID]
	reader := (rs.owner(run) + 1) % 3
	rs.relays[reader].WaitRun(ctx, t, rs.token, run, func(*store.Run) bool { return true })
	var mu sync.Mutex
	var got []string
	sse := followSSE(ctx, rs, run, reader, reader, func(line string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, line)
	})
	var want []string
	for i := range 5 {
		l := fmt.Sprintf(`{"type":"assistant","n":%d}`, i)
		if err := log.Write(l); err != nil {
			t.Fatal(err)
		}
		want = append(want, l)
		// Well under the 15 s at which a follower re-reads untold: the
		// collecting replica's notification reached the reader.
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(got, l), nil
		})
		if err != nil {
			t.Fatalf("line %d did not reach a client of replica %s within 10 s: no notification on the schema's channel", i, rs.ids[reader])
		}
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	harness.ExactlyOnce(t, sse.wait(t), want)

	conn, err := pgx.Connect(ctx, rs.pg.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var public bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'public')`).Scan(&public); err != nil {
		t.Fatal(err)
	}
	if !public {
		t.Error("the schema public is gone: the statement in the schema's name ran")
	}
	rows, err := conn.Query(ctx, `SELECT version FROM `+pgx.Identifier{schema}.Sanitize()+`.schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range versions {
		if v != int32(i+1) {
			t.Errorf("migrations recorded %v: want each of 1..%d once", versions, len(versions))
			break
		}
	}
	t.Logf("3 replicas started at once on schema %q: migrations %v", schema, versions)
}

// TestHostileRelayFilterWildcardsMatchNothing: the filters of /v1/runs are
// compared whole in SQL: a LIKE wildcard or a quote in an agent, a company
// or a phase selects no run, while the run's own agent selects it.
func TestHostileRelayFilterWildcardsMatchNothing(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	pod, _ := agentRun(in, ctx, t, "e2e-hostile-like")
	run := pod.Labels[contract.LabelRunID]
	agent := pod.Labels[contract.LabelAgentID]
	rs.relays[0].WaitRun(ctx, t, rs.token, run, func(*store.Run) bool { return true })
	list := func(q string) (int, string) {
		resp, err := rs.relays[1].Get("/v1/runs?"+q, rs.token, "")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := list("agent=" + url.QueryEscape(agent)); code != http.StatusOK || !strings.Contains(body, `"id":"`+run+`"`) {
		t.Fatalf("the run's own agent does not select it: %d %s", code, body)
	}
	for _, v := range []string{"%", "_%", "agent-e2e-hostile-%", "' OR '1'='1", `\`, "agent-e2e-hostile-lik_"} {
		for _, q := range []string{"agent", "company", "phase"} {
			if code, body := list(q + "=" + url.QueryEscape(v)); code != http.StatusOK || strings.Contains(body, `"runs":[{`) {
				t.Errorf("GET /v1/runs?%s=%s: %d %s", q, v, code, body)
			}
		}
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
}

// TestHostileRelayDuplicateReplicaID: a fourth relay is started with the
// identity of a running replica (an operator's copy-paste, or host names
// that are not unique). Both renew one Lease and both collect that
// replica's runs: each line is stored once; the copy stopping deletes the
// Lease, and the replica it copied takes it back and collects on.
func TestHostileRelayDuplicateReplicaID(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	dup, err := harness.StartRelay(ctx, suite.cluster, replicasSetup.bin, "relay-"+rs.group+"-r0-copy", in.Namespace, "--store", "postgres",
		"--postgres-url-file", filepath.Join(suite.cluster.Dir, "relay-"+rs.group+"-r0.pgurl"), "--postgres-schema", replicasSchema,
		"--lease-namespace", harness.Release.Namespace, "--lease-group", rs.group, "--replica-id", "r0", "--mirror-dir", rs.mirror)
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Stop()
	f := startFlood(in, ctx, t, "e2e-hostile-dup", 3)
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, f.beyond(300), "with two replicas named r0")
	dup.Stop()
	rs.waitMembers(ctx, t, 0, 1, 2)
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, f.beyond(60), "after the copy of r0 stopped")
	f.end(ctx, t, rs)
}

// TestHostileRelayKilledReplicaLeavesNoLease: a replica SIGKILLed (an
// OOM kill, a lost node) cannot delete its Lease, and in a Deployment its
// pod never comes back under the same name. The others delete that Lease
// once it has lapsed for another full duration, through the API server
// with the Lease as they saw it as precondition, so killed pods' Leases do
// not pile up in the group; a Lease in the group that names no member (its
// holder is not the identity in its name) is not theirs to delete.
func TestHostileRelayKilledReplicaLeavesNoLease(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	leases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	holder, secs, long := "someone", int32(10), metav1.NewMicroTime(time.Now().Add(-time.Hour))
	decoy := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: replicas.LeaseName(rs.group, "decoy"), Labels: map[string]string{replicas.LabelGroup: rs.group}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &long},
	}
	if _, err := leases.Create(ctx, decoy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leases.Delete(context.Background(), decoy.Name, metav1.DeleteOptions{}) })

	rs.relays[2].Kill()
	killed := time.Now()
	lease := replicas.LeaseName(rs.group, rs.ids[2])
	if _, err := leases.Get(ctx, lease, metav1.GetOptions{}); err != nil {
		t.Fatalf("the killed replica's Lease %s is gone at once (%v): it was not killed", lease, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := leases.Get(ctx, lease, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the Lease %s of the killed replica is still there %s after the kill: %v", lease, time.Since(killed).Round(time.Second), err)
	}
	t.Logf("the killed replica's Lease deleted %s after the kill (lease %s)", time.Since(killed).Round(100*time.Millisecond), relay.DefaultOptions().Replicas.LeaseDuration)
	rs.waitMembers(ctx, t, 0, 1)
	if _, err := leases.Get(ctx, decoy.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the Lease %s, held by no member of the group, was deleted: %v", decoy.Name, err)
	}
}

// TestHostileRelayRetiredRunStaysRetired: retention (here any finished
// run beyond one byte, every second) deletes a run whose pod remains (its
// Job is kept, with no TTL). Then every replica restarts without
// retention, so that a run collected again would stay: the replica the
// run now belongs to sees its pod and leaves it, and so does the replica
// that first collected it when it is back. The run stays gone through
// every replica, its mirror file is not rewritten, and the store's record
// of its retirement is the first one. The replicas keep a schema of their
// own: retention this eager would delete the other tests' runs.
func TestHostileRelayRetiredRunStaysRetired(t *testing.T) {
	in := newInstall(t)
	const schema = "e2e_retired"
	ctx, rs := readyReplicasWith(in, t, "--postgres-schema", schema, "--retention-max-bytes", "1", "--retention-interval", "1s")
	run := "e2e-hostile-retired"
	owner := rs.owner(run)
	pod, log := agentRun(in, ctx, t, run)
	if err := log.Write(`{"type":"assistant","n":1}`, `{"type":"assistant","n":2}`, `{"type":"assistant","n":3}`); err != nil {
		t.Fatal(err)
	}
	waitStoredAtLeast(ctx, t, rs.relays[owner], rs.token, run, 3, "before the run ends")
	job := pod.Labels["batch.kubernetes.io/job-name"]
	in.FinishRun(ctx, t, job, "0")
	jobUID := string(metav1.GetControllerOf(pod).UID)
	mirror := filepath.Join(rs.mirror, "run-logs", "acme", "agent-"+run, run+".pod.ndjson")
	gone := func(which ...int) string {
		for _, i := range which {
			if _, code := rs.relays[i].Run(t, rs.token, run); code != http.StatusNotFound {
				return fmt.Sprintf("replica %s answers %d for the run", rs.ids[i], code)
			}
		}
		if _, err := os.Stat(mirror); !os.IsNotExist(err) {
			return fmt.Sprintf("its mirror file %s: %v", mirror, err)
		}
		return ""
	}
	db, err := pgx.Connect(ctx, rs.pg.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	retiredAt := func() (at int64) {
		_ = db.QueryRow(ctx, `SELECT retired_at FROM `+schema+`.retired_runs WHERE job_uid = $1`, jobUID).Scan(&at)
		return at
	}
	waitFor := func(what string, ok func() string) {
		t.Helper()
		last := ""
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
			last = ok()
			return last == "", nil
		})
		if err != nil {
			t.Fatalf("%s: %v (last: %s)", what, err, last)
		}
	}
	all := []int{0, 1, 2}
	waitFor("retention deletes the finished run", func() string {
		if retiredAt() == 0 {
			return "no record of its retirement in the store"
		}
		return gone(all...)
	})
	first := retiredAt()

	// Every replica again, without retention: a run collected again stays.
	for _, r := range rs.relays {
		r.Stop()
	}
	rs.extra = []string{"--postgres-schema", schema}
	restart := func(i int) {
		t.Helper()
		r, err := rs.start(ctx, rs.ids[i], rs.group, rs.conn(i))
		if err != nil {
			t.Fatal(err)
		}
		rs.relays[i] = r
	}
	// leftAlone: replica i, a member, has passed over a retired run's pod
	// (the pods it owns are offered to it when it joins), and the run
	// stays gone for five retention intervals of the earlier replicas.
	leftAlone := func(i int, which ...int) {
		t.Helper()
		waitFor("replica "+rs.ids[i]+" passes over a retired run's pod", func() string {
			if v, _ := rs.relays[i].Counter("clipjob_relay_pods_ignored_total", `reason="retired"`); v < 1 {
				return "no pod passed over as retired"
			}
			return gone(which...)
		})
		for range 10 {
			if why := gone(which...); why != "" {
				t.Fatalf("the retired run came back: %s", why)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	var others []int
	for i := range rs.ids {
		if i != owner {
			others = append(others, i)
			restart(i)
		}
	}
	rs.waitMembers(ctx, t, others...)
	leftAlone(rs.owner(run, rs.ids[others[0]], rs.ids[others[1]]), others...)
	restart(owner)
	rs.waitMembers(ctx, t, all...)
	leftAlone(owner, all...)
	if got := retiredAt(); got != first {
		t.Errorf("the run's retirement recorded at %d, then at %d: it was collected and retired again", first, got)
	}
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the run's pod is gone (%v): the test proved nothing", err)
	}
}
