package collect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	batchv1 "k8s.io/api/batch/v1"

	"golang.org/x/sys/unix"

	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// TestATimedOutRunIsMarkedOnceItsJobSaysSo: the Job controller deletes a
// timed-out Job's pods before it records why the Job failed, so the run
// ends as failed and its Job is read again, through the work queue on
// the collector's clock, until it says DeadlineExceeded.
func TestATimedOutRunIsMarkedOnceItsJobSaysSo(t *testing.T) {
	s, _ := storetest.Open(t)
	logs, cache := &podLogs{logs: map[string]*fakeLog{}}, &podCache{pods: map[string]*corev1.Pod{}}
	clk := clocktesting.NewFakeClock(time.Now())
	var reads atomic.Int32
	c := newCollectorOn(t, s, logs, cache, func(c *Collector) {
		c.Clock = clk
		c.JobFailure = func(context.Context, string, string) (string, error) {
			if reads.Add(1) < 3 {
				return "", nil // not recorded yet
			}
			return string(batchv1.JobReasonDeadlineExceeded), nil
		}
	})
	pod := agentPod("p1", "uid-1", time.Now())
	pod.Spec.InitContainers = nil
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", ContainerID: "c1",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 143, Reason: "Error"}}}}
	cache.set(pod)
	logs.get("p1", "agent").write(at(0), `{"type":"system","subtype":"init","session_id":"s1"}`)
	logs.end("p1", "agent")
	c.OnPod(pod)
	job := item{kind: jobItem, run: "run-1"}
	poll.WaitFor(t, func() bool { return c.queue.NumRequeues(job) == 1 }, "the Job was not read again")
	if r, _ := s.Run("run-1"); r.Result == nil || r.Result.Outcome == result.OutcomeTimedOut || reads.Load() != 1 {
		t.Fatalf("before the clock moved: outcome %+v after %d reads of the Job, want one read and not timed out", r.Result, reads.Load())
	}
	poll.WaitFor(t, func() bool {
		clk.Step(c.Retry.Max)
		r, _ := s.Run("run-1")
		return r.Result.Outcome == result.OutcomeTimedOut
	}, "the run was never marked timed out")
	if n := reads.Load(); n != 3 {
		t.Errorf("the Job was read %d times, want until it said why it failed (3)", n)
	}
}

// TestALockedMirrorIsSyncedAgainByTheQueue: a run's mirror file another
// process holds locked is not synced at that commit; the mirrors' queue
// syncs it again once its delay passed on the collector's clock, and the
// file then holds every line once.
func TestALockedMirrorIsSyncedAgainByTheQueue(t *testing.T) {
	s, _ := storetest.Open(t)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) {
		r.Namespace, r.Agent, r.Company, r.MainContainer = "ns", "agent-a", "acme", "agent"
	})
	m := &mirror.Mirror{Dir: filepath.Join(t.TempDir(), "shared"), Store: s}
	logs, cache := &podLogs{logs: map[string]*fakeLog{}}, &podCache{pods: map[string]*corev1.Pod{}}
	clk := clocktesting.NewFakeClock(time.Now())
	c := newCollectorOn(t, s, logs, cache, func(c *Collector) { c.Clock, c.Mirror = clk, m })
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", `{"n":1}`), time.Now())
	c.syncMirror("run-1")
	r, _ := s.Run("run-1")
	held, err := os.Open(m.Path(r))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, _ = storetest.Append(s, "run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"n":2}`), time.Now())
	c.syncMirror("run-1")
	if n := c.mirrors.NumRequeues(item{kind: mirrorItem, run: "run-1"}); n != 1 {
		t.Fatalf("a locked mirror queued %d times, want once", n)
	}
	_ = unix.Flock(int(held.Fd()), unix.LOCK_UN)
	file := func() string { b, _ := os.ReadFile(m.Path(r)); return string(b) }
	if got := file(); got != "{\"n\":1}\n" {
		t.Fatalf("the mirror was synced before the clock moved: %q", got)
	}
	poll.WaitFor(t, func() bool { clk.Step(c.Retry.Min); return strings.Count(file(), "\n") == 2 }, "the mirror was never synced again")
	if got := file(); got != "{\"n\":1}\n{\"n\":2}\n" {
		t.Errorf("mirror after the retry: %q", got)
	}
}
