package collect

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/paperclipai/clipjob/internal/testing/poll"
)

// TestARunTakenOverBeforeTheNewOwnerSawItsPodIsCollected: replica B
// collects a run whose pod was created a moment ago. The run passes to
// replica A (B died, A joined, or A thawed after a freeze) before A's pod
// cache has the pod: each replica's informer has a watch of its own, and
// one late by a moment (a relist after a freeze, a loaded machine) is
// behind the store, where B recorded the pod. A's sweep of the runs it now
// owns must not take the pod for one deleted and finish the run; when
// A's cache shows the pod, A collects it: every line is stored. (The
// sweep asks the API server, here B's cache, before finishing a run
// whose pod its cache does not hold.)
func TestARunTakenOverBeforeTheNewOwnerSawItsPodIsCollected(t *testing.T) {
	_, logs, cacheB, s := newCollector(t)
	cacheA := &podCache{pods: map[string]*corev1.Pod{}}
	pod := runningAgentPod("p1", "uid-p1", time.Now().Truncate(time.Second), "c-p1")
	cacheB.set(pod)
	log := logs.get("p1", "agent")
	log.write(at(0), "collected by B")

	var ownerA atomic.Bool
	b := newCollectorOn(t, s, logs, cacheB, func(c *Collector) { c.Owns = func(string) bool { return !ownerA.Load() } })
	b.OnPod(pod)
	poll.WaitFor(t, func() bool { return storedText(t, s) == "collected by B" }, "B did not store the first line")

	// The run passes to A, whose cache has not seen the pod yet.
	ownerA.Store(true)
	a := newCollectorOn(t, s, logs, cacheA, func(c *Collector) {
		c.Owns = func(string) bool { return ownerA.Load() }
		// The API server, which has the pod: B's cache is up to date.
		c.PodGone = func(_ context.Context, _, name string, uid types.UID) (bool, error) {
			p := cacheB.Pod("", name)
			return p == nil || p.UID != uid, nil
		}
	})
	b.Rebalance()
	if err := a.reconcile(item{kind: rebalanceItem}); err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, func() bool { return a.queue.Len() == 0 }, "A's queue did not empty")
	if err := a.reconcile(item{kind: sweepItem}); err != nil {
		t.Fatal(err)
	}

	// A's cache catches up; the run goes on and ends.
	cacheA.set(pod)
	a.OnPod(pod)
	log.write(at(1), "collected by A")
	final := pod.DeepCopy()
	final.Status.Phase = corev1.PodSucceeded
	final.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-p1")}
	cacheA.set(final)
	cacheB.set(final)
	logs.end("p1", "agent")
	a.OnPod(final)
	poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.Done && r.Phase == "Succeeded" }, "the run did not finish as its pod did")
	if got := storedText(t, s); got != "collected by B,collected by A" {
		t.Errorf("stored %q: the lines written after the run passed to a replica whose cache was late were lost", got)
	}
}
