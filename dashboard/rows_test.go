package dashboard

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

var t0 = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)

// agentJob is an agent Job of agent in namespace ns, created minute
// minutes after t0, changed by each of with.
func agentJob(ns, name, agent string, minute int, with ...func(*batchv1.Job)) batchv1.Job {
	j := batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(minute) * time.Minute)),
		Labels: map[string]string{contract.LabelAgentID: agent, contract.LabelRunID: "run-" + name,
			contract.LabelCompanyID: "acme", contract.LabelAdapterType: "claude_local"},
		Annotations: map[string]string{},
	}}
	for _, w := range with {
		w(&j)
	}
	return j
}

func started(minute int) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Status.StartTime = ptr.To(metav1.NewTime(t0.Add(time.Duration(minute) * time.Minute)))
		j.Status.Active = 1
	}
}

func queued(position, holder string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Spec.Suspend = ptr.To(true)
		j.Annotations[contract.AnnotationQueued] = "true"
		if position != "" {
			j.Annotations[contract.AnnotationQueuePosition] = position
			j.Annotations[contract.AnnotationQueueHolder] = holder
		}
	}
}

func condition(typ batchv1.JobConditionType, reason, message string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Status.Active = 0
		j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: typ, Status: corev1.ConditionTrue,
			Reason: reason, Message: message, LastTransitionTime: metav1.NewTime(t0.Add(time.Hour))})
	}
}

func byKey(rows []Run) map[string]Run {
	m := map[string]Run{}
	for _, r := range rows {
		m[r.Key] = r
	}
	return m
}

