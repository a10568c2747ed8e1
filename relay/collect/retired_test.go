package collect

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
)

// finishedPod is a pod of runJob that wrote line and succeeded.
func finishedPod(logs *podLogs, cache *podCache, name string, created time.Time, line string) *corev1.Pod {
	p := agentPod(name, "uid-"+name, created)
	p.Spec.InitContainers = nil
	p.Status.Phase = corev1.PodSucceeded
	p.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-"+name)}
	cache.set(p)
	logs.get(name, "agent").write(at(int(created.Unix()%1000)), line)
	logs.end(name, "agent")
	return p
}

// waitIndexedDone waits until retention sees run done: it reads the run
// index, which a commit updates just after the record a reader of Run
// (waitDone) sees, so a Retain right after waitDone could find the run
// still going.
func waitIndexedDone(t *testing.T, s *bolt.Store, run string) {
	t.Helper()
	poll.WaitFor(t, func() bool {
		sums, _ := s.RunsWhere(store.Filter{})
		return slices.ContainsFunc(sums, func(r store.Summary) bool { return r.ID == run && r.Done })
	}, run+" was not collected")
}

// TestARunRetentionDeletedIsNotCollectedAgain: retention deletes a
// finished run whose pod remains (a Job kept without a TTL). A relay
// restarted, or the replica taking the run over, sees that pod again: it
// must not collect the run again from the start (bringing back the log
// and mirror retention removed). A later attempt of the Job is a run
// going on, and is collected; once no pod of the Job remains, what was
// kept of the retired run is forgotten.
func TestARunRetentionDeletedIsNotCollectedAgain(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	created := time.Now().Truncate(time.Second)
	first := finishedPod(logs, cache, "p1", created, "attempt 1")
	c.OnPod(first)
	waitIndexedDone(t, s, "run-1")
	if gone, err := s.Retain(0, 1, time.Now()); err != nil || len(gone) != 1 {
		t.Fatalf("retention deleted %v (%v), want run-1", gone, err)
	}

	// The relay that collected it sees the pod change (its streams all
	// drained, the pod remembered until it is gone): no run comes back.
	syncPod(t, c, first)
	if r, err := s.Run("run-1"); r != nil || err != nil {
		t.Fatalf("an update of the retired run's pod, to the relay that collected it, brought the run back: %+v (%v)", r, err)
	}

	restarted := newCollectorOn(t, s, logs, cache)
	ignored := testutil.ToFloat64(podsIgnored.WithLabelValues("retired"))
	syncPod(t, restarted, first)
	if r, err := s.Run("run-1"); r != nil || err != nil {
		t.Fatalf("the retired run's pod, seen again, brought the run back: %+v (%v)", r, err)
	}
	if got := testutil.ToFloat64(podsIgnored.WithLabelValues("retired")) - ignored; got != 1 {
		t.Errorf("pods ignored as retired: %v, want 1", got)
	}

	// The Job retries: its new pod is the run going on.
	second := finishedPod(logs, cache, "p2", created.Add(time.Minute), "attempt 2")
	restarted.OnPod(second)
	waitDone(t, s)
	if got := storedText(t, s); got != "attempt 2" {
		t.Errorf("a later attempt of the retired run's Job stored %q, want its own line", got)
	}
	syncPod(t, restarted, first) // the older pod still does not take the record back
	if r, _ := s.Run("run-1"); r == nil || r.PodUID != "uid-p2" || strings.Contains(storedText(t, s), "attempt 1") {
		t.Errorf("the retired attempt's pod changed the run: %+v, lines %q", r, storedText(t, s))
	}

	retired := func() bool {
		r, err := s.RetiredRun(runJob.Namespace, string(runJob.UID))
		return err == nil && r != nil
	}
	if n, err := restarted.ForgetRetired(nil); n != 0 || err != nil || !retired() {
		t.Errorf("forgot %d (%v) with a pod of the Job left", n, err)
	}
	cache.delete(first.Name)
	cache.delete(second.Name)
	if n, err := restarted.ForgetRetired([]string{"elsewhere"}); n != 0 || err != nil || !retired() {
		t.Errorf("forgot %d (%v) of a namespace not watched, whose pods it cannot see", n, err)
	}
	if n, err := restarted.ForgetRetired(nil); n != 1 || err != nil || retired() {
		t.Errorf("forgot %d (%v) with no pod of the Job left, want 1", n, err)
	}
}

// TestARunRetiredElsewhereDoesNotRetireAJobsRun: a pod names its
// controller itself, so a pod in a namespace the webhook does not cover
// may name another namespace's Job. Its run, retired, leaves the real
// Job's pods collected: a retirement counts in its own namespace only.
func TestARunRetiredElsewhereDoesNotRetireAJobsRun(t *testing.T) {
	c, logs, cache, s := newCollector(t)
	forged := finishedPod(logs, cache, "forged", time.Now().Add(time.Hour).Truncate(time.Second), "forged line")
	forged.Namespace, forged.Labels[contract.LabelRunID] = "elsewhere", "run-forged"
	cache.set(forged)
	c.OnPod(forged)
	waitIndexedDone(t, s, "run-forged")
	if gone, err := s.Retain(0, 1, time.Now()); err != nil || len(gone) != 1 {
		t.Fatalf("retention deleted %v (%v), want the forged run", gone, err)
	}
	if r, _ := s.RetiredRun("elsewhere", string(runJob.UID)); r == nil {
		t.Fatal("no retirement kept for the forged run")
	}

	victim := finishedPod(logs, cache, "victim", time.Now().Truncate(time.Second), "the victim's line")
	newCollectorOn(t, s, logs, cache).OnPod(victim)
	waitDone(t, s)
	if got := storedText(t, s); got != "the victim's line" {
		t.Errorf("the Job's own run, after a pod elsewhere claiming its UID was retired: %q", got)
	}
}
