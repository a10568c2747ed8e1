package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/store"
)

// The relay on PostgreSQL against bad input and failing storage, on the
// real API server, the way a client, an agent or an operator would meet
// them: a cursor past any log, a mirror file another process locks, a
// store it cannot write, a run seen while writes fail.

// relayGetWith is a GET of path on r with the reader's token and headers.
func relayGetWith(t *testing.T, r *harness.Relay, token, path string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+r.APIAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := suite.cluster.CA.HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHostileRelayHugeCursorIsPastTheEnd: a client asks for the lines
// after a cursor at or above 2^63, where PostgreSQL's bigint ends (and
// bbolt's after+1 wraps): no line is after it, in plain text, NDJSON or
// SSE (?after= or Last-Event-ID), on every replica; a cursor no uint64
// holds is a 400. Never the whole log.
func TestHostileRelayHugeCursorIsPastTheEnd(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	pod, log := agentRun(in, ctx, t, "e2e-hostile-cursor")
	run := pod.Labels[contract.LabelRunID]
	want := []string{`{"type":"assistant","n":1}`, `{"type":"assistant","n":2}`, `{"type":"assistant","n":3}`}
	if err := log.Write(want...); err != nil {
		t.Fatal(err)
	}
	waitStoredAtLeast(ctx, t, rs.relays[0], rs.token, run, len(want), "before the cursors")
	path := "/v1/runs/" + run + "/log"
	ndjson := map[string]string{"Accept": "application/x-ndjson"}
	sse := map[string]string{"Accept": "text/event-stream"}
	// The cursors that work, so that an empty answer below means something.
	if code, body := relayGetWith(t, rs.relays[1], rs.token, path+"?after=2", nil); code != http.StatusOK || body != want[2]+"\n" {
		t.Fatalf("GET %s?after=2: %d %q, want the third line", path, code, body)
	}
	huge := []string{"9223372036854775807", "9223372036854775808", "9223372036854775809", "18446744073709551614", "18446744073709551615"}
	check := func(done bool) {
		t.Helper()
		for _, r := range rs.relays {
			for _, c := range huge {
				asks := []struct {
					path   string
					header map[string]string
				}{
					{path + "?after=" + c, nil},
					{path + "?follow=false&after=" + c, ndjson},
					{path + "?follow=false&after=" + c, sse},
					{path + "?follow=false", map[string]string{"Accept": "text/event-stream", "Last-Event-ID": c}},
				}
				for _, a := range asks {
					code, body := relayGetWith(t, r, rs.token, a.path, a.header)
					if code != http.StatusOK && code != http.StatusNoContent || strings.Contains(body, `"type":"assistant"`) {
						t.Errorf("GET %s %v (run done %v): %d %.300q, want no line", a.path, a.header, done, code, body)
					}
					if done && a.header["Last-Event-ID"] == "" && a.header != nil && !strings.Contains(body, `"type":"end"`) {
						t.Errorf("GET %s %v of a done run: %d %.300q, want its end", a.path, a.header, code, body)
					}
				}
			}
			for _, c := range []string{"18446744073709551616", "340282366920938463463374607431768211456", "99999999999999999999999999999999", "-1"} {
				for _, a := range []map[string]string{nil, {"Accept": "text/event-stream", "Last-Event-ID": c}} {
					p := path + "?follow=false"
					if a == nil {
						p += "&after=" + c
					}
					if code, body := relayGetWith(t, r, rs.token, p, a); code != http.StatusBadRequest || !strings.Contains(body, "want a sequence number") {
						t.Errorf("GET %s %v: %d %.300q, want a 400 saying the cursor is no sequence number", p, a, code, body)
					}
				}
			}
		}
	}
	check(false)
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	rs.relays[0].WaitRun(ctx, t, rs.token, run, func(r *store.Run) bool { return r.Done })
	check(true)
	harness.ExactlyOnce(t, rs.relays[2].Lines(t, rs.token, run), want)
}

// assistantLines are lines n from..to-1 an agent writes.
func assistantLines(from, to int) []string {
	var out []string
	for n := from; n < to; n++ {
		out = append(out, fmt.Sprintf(`{"type":"assistant","n":%d}`, n))
	}
	return out
}

// mirrorLines are the lines of a mirror file.
func mirrorLines(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// waitMirror waits until the mirror file holds want.
func waitMirror(ctx context.Context, t *testing.T, file string, want []string, why string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return slices.Equal(mirrorLines(file), want), nil
	})
	if err != nil {
		t.Fatalf("mirror file %s holds %d lines, not the %d stored, %s: %v", file, len(mirrorLines(file)), len(want), why, err)
	}
}

