package collect

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/internal/testing/poll"
)

// TestATakeoverSeeingARetriedJobsFailedPodFirstDoesNotEndTheRun: a Job's
// first pod failed and its retry runs, the run's record following the
// retry. The replica taking the run over (or a relay restarted) is handed
// every pod of the run at once, in no particular order. Reconciling the
// failed first pod, whose log is stored already, must not finish the run
// while the retry runs: readers would be sent its end, and its result
// parsed before the retry's last lines, for good.
func TestATakeoverSeeingARetriedJobsFailedPodFirstDoesNotEndTheRun(t *testing.T) {
	first, logs, cache, s := newCollector(t)
	created := time.Now().Truncate(time.Second)
	p1 := agentPod("p1", "uid-p1", created)
	p1.Spec.InitContainers = nil
	p1.Status.Phase = corev1.PodFailed
	p1.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-p1")}
	p1.Status.ContainerStatuses[0].State.Terminated.ExitCode = 1
	cache.set(p1)
	logs.get("p1", "agent").write(at(0), "attempt 1")
	logs.end("p1", "agent")
	first.OnPod(p1)
	waitDone(t, s)

	p2 := runningAgentPod("p2", "uid-p2", created.Add(time.Minute), "c-p2")
	cache.set(p2)
	logs.get("p2", "agent").write(at(5), "attempt 2")
	first.OnPod(p2)
	poll.WaitFor(t, func() bool { return storedText(t, s) == "attempt 1,attempt 2" }, "the retry's line was not stored")
	if r, _ := s.Run("run-1"); r == nil || r.Done || r.PodUID != "uid-p2" {
		t.Fatalf("the run while its retry runs: %+v", r)
	}

	// Another collector takes the run over, and sees the failed pod first.
	taker := newCollectorOn(t, s, logs, cache)
	syncPod(t, taker, p1)
	// Its follower of the failed pod's stream reads nothing new and ends;
	// its end brings the pod back to the queue.
	poll.WaitFor(t, func() bool { return !taker.streaming(p1.UID) && taker.queue.Len() == 0 }, "the taker's follower of the failed pod did not end")
	syncPod(t, taker, p1)
	if r, _ := s.Run("run-1"); r == nil || r.Done {
		t.Fatalf("the failed first pod, reconciled by the replica taking the run over, ended the run while its retry runs: %+v", r)
	}
	syncPod(t, taker, p2)
	logs.get("p2", "agent").write(at(6), `{"type":"result","subtype":"success","result":"second","session_id":"s2"}`)
	final := p2.DeepCopy()
	final.Status.Phase = corev1.PodSucceeded
	final.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-p2")}
	cache.set(final)
	logs.end("p2", "agent")
	taker.OnPod(final)
	r := waitDone(t, s)
	if r.Result == nil || r.Result.Text != "second" || r.Phase != "Succeeded" {
		t.Errorf("the run finished with %+v, phase %s: want the retry's end", r.Result, r.Phase)
	}
}
