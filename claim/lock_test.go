package claim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
)

var leaseGR = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// fakeLeases is an in-memory Lease store with the API server's optimistic
// concurrency: create fails on an existing name, update and delete fail on
// a stale resourceVersion. beforeWrite, when set, runs before every write
// so a test can hold claimants at the point where they race.
type fakeLeases struct {
	mu          sync.Mutex
	rv          int
	items       map[string]coordinationv1.Lease
	writes      int
	beforeWrite func(op string)
	listed      []string // the namespaces List was asked for
}

func newFakeLeases() *fakeLeases { return &fakeLeases{items: map[string]coordinationv1.Lease{}} }

func (f *fakeLeases) Get(_ context.Context, ns, name string) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.items[ns+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(leaseGR, name)
	}
	return l.DeepCopy(), nil
}

func (f *fakeLeases) Create(_ context.Context, l *coordinationv1.Lease, dryRun bool) (*coordinationv1.Lease, error) {
	if f.beforeWrite != nil {
		f.beforeWrite("create")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k := l.Namespace + "/" + l.Name
	if _, ok := f.items[k]; ok {
		return nil, apierrors.NewAlreadyExists(leaseGR, l.Name)
	}
	if dryRun {
		return l, nil
	}
	f.rv++
	c := *l.DeepCopy()
	c.ResourceVersion = strconv.Itoa(f.rv)
	f.items[k] = c
	f.writes++
	return &c, nil
}

func (f *fakeLeases) Update(_ context.Context, l *coordinationv1.Lease, dryRun bool) (*coordinationv1.Lease, error) {
	if f.beforeWrite != nil {
		f.beforeWrite("update")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k := l.Namespace + "/" + l.Name
	cur, ok := f.items[k]
	if !ok {
		return nil, apierrors.NewNotFound(leaseGR, l.Name)
	}
	if cur.ResourceVersion != l.ResourceVersion {
		return nil, apierrors.NewConflict(leaseGR, l.Name, fmt.Errorf("stale resourceVersion"))
	}
	if dryRun {
		return l, nil
	}
	f.rv++
	c := *l.DeepCopy()
	c.ResourceVersion = strconv.Itoa(f.rv)
	f.items[k] = c
	f.writes++
	return &c, nil
}

func (f *fakeLeases) Delete(_ context.Context, ns, name, rv string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := ns + "/" + name
	cur, ok := f.items[k]
	if !ok {
		return apierrors.NewNotFound(leaseGR, name)
	}
	if rv != "" && cur.ResourceVersion != rv {
		return apierrors.NewConflict(leaseGR, name, fmt.Errorf("stale resourceVersion"))
	}
	delete(f.items, k)
	return nil
}

func (f *fakeLeases) List(_ context.Context, namespace string) ([]coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listed = append(f.listed, namespace)
	var out []coordinationv1.Lease
	for _, l := range f.items {
		if namespace == "" || l.Namespace == namespace {
			out = append(out, *l.DeepCopy())
		}
	}
	return out, nil
}

type fakeJobs struct {
	mu   sync.Mutex
	jobs map[string]*batchv1.Job
}

func (f *fakeJobs) Get(_ context.Context, ns, name string) (*batchv1.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j, ok := f.jobs[ns+"/"+name]; ok {
		return j.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "batch", Resource: "jobs"}, name)
}

func (f *fakeJobs) put(j *batchv1.Job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jobs[j.Namespace+"/"+j.Name] = j
}

func agentJob(name, agent string) *batchv1.Job {
	return jobs.MakeJob(name, "paperclip").Agent(agent).Run("run-" + name).Obj()
}

func finish(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.Job {
	j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue})
	return j
}

var nsScope = config.Concurrency{Mode: config.ModeReject, Scope: config.ScopeNamespace, PendingGraceSeconds: 15}

func newLock() (*Lock, *fakeLeases, *fakeJobs, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	leases, jobs := newFakeLeases(), &fakeJobs{jobs: map[string]*batchv1.Job{}}
	return &Lock{Leases: leases, Jobs: jobs, Clock: clk}, leases, jobs, clk
}

// barrier returns a beforeWrite hook that holds the first n writes of
// kind op until all n have arrived, so they all decided on the same state.
func barrier(n int, op string) func(string) {
	var wg sync.WaitGroup
	wg.Add(n)
	var arrived atomic.Int32
	return func(got string) {
		if got == op && arrived.Add(1) <= int32(n) {
			wg.Done()
			wg.Wait()
		}
	}
}