// TestHostileRelayLockedMirrorFileStopsNoCollection: every agent on the
// shared volume can open a run's mirror file, and flock locks a file
// opened for reading. An agent holds the lock while its run writes more
// lines: the collecting replica gives up on the mirror at each commit
// instead of waiting there, so each line is still stored and served; once
// the lock is let go, the mirror catches up, every line once.
func TestHostileRelayLockedMirrorFileStopsNoCollection(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	pod, log := agentRun(in, ctx, t, "e2e-hostile-flock")
	run := pod.Labels[contract.LabelRunID]
	want := assistantLines(0, 3)
	if err := log.Write(want...); err != nil {
		t.Fatal(err)
	}
	x := rs.relays[0].WaitRun(ctx, t, rs.token, run, func(r *store.Run) bool { return r.LastSeq >= 3 })
	file := filepath.Join(rs.mirror, "run-logs", x.Company, x.Agent, run+".pod.ndjson")
	waitMirror(ctx, t, file, want, "before the lock")
	f, err := os.Open(file) // read only, as any agent may
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Taken between two syncs, which hold it for a moment each.
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil, nil
	})
	if err != nil {
		t.Fatalf("the mirror file's lock: %v", err)
	}
	locked := time.Now()
	// Rounds, each stored before the next is written: a follower waiting
	// on the lock after its first commit would store no further round.
	for round := range 3 {
		more := assistantLines(len(want), len(want)+10)
		if err := log.Write(more...); err != nil {
			t.Fatal(err)
		}
		want = append(want, more...)
		waitStoredAtLeast(ctx, t, rs.relays[(round+1)%3], rs.token, run, len(want), "while an agent held its mirror file's lock")
	}
	t.Logf("3 rounds of lines stored in %s while the mirror file was locked", time.Since(locked).Round(100*time.Millisecond))
	harness.ExactlyOnce(t, rs.relays[2].Lines(t, rs.token, run), want)
	if got := mirrorLines(file); len(got) != 3 {
		t.Errorf("the mirror file holds %d lines while locked, want the 3 from before: the relay wrote it without its lock", len(got))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	waitMirror(ctx, t, file, want, "after the lock was let go")
	t.Logf("the mirror caught up %s after the lock was let go", time.Since(released).Round(100*time.Millisecond))
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	rs.relays[1].WaitRun(ctx, t, rs.token, run, func(r *store.Run) bool { return r.Done })
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(file + ".done")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no done marker beside the mirror file: %v", err)
	}
	harness.ExactlyOnce(t, mirrorLines(file), want)
}

