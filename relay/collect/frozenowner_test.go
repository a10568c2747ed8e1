package collect

import (
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/internal/testing/poll"
	"github.com/paperclipai/clipjob/relay/store"
)

// frozenCommits is a replica's view of the shared store whose commits can
// be frozen: an AppendAfter made while frozen waits, as the commit of a
// replica stopped (SIGSTOP, a paused VM, a long GC pause) with lines read
// and not yet committed, until thawed.
type frozenCommits struct {
	store.Backend
	mu      sync.Mutex
	gate    chan struct{} // non-nil while frozen
	waiting chan struct{} // one token per commit that met the freeze
}

func (f *frozenCommits) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
}

func (f *frozenCommits) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.gate)
	f.gate = nil
}

func (f *frozenCommits) AppendAfter(run, stream string, prev, cur store.Cursor, lines []store.Line, now time.Time) (uint64, error) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		f.waiting <- struct{}{}
		<-gate
	}
	return f.Backend.AppendAfter(run, stream, prev, cur, lines, now)
}

// TestARunRetiredWhileItsOldOwnerWasFrozenStaysRetired: replica A
// collects a run and is frozen with a line read and not committed. The
// others take the run over (B here), store its last lines and finish it,
// and retention deletes it, its pod remaining (a Job kept without a TTL).
// A thaws believing the run its own (a thawed replica renews the row of
// the id it had, and the hash gives it the same runs): its commit is
// refused, the stream's cursor being gone with the run. It must not read
// the log again from the start and bring the whole run back.
func TestARunRetiredWhileItsOldOwnerWasFrozenStaysRetired(t *testing.T) {
	_, logs, cache, s := newCollector(t)
	created := time.Now().Truncate(time.Second)
	pod := runningAgentPod("p1", "uid-p1", created, "c-p1")
	cache.set(pod)
	log := logs.get("p1", "agent")
	for i := range 3 {
		log.write(at(i), "before the freeze")
	}
	frozen := &frozenCommits{Backend: s, waiting: make(chan struct{}, 16)}
	a := newCollectorOn(t, frozen, logs, cache)
	a.OnPod(pod)
	poll.WaitFor(t, func() bool { r, _ := s.Run("run-1"); return r != nil && r.LastSeq == 3 }, "replica A did not store the first lines")

	frozen.freeze()
	log.write(at(3), "read by A, committed by B")
	select {
	case <-frozen.waiting:
	case <-time.After(time.Minute):
		t.Fatal("replica A did not read the line it was to be frozen with")
	}

	// B takes the run over, stores the rest and finishes it.
	b := newCollectorOn(t, s, logs, cache)
	log.write(at(4), "the last line")
	final := pod.DeepCopy()
	final.Status.Phase = corev1.PodSucceeded
	final.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("agent", "c-p1")}
	cache.set(final)
	logs.end("p1", "agent")
	b.OnPod(final)
	waitDone(t, s)
	waitIndexedDone(t, s, "run-1")
	if got := storedText(t, s); got != "before the freeze,before the freeze,before the freeze,read by A, committed by B,the last line" {
		t.Fatalf("B stored %q", got)
	}
	if gone, err := s.Retain(0, 1, time.Now()); err != nil || len(gone) != 1 {
		t.Fatalf("retention deleted %v (%v), want run-1", gone, err)
	}

	frozen.thaw()
	poll.WaitFor(t, func() bool { return !a.streaming(pod.UID) }, "replica A still follows the stream after the thaw")
	if r, err := s.Run("run-1"); r != nil || err != nil {
		t.Fatalf("the retired run came back after its old owner thawed: %+v (%v), lines %q", r, err, storedText(t, s))
	}
}