// TestTwoClaimantsInterleaved holds two admissions at the point where both
// create the claim at once: exactly one is admitted, the other gets a
// BusyError naming the winner.
func TestTwoClaimantsInterleaved(t *testing.T) {
	c, leases, _, _ := newLock()
	leases.beforeWrite = barrier(2, "create")
	a, b := agentJob("run-a", "agent-1"), agentJob("run-b", "agent-1")
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, j := range []*batchv1.Job{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.Acquire(context.Background(), j, nsScope, false) }()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("want exactly one admitted, got %v and %v", errs[0], errs[1])
	}
	loser := errs[0]
	winner := "run-b"
	if loser == nil {
		loser, winner = errs[1], "run-a"
	}
	var busy *BusyError
	if !IsBusy(loser) || !asBusy(loser, &busy) || busy.Holder.Name != winner || !busy.Holder.Pending {
		t.Errorf("loser's error %v does not name the pending winner %s", loser, winner)
	}
}

func asBusy(err error, b **BusyError) bool {
	be, ok := err.(*BusyError)
	*b = be
	return ok
}

// TestTakeOverRaceAfterFinish: the holder has finished; two new runs both
// see it finished and race to take the claim over. One update wins, the
// other conflicts, re-reads and finds the winner active.
func TestTakeOverRaceAfterFinish(t *testing.T) {
	c, leases, jobs, _ := newLock()
	var retries atomic.Int32
	c.OnRetry = func() { retries.Add(1) }
	old := agentJob("run-old", "agent-1")
	if err := c.Acquire(context.Background(), old, nsScope, false); err != nil {
		t.Fatal(err)
	}
	jobs.put(finish(old, batchv1.JobComplete))
	leases.beforeWrite = barrier(2, "update")
	errs := make(chan error, 2)
	for _, name := range []string{"run-x", "run-y"} {
		go func() { errs <- c.Acquire(context.Background(), agentJob(name, "agent-1"), nsScope, false) }()
	}
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("want exactly one take-over, got %v and %v", e1, e2)
	}
	if retries.Load() == 0 {
		t.Error("the losing update did not retry")
	}
}

// TestManyConcurrentClaimants: whatever the interleaving, one of many.
func TestManyConcurrentClaimants(t *testing.T) {
	for round := 0; round < 20; round++ {
		c, _, _, _ := newLock()
		const n = 50
		var admitted atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := c.Acquire(context.Background(), agentJob(fmt.Sprintf("run-%d", i), "agent-1"), nsScope, false)
				switch {
				case err == nil:
					admitted.Add(1)
				case !IsBusy(err):
					t.Errorf("unexpected error: %v", err)
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 1 {
			t.Fatalf("round %d: %d of %d admitted", round, admitted.Load(), n)
		}
	}
}

func TestHolderStates(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		holder   func(j *batchv1.Job) *batchv1.Job // nil: never stored
		age      time.Duration
		wantFree bool
	}{
		{"running", func(j *batchv1.Job) *batchv1.Job { return j }, 0, false},
		{"completed", func(j *batchv1.Job) *batchv1.Job { return finish(j, batchv1.JobComplete) }, 0, true},
		{"failed", func(j *batchv1.Job) *batchv1.Job { return finish(j, batchv1.JobFailed) }, 0, true},
		{"being deleted", func(j *batchv1.Job) *batchv1.Job { j.DeletionTimestamp = &metav1.Time{Time: time.Now()}; return j }, 0, true},
		{"being deleted, pod still active", func(j *batchv1.Job) *batchv1.Job {
			j.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			j.Status.Active = 1
			return j
		}, 0, false},
		{"replaced by a Job of the same name", func(j *batchv1.Job) *batchv1.Job { j.UID = "another"; return j }, 0, true},
		{"claimed but still suspended, within grace", func(j *batchv1.Job) *batchv1.Job { j.Spec.Suspend = ptr.To(true); return j }, 5 * time.Second, false},
		{"claimed but never started", func(j *batchv1.Job) *batchv1.Job { j.Spec.Suspend = ptr.To(true); return j }, 16 * time.Second, true},
		{"a Job of another agent (a squatted claim)", func(j *batchv1.Job) *batchv1.Job { j.Labels[contract.LabelAgentID] = "agent-2"; return j }, 0, true},
		{"a Job that is no agent's (a squatted claim)", func(j *batchv1.Job) *batchv1.Job { delete(j.Labels, contract.LabelAgentID); return j }, 0, true},
		{"not stored yet, within grace", nil, 5 * time.Second, false},
		{"never stored, grace over", nil, 16 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, leases, jobs, clk := newLock()
			holder := agentJob("run-1", "agent-1")
			if err := c.Acquire(ctx, holder, nsScope, false); err != nil {
				t.Fatal(err)
			}
			if tt.holder != nil {
				jobs.put(tt.holder(holder.DeepCopy()))
			}
			clk.Step(tt.age)
			before := leases.writes
			err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false)
			if tt.wantFree && err != nil {
				t.Fatalf("want the claim taken over, got %v", err)
			}
			if !tt.wantFree {
				if !IsBusy(err) {
					t.Fatalf("want busy, got %v", err)
				}
				if leases.writes != before {
					t.Error("a refused claimant wrote")
				}
			}
		})
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	c, leases, jobs, _ := newLock()
	ctx := context.Background()
	if err := c.Acquire(ctx, agentJob("run-1", "agent-1"), nsScope, true); err != nil {
		t.Fatal(err)
	}
	if leases.writes != 0 || len(leases.items) != 0 {
		t.Fatal("dry run wrote a claim")
	}
	held := agentJob("run-1", "agent-1")
	if err := c.Acquire(ctx, held, nsScope, false); err != nil {
		t.Fatal(err)
	}
	jobs.put(held)
	if err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, true); !IsBusy(err) {
		t.Errorf("dry run of a second run: want busy, got %v", err)
	}
	jobs.put(finish(held, batchv1.JobComplete))
	before := leases.items[KeyFor(held, nsScope).Namespace+"/"+KeyFor(held, nsScope).Name]
	if err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, true); err != nil {
		t.Errorf("dry run after finish: %v", err)
	}
	after := leases.items[KeyFor(held, nsScope).Namespace+"/"+KeyFor(held, nsScope).Name]
	if before.ResourceVersion != after.ResourceVersion {
		t.Error("dry-run take-over wrote")
	}
}