// pgAdmin is a superuser session on the replicas' server, opened now: a
// database default changed later does not apply to it.
func pgAdmin(ctx context.Context, t *testing.T, rs *relayReplicas) func(q string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, rs.pg.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return func(q string) {
		t.Helper()
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestHostileRelayReadOnlyStoreIsNotReady: PostgreSQL still answers but
// refuses every write (a standby after a failover, or an operator's
// default_transaction_read_only). The replicas say in readiness that the
// store fails and in their logs why, and stop being members; a run
// started meanwhile is collected once writes are taken again, every line
// once.
func TestHostileRelayReadOnlyStoreIsNotReady(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	admin := pgAdmin(ctx, t, rs)
	// A database default applies to new sessions: the replicas' are ended.
	endSessions := "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'postgres' AND pid <> pg_backend_pid()"
	admin("ALTER DATABASE postgres SET default_transaction_read_only = on")
	admin(endSessions)
	readOnly := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		for _, r := range rs.relays {
			code, body := readyz(r)
			c, err := r.Counter("clipjob_relay_replica_collecting ")
			if code == http.StatusOK || !strings.Contains(body, "[-]store") || !strings.Contains(body, "[-]collecting") || err != nil || c != 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for i, r := range rs.relays {
			code, body := readyz(r)
			t.Logf("replica %s: %d %s", rs.ids[i], code, body)
		}
		t.Fatalf("on a read-only PostgreSQL the replicas are not all unready and out of the group: %v", err)
	}
	t.Logf("every replica unready and no member %s after PostgreSQL turned read-only", time.Since(readOnly).Round(100*time.Millisecond))
	for i, r := range rs.relays {
		b, err := os.ReadFile(r.Log)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "refuses writes") {
			t.Errorf("replica %s's log does not say PostgreSQL refuses writes", rs.ids[i])
		}
	}
	pod, log := agentRun(in, ctx, t, "e2e-hostile-readonly")
	run := pod.Labels[contract.LabelRunID]
	want := assistantLines(0, 20)
	if err := log.Write(want[:10]...); err != nil {
		t.Fatal(err)
	}
	admin("ALTER DATABASE postgres RESET default_transaction_read_only")
	admin(endSessions)
	rs.waitMembers(ctx, t, 0, 1, 2)
	for i, r := range rs.relays {
		if code, body := readyz(r); code != http.StatusOK {
			t.Errorf("replica %s not ready once PostgreSQL takes writes: %d %s", rs.ids[i], code, body)
		}
	}
	if err := log.Write(want[10:]...); err != nil {
		t.Fatal(err)
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	rs.relays[0].WaitRun(ctx, t, rs.token, run, func(r *store.Run) bool { return r.Done })
	for _, r := range rs.relays {
		harness.ExactlyOnce(t, r.Lines(t, rs.token, run), want)
	}
}

// TestHostileRelayRunSeenWhileWritesFailIsCollected: the store refuses
// the record of a new run exactly while its pod appears and starts (a
// trigger refusing inserts into the runs table: PostgreSQL answers, so
// every replica stays healthy and a member, and nothing else changes).
// Then it takes writes again and the pod does not change: the replica
// that owns the run tries the record again by itself and collects the
// run, every line once.
func TestHostileRelayRunSeenWhileWritesFailIsCollected(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	admin := pgAdmin(ctx, t, rs)
	runs := pgx.Identifier{replicasSchema, "runs"}.Sanitize()
	admin(`CREATE FUNCTION e2e_refuse_runs() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'e2e: this store refuses new runs'; END $$`)
	admin(`CREATE TRIGGER e2e_refuse_runs BEFORE INSERT ON ` + runs + ` FOR EACH ROW EXECUTE FUNCTION e2e_refuse_runs()`)
	pod, log := agentRun(in, ctx, t, "e2e-hostile-refused")
	run := pod.Labels[contract.LabelRunID]
	owner := rs.owner(t, run)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(rs.relays[owner].Log)
		return err == nil && strings.Contains(string(b), "refuses new runs"), nil
	})
	if err != nil {
		t.Fatalf("replica %s, which owns %s, was never refused its record: %v", rs.ids[owner], run, err)
	}
	seen, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if x, _ := rs.relays[owner].Run(t, rs.token, run); x != nil {
		t.Fatalf("run %s recorded while its record was refused: %+v", run, x)
	}
	admin(`DROP TRIGGER e2e_refuse_runs ON ` + runs)
	restored := time.Now()
	want := assistantLines(0, 10)
	if err := log.Write(want...); err != nil {
		t.Fatal(err)
	}
	waitStoredAtLeast(ctx, t, rs.relays[(owner+1)%3], rs.token, run, len(want), "after the store took writes again")
	t.Logf("run recorded and its lines stored %s after the store took writes again (the record is tried every 3 s)", time.Since(restored).Round(100*time.Millisecond))
	now, err := suite.cs.CoreV1().Pods(in.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.ResourceVersion != seen.ResourceVersion {
		t.Errorf("the pod changed meanwhile (resourceVersion %s, then %s): the record may have followed that change, not a retry", seen.ResourceVersion, now.ResourceVersion)
	}
	for i := range rs.relays {
		if c, err := rs.relays[i].Counter("clipjob_relay_replica_collecting "); err != nil || c != 1 {
			t.Errorf("replica %s stopped collecting meanwhile (%v, %v): a membership change hands runs over anew, not a retry", rs.ids[i], c, err)
		}
	}
	in.FinishRun(ctx, t, pod.Labels["batch.kubernetes.io/job-name"], "0")
	rs.relays[0].WaitRun(ctx, t, rs.token, run, func(r *store.Run) bool { return r.Done })
	harness.ExactlyOnce(t, rs.relays[2].Lines(t, rs.token, run), want)
}
