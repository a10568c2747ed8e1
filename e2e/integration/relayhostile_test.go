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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/store"
)

// The relay's replicas on PostgreSQL, attacked: by whoever can write the
// Leases of the release's namespace, by a client of the API, and by an
// operator who names things carelessly.

// relayGroupLabel is the label relays before the table of replicas put on
// their Leases, by which they counted each other as members.
const relayGroupLabel = "clipjob.paperclip.io/relay-group"

// TestHostileRelayLeasesMoveNoRun: whoever may write the Leases of the
// release's namespace (a tenant with Lease rights there, a stolen token)
// makes up replicas as Leases, labeled and named as relays once named
// theirs, renews them, and deletes them again and again while a flood is
// stored. The replicas divide the runs through their store alone: every
// replica sees the three live all along, and every line is stored once.
func TestHostileRelayLeasesMoveNoRun(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	f := startFlood(in, ctx, t, "e2e-hostile-leases", 3)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, atLeast(60), "before the Leases")
	leases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	names := append(slices.Clone(rs.ids), "phantom-0", "phantom-1", "phantom-2")
	t.Cleanup(func() {
		for _, id := range names {
			_ = leases.Delete(context.Background(), rs.group+"."+id, metav1.DeleteOptions{})
		}
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var written atomic.Int64
	wg.Go(func() {
		for round := 0; ; round++ {
			for _, id := range names {
				name, now, secs := rs.group+"."+id, metav1.NewMicroTime(time.Now()), int32(3600)
				l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{relayGroupLabel: rs.group}},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}
				var err error
				if round%2 == 0 {
					_, err = leases.Create(ctx, l, metav1.CreateOptions{})
				} else {
					err = leases.Delete(ctx, name, metav1.DeleteOptions{})
				}
				if err == nil {
					written.Add(1)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	})
	// Over more than a row's duration of made-up members, each replica
	// sees the three, and collects.
	var seen []string
	until := time.Now().Add(3 * relay.DefaultOptions().Replicas.LeaseDuration)
	for time.Now().Before(until) || written.Load() < int64(4*len(names)) {
		for i, r := range rs.relays {
			live, err := r.Counter("clipjob_relay_replicas ")
			collecting, err2 := r.Counter("clipjob_relay_replica_collecting ")
			if err != nil || err2 != nil || live != 3 || collecting != 1 {
				seen = append(seen, fmt.Sprintf("%s: %v live, collecting %v (%v %v)", rs.ids[i], live, collecting, err, err2))
			}
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(300), "while Leases were written and deleted")
	close(stop)
	wg.Wait()
	if len(seen) > 0 {
		t.Errorf("the replicas' view moved while Leases were written: %v", seen)
	}
	t.Logf("%d Leases written or deleted under the replicas; none counted", written.Load())
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
	rs := &relayReplicas{pg: base.pg, ids: []string{"h0", "h1", "h2"}, group: base.group + "-sql", schema: schema, token: base.token,
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
				"--postgres-url-file", urlFile, "--postgres-schema", schema, "--replica-id", id, "--mirror-dir", rs.mirror)
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
	reader := (rs.owner(t, run) + 1) % 3
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
// name of a running replica (an operator's copy-paste, or host names that
// are not unique). Names are for people: each has a row of its own, and
// the four divide the runs; each line is stored once; the copy stopping
// deletes its row only, and the three collect on.
func TestHostileRelayDuplicateReplicaID(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	dup, err := harness.StartRelay(ctx, suite.cluster, replicasSetup.bin, "relay-"+rs.group+"-r0-copy", in.Namespace, "--store", "postgres",
		"--postgres-url-file", filepath.Join(suite.cluster.Dir, "relay-"+rs.group+"-r0.pgurl"), "--postgres-schema", replicasSchema,
		"--replica-id", "r0", "--mirror-dir", rs.mirror)
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Stop()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		v, err := dup.Counter("clipjob_relay_replicas ")
		return err == nil && v == 4, nil
	})
	if err != nil {
		t.Fatalf("the copy of r0 does not see four replicas: %v", err)
	}
	f := startFlood(in, ctx, t, "e2e-hostile-dup", 3)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(300), "with two replicas named r0")
	dup.Stop()
	rs.waitMembers(ctx, t, 0, 1, 2)
	waitEach(ctx, t, rs.relays[0], rs.token, f.Runs, f.beyond(60), "after the copy of r0 stopped")
	f.end(ctx, t, rs)
}

// TestHostileRelayKilledReplicaLeavesNoRow: a replica SIGKILLed (an OOM
// kill, a lost node) cannot delete its row in the table of replicas, and
// in a Deployment its pod never comes back under the same name. Its row
// lapses by the server's clock, and the others delete it once it has
// been gone another duration, so killed pods' rows do not pile up.
func TestHostileRelayKilledReplicaLeavesNoRow(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	conn := rs.pg.ConnString("postgres")
	rs.relays[2].Kill()
	killed := time.Now()
	if ids, err := harness.ReplicaIDs(ctx, conn, rs.schema); err != nil || ids[rs.ids[2]] == "" {
		t.Fatalf("the killed replica's row is gone at once (%v, %v): it was not killed", ids, err)
	}
	rs.waitMembers(ctx, t, 0, 1)
	t.Logf("the others see the killed replica gone %s after the kill (lease %s, renewal %s)", time.Since(killed).Round(100*time.Millisecond),
		relay.DefaultOptions().Replicas.LeaseDuration, relay.DefaultOptions().Replicas.RenewInterval)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		ids, err := harness.ReplicaIDs(ctx, conn, rs.schema)
		return err == nil && ids[rs.ids[2]] == "" && len(ids) == 2, nil
	})
	if err != nil {
		t.Fatalf("the row of the killed replica is still there %s after the kill: %v", time.Since(killed).Round(time.Second), err)
	}
	t.Logf("the killed replica's row deleted %s after the kill", time.Since(killed).Round(100*time.Millisecond))
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
	owner := rs.owner(t, run)
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
	leftAlone(rs.owner(t, run, rs.ids[others[0]], rs.ids[others[1]]), others...)
	restart(owner)
	rs.waitMembers(ctx, t, all...)
	// Started again, each replica has a new id, and the run may belong to
	// another than the one that first collected it.
	leftAlone(rs.owner(t, run), all...)
	if got := retiredAt(); got != first {
		t.Errorf("the run's retirement recorded at %d, then at %d: it was collected and retired again", first, got)
	}
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the run's pod is gone (%v): the test proved nothing", err)
	}
}