func TestSameJobAgainIsAdmitted(t *testing.T) {
	c, _, _, _ := newLock()
	j := agentJob("run-1", "agent-1")
	for i := 0; i < 2; i++ {
		if err := c.Acquire(context.Background(), j, nsScope, false); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
}

func TestAgentsAndScopesAreIndependent(t *testing.T) {
	c, _, _, _ := newLock()
	ctx := context.Background()
	if err := c.Acquire(ctx, agentJob("a", "agent-1"), nsScope, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Acquire(ctx, agentJob("b", "agent-2"), nsScope, false); err != nil {
		t.Errorf("another agent was blocked: %v", err)
	}
	other := agentJob("c", "agent-1")
	other.Namespace = "team-b"
	if err := c.Acquire(ctx, other, nsScope, false); err != nil {
		t.Errorf("same agent in another namespace was blocked under Namespace scope: %v", err)
	}
	cluster := config.Concurrency{Scope: config.ScopeCluster, ClaimNamespace: "paperclip", PendingGraceSeconds: 15}
	if err := c.Acquire(ctx, agentJob("d", "agent-9"), cluster, false); err != nil {
		t.Fatal(err)
	}
	elsewhere := agentJob("e", "agent-9")
	elsewhere.Namespace = "team-b"
	if err := c.Acquire(ctx, elsewhere, cluster, false); !IsBusy(err) {
		t.Errorf("Cluster scope: same agent in another namespace admitted (%v)", err)
	}
}

func TestKeyFor(t *testing.T) {
	seen := map[string]string{}
	for _, agent := range []string{"Agent_1", "agent-1", "agent.1", "AGENT_1", "a", "x" + string(make([]byte, 0)) + "0123456789012345678901234567890123456789012345678901234567890"} {
		k := KeyFor(agentJob("j", agent), nsScope)
		if len(k.Name) > 63 || nonDNS.MatchString(k.Name) {
			t.Errorf("%q: claim name %q is not a DNS label", agent, k.Name)
		}
		if prev, dup := seen[k.Name]; dup {
			t.Errorf("agents %q and %q share claim %s", prev, agent, k.Name)
		}
		seen[k.Name] = agent
	}
}

type fakePods map[string]int // job UID -> pods not finished

func (f fakePods) Running(_ context.Context, _, uid string) (int, error) { return f[uid], nil }

// TestClaimHeldWhilePodsTerminate: a Job that failed, or was deleted in
// the background, can leave pods still running; its agent stays busy until
// they are gone, and the releaser does not free the claim early.
func TestClaimHeldWhilePodsTerminate(t *testing.T) {
	ctx := context.Background()
	c, _, jobs, _ := newLock()
	pods := fakePods{}
	c.Pods = pods
	holder := agentJob("run-1", "agent-1")
	if err := c.Acquire(ctx, holder, nsScope, false); err != nil {
		t.Fatal(err)
	}
	jobs.put(finish(holder.DeepCopy(), batchv1.JobFailed))
	pods[string(holder.UID)] = 1
	err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false)
	if !IsBusy(err) || !strings.Contains(err.Error(), "ended but 1 pod(s) still terminating") {
		t.Fatalf("want busy while the pod terminates, got %v", err)
	}
	if ok, _ := c.Release(ctx, holder, nsScope); ok {
		t.Fatal("released while a pod still runs")
	}
	pods[string(holder.UID)] = 0
	if err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false); err != nil {
		t.Fatalf("agent not free once the pods are gone: %v", err)
	}
}