// TestRowsShowEachState: a Job's state, and why, as the page shows it.
func TestRowsShowEachState(t *testing.T) {
	refusal := "cannot start: the image evil.example.com/miner:1 is not allowed"
	rows := Rows(Sources{Jobs: []batchv1.Job{
		agentJob("ns", "holder", "a1", 0, started(1)),
		agentJob("ns", "next", "a1", 1, queued("1", "ns/holder")),
		agentJob("ns", "later", "a1", 2, queued("2", "ns/holder")),
		agentJob("ns", "unmarked", "a1", 3, queued("", "")),
		agentJob("ns", "refused", "a1", 4, queued("", ""), func(j *batchv1.Job) { j.Annotations[contract.AnnotationQueueError] = refusal }),
		agentJob("ns", "done", "a2", 5, started(5), condition(batchv1.JobComplete, "", "")),
		agentJob("ns", "broke", "a2", 6, started(6), condition(batchv1.JobFailed, batchv1.JobReasonBackoffLimitExceeded, "Job has reached the specified backoff limit")),
		agentJob("ns", "slow", "a2", 7, started(7), condition(batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline")),
		agentJob("ns", "stuck", "a2", 8, started(8), condition(batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline"),
			func(j *batchv1.Job) { j.Annotations[contract.AnnotationStartTimeout] = "ImagePullBackOff" }),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "not-an-agent-run"}},
	}})
	type shown struct {
		State, Reason string
		Position      int
		WaitsFor      *RunRef
	}
	got := map[string]shown{}
	for _, r := range rows {
		got[r.Key] = shown{r.State, r.Reason, r.Position, r.WaitsFor}
	}
	holder := &RunRef{Job: "ns/holder", Run: "run-holder", Key: "ns/run-holder"}
	want := map[string]shown{
		"ns/run-holder":   {State: StateRunning},
		"ns/run-next":     {State: StateQueued, Position: 1, WaitsFor: holder},
		"ns/run-later":    {State: StateQueued, Position: 2, WaitsFor: holder},
		"ns/run-unmarked": {State: StateQueued},
		"ns/run-refused":  {State: StateRefused, Reason: refusal},
		"ns/run-done":     {State: StateSucceeded},
		"ns/run-broke":    {State: StateFailed, Reason: "BackoffLimitExceeded: Job has reached the specified backoff limit"},
		"ns/run-slow":     {State: StateTimedOut, Reason: "DeadlineExceeded: Job was active longer than specified deadline"},
		"ns/run-stuck":    {State: StateTimedOut, Reason: "never started: ImagePullBackOff"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
	// Newest first.
	if rows[0].Key != "ns/run-stuck" || rows[len(rows)-1].Key != "ns/run-holder" {
		t.Errorf("rows not newest first: first %s, last %s", rows[0].Key, rows[len(rows)-1].Key)
	}
}

// TestRowsMergeTheRelaysRecord: a Job's row carries its run's log, result
// and cost from the relay's record of that Job (matched by UID, not by run
// id, which another Job may copy); a record whose Job is gone is a row of
// its own; claim Leases mark the run holding its agent.
func TestRowsMergeTheRelaysRecord(t *testing.T) {
	cost := 0.42
	finished := t0.Add(2 * time.Hour)
	rows := Rows(Sources{
		Jobs: []batchv1.Job{
			agentJob("ns", "live", "a1", 0, started(1)),
			agentJob("ns", "copycat", "a2", 1, started(2), func(j *batchv1.Job) { j.Labels[contract.LabelRunID] = "run-live" }),
		},
		Leases: []coordinationv1.Lease{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-a1", Labels: map[string]string{claim.Label: claim.KindAgentRun},
				Annotations: map[string]string{claim.AnnotationJobUID: "uid-live"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("uid-live")},
		}},
		Logged: []store.Run{
			{ID: "run-live", Namespace: "ns", Job: "live", JobUID: "uid-live", Agent: "a1", Phase: "Running", LastSeq: 7,
				Result: &result.Result{SessionID: "sess-1", Model: "claude"}},
			{ID: "run-old", Namespace: "ns", Job: "old", JobUID: "uid-old", Agent: "a1", Company: "acme", Phase: "Succeeded",
				StartedAt: ptr.To(t0.Add(-time.Hour)), FinishedAt: &finished, LastSeq: 3,
				Result: &result.Result{Outcome: "succeeded", CostUSD: &cost, Text: "all done\nmore", Usage: &result.Usage{InputTokens: 10, OutputTokens: 5}}},
			{ID: "run-late", Namespace: "ns", Job: "late", JobUID: "uid-late", Agent: "a3", Phase: "Failed",
				Result: &result.Result{Outcome: "timed_out"}},
			// Another namespace's record naming the live Job's UID: its
			// own run, never the live Job's cost or result.
			{ID: "run-live", Namespace: "other", Job: "live", JobUID: "uid-live", Agent: "a1", Phase: "Succeeded",
				Result: &result.Result{SessionID: "sess-forged", CostUSD: &cost}},
		},
	})
	got := byKey(rows)
	if len(rows) != 5 {
		t.Fatalf("want 5 rows (two Jobs, three runs whose Job is gone), got %d: %v", len(rows), got)
	}
	live := got["ns/run-live@uid-live"]
	if !live.Logged || live.Lines != 7 || live.Session != "sess-1" || !live.HoldsClaim || live.JobGone {
		t.Errorf("the live run's row: %+v", live)
	}
	copycat := got["ns/run-live@uid-copycat"]
	if copycat.Logged || copycat.HoldsClaim || copycat.Agent != "a2" {
		t.Errorf("a Job that copied the run id got the other Job's record or claim: %+v", copycat)
	}
	old := got["ns/run-old"]
	if !old.JobGone || old.State != StateSucceeded || old.CostUSD == nil || *old.CostUSD != cost || old.Summary != "all done" || old.Finished == nil || !old.Finished.Equal(finished) {
		t.Errorf("the run whose Job is gone: %+v", old)
	}
	if late := got["ns/run-late"]; late.State != StateTimedOut {
		t.Errorf("a run the relay says timed out: state %q", late.State)
	}
}

// TestTotalsSumAPeriod: cost and tokens per company and per agent, of the
// runs started in the period only.
func TestTotalsSumAPeriod(t *testing.T) {
	run := func(company, agent string, hour int, cost float64, in, out int64) Run {
		s := t0.Add(time.Duration(hour) * time.Hour)
		return Run{Company: company, Agent: agent, Started: &s, CostUSD: &cost, Usage: &result.Usage{InputTokens: in, CacheReadInputTokens: 1, OutputTokens: out}}
	}
	rows := []Run{
		run("acme", "a1", 0, 1.5, 100, 10),
		run("acme", "a1", 1, 0.5, 100, 10),
		run("acme", "a2", 2, 2, 50, 5),
		run("beta", "b1", 3, 4, 1, 1),
		run("acme", "a1", 30, 100, 1, 1),             // after the period
		{Company: "acme", Agent: "a3", Started: &t0}, // started, no result (yet)
		{Company: "acme", Agent: "a1"},               // never started
	}
	got := Totals(rows, t0, t0.Add(24*time.Hour))
	want := []Total{
		{Company: "acme", Runs: 4, Priced: 3, CostUSD: 4, InputTokens: 253, OutputTokens: 25},
		{Company: "acme", Agent: "a1", Runs: 2, Priced: 2, CostUSD: 2, InputTokens: 202, OutputTokens: 20},
		{Company: "acme", Agent: "a2", Runs: 1, Priced: 1, CostUSD: 2, InputTokens: 51, OutputTokens: 5},
		{Company: "acme", Agent: "a3", Runs: 1},
		{Company: "beta", Runs: 1, Priced: 1, CostUSD: 4, InputTokens: 2, OutputTokens: 1},
		{Company: "beta", Agent: "b1", Runs: 1, Priced: 1, CostUSD: 4, InputTokens: 2, OutputTokens: 1},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("totals (-want +got):\n%s", d)
	}
	if all := Totals(rows, time.Time{}, time.Time{}); all[0].Runs != 5 {
		t.Errorf("an open period: acme's runs %d, want 5", all[0].Runs)
	}
}

// TestHostsForLoopback: the page answers to the address it is bound to,
// and to localhost for a loopback one, nothing else.
func TestHostsForLoopback(t *testing.T) {
	if d := cmp.Diff([]string{"127.0.0.1:8095", "localhost:8095"}, HostsFor("127.0.0.1:8095")); d != "" {
		t.Error(d)
	}
	if d := cmp.Diff([]string{"10.0.0.5:8095"}, HostsFor("10.0.0.5:8095")); d != "" {
		t.Error(d)
	}
}