// TestSquattedClaimWithoutUID: a Lease at an agent's claim name that
// Acquire did not write (no Job UID) never blocks the agent.
func TestSquattedClaimWithoutUID(t *testing.T) {
	ctx := context.Background()
	c, leases, jobs, _ := newLock()
	squatter := agentJob("some-running-job", "agent-1")
	jobs.put(squatter)
	key := KeyFor(squatter, nsScope)
	lease := c.newLease(key, squatter)
	delete(lease.Annotations, AnnotationJobUID)
	if _, err := leases.Create(ctx, lease, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false); err != nil {
		t.Fatalf("a Lease without a Job UID blocked the agent: %v", err)
	}
}

// TestRunWithoutItsClaimKeepsTheAgentBusy: deleting an agent's claim, or
// changing the claim's scope, while its run goes on must not let a second
// run in: the lock also looks at the agent's running Jobs.
func TestRunWithoutItsClaimKeepsTheAgentBusy(t *testing.T) {
	ctx := context.Background()
	running := agentJob("run-1", "agent-1")
	running.Status.StartTime = &metav1.Time{Time: time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)}
	queued := jobs.MakeJob("queued", "paperclip").Agent("agent-1").Queued().Obj()
	done := finish(agentJob("done", "agent-1"), batchv1.JobComplete)
	for _, tc := range []struct {
		name   string
		active []batchv1.Job
		busy   bool
	}{
		{name: "a running Job without a claim", active: []batchv1.Job{*running}, busy: true},
		{name: "only queued and finished runs", active: []batchv1.Job{*queued, *done}},
		{name: "the claimant itself", active: []batchv1.Job{*agentJob("run-2", "agent-1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, leases, _, _ := newLock()
			var asked Key
			c.Active = func(_ context.Context, key Key, _ config.Concurrency) ([]batchv1.Job, error) {
				asked = key
				return tc.active, nil
			}
			err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false)
			if asked.Agent != "agent-1" || asked.Namespace != "paperclip" {
				t.Errorf("asked for %+v", asked)
			}
			if !tc.busy {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var b *BusyError
			if !errors.As(err, &b) || b.Holder.Name != "run-1" || !strings.Contains(err.Error(), "already has an active run") {
				t.Fatalf("want busy naming run-1, got %v", err)
			}
			if leases.writes != 0 {
				t.Error("a refused claimant wrote a claim")
			}
		})
	}
}

// TestClaimAgeByTheAPIServersClock: a claim written by a replica whose
// clock runs ahead does not look fresh to the others: its age is read from
// the API server's write time.
func TestClaimAgeByTheAPIServersClock(t *testing.T) {
	ctx := context.Background()
	c, leases, _, clk := newLock()
	holder := agentJob("run-1", "agent-1") // admitted, never stored
	key := KeyFor(holder, nsScope)
	lease := c.newLease(key, holder)
	ahead := metav1.NewMicroTime(clk.Now().Add(time.Hour)) // the writer's clock
	lease.Spec.AcquireTime = &ahead
	written := metav1.NewTime(clk.Now().Add(-16 * time.Second)) // the API server's
	lease.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "clipjob-webhook", Operation: metav1.ManagedFieldsOperationUpdate, Time: &written}}
	if _, err := leases.Create(ctx, lease, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Acquire(ctx, agentJob("run-2", "agent-1"), nsScope, false); err != nil {
		t.Fatalf("a claim never stored past the grace window (by the API server's clock) still blocks: %v", err)
	}
}
