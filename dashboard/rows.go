package dashboard

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// The states a run is shown in.
const (
	StateQueued    = "queued"    // admitted suspended in Queue mode, waiting for its agent
	StateRunning   = "running"   // started, not finished
	StateSucceeded = "succeeded" // the Job completed
	StateFailed    = "failed"    // the Job failed (not by its deadline)
	StateRefused   = "refused"   // a queued run clipjob would not start: Reason says why
	StateTimedOut  = "timed_out" // the Job's deadline passed, or it never started in time
)

// Run is one row of the page: one agent run, from its Job, its claim and
// the relay's record, whichever of them the viewer may read.
type Run struct {
	// Key identifies the row in links: namespace/run, with @jobUID when
	// another Job of the namespace carries the same run id.
	Key       string `json:"key"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Job       string `json:"job,omitempty"`
	JobUID    string `json:"jobUid,omitempty"`
	Agent     string `json:"agent"`
	Company   string `json:"company,omitempty"`
	Adapter   string `json:"adapter,omitempty"`
	Task      string `json:"task,omitempty"`
	State     string `json:"state"`
	// Position in the agent's queue (1 is next) and the run it waits
	// behind, for a queued run.
	Position int     `json:"position,omitempty"`
	WaitsFor *RunRef `json:"waitsFor,omitempty"`
	// Reason says why a run was refused, timed out or failed.
	Reason string `json:"reason,omitempty"`
	// HoldsClaim: the run holds its agent's claim Lease (its one active run).
	HoldsClaim bool       `json:"holdsClaim,omitempty"`
	Created    *time.Time `json:"created,omitempty"`
	Started    *time.Time `json:"started,omitempty"`
	Finished   *time.Time `json:"finished,omitempty"`
	// JobGone: the Job was deleted (its TTL); the relay keeps the run.
	JobGone bool `json:"jobGone,omitempty"`
	// Logged: the relay has the run's log.
	Logged   bool          `json:"logged,omitempty"`
	Lines    uint64        `json:"lines,omitempty"`
	ExitCode *int32        `json:"exitCode,omitempty"`
	Outcome  string        `json:"outcome,omitempty"`
	Session  string        `json:"session,omitempty"`
	Model    string        `json:"model,omitempty"`
	CostUSD  *float64      `json:"costUsd,omitempty"`
	Usage    *result.Usage `json:"usage,omitempty"`
	Summary  string        `json:"summary,omitempty"`
	Errors   []string      `json:"errors,omitempty"`
}

// RunRef names another run: the active run a queued one waits behind.
type RunRef struct {
	Job string `json:"job"` // namespace/name
	Run string `json:"run,omitempty"`
	Key string `json:"key,omitempty"`
}

// Sources are the facts a page shows, as the viewer may read them.
type Sources struct {
	Jobs []batchv1.Job
	// Leases are claim Leases (label clipjob.paperclip.io/claim).
	Leases []coordinationv1.Lease
	// Logged are the relay's records of runs.
	Logged []store.Run
}

// Rows turns the sources into the page's rows, newest first: one per
// agent Job, merged with the relay's record of the same Job's run, plus
// one per relay record whose Job is gone.
func Rows(s Sources) []Run {
	byUID := map[string]*store.Run{}
	for i := range s.Logged {
		// By namespace and UID: a record is another namespace's run
		// whatever Job UID it names.
		if uid := s.Logged[i].JobUID; uid != "" {
			byUID[s.Logged[i].Namespace+"/"+uid] = &s.Logged[i]
		}
	}
	claimed := map[string]bool{}
	for _, l := range s.Leases {
		if l.Labels[claim.Label] == claim.KindAgentRun && l.Annotations[claim.AnnotationJobUID] != "" &&
			l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			claimed[l.Annotations[claim.AnnotationJobUID]] = true
		}
	}
	var rows []Run
	seen := map[string]bool{}
	byJob := map[string]*Run{} // namespace/name → row, for the queue's holders
	for i := range s.Jobs {
		job := &s.Jobs[i]
		if job.Labels[contract.LabelAgentID] == "" {
			continue
		}
		rec := byUID[job.Namespace+"/"+string(job.UID)]
		if rec != nil {
			seen[rec.Namespace+"/"+rec.ID+"@"+rec.JobUID] = true
		}
		r := fromJob(job, rec)
		r.HoldsClaim = claimed[string(job.UID)]
		rows = append(rows, r)
	}
	for i := range s.Logged {
		rec := &s.Logged[i]
		if seen[rec.Namespace+"/"+rec.ID+"@"+rec.JobUID] {
			continue
		}
		rows = append(rows, fromRecord(rec))
	}
	keys(rows)
	for i := range rows {
		if rows[i].Job != "" {
			byJob[rows[i].Namespace+"/"+rows[i].Job] = &rows[i]
		}
	}
	for i := range rows {
		if w := rows[i].WaitsFor; w != nil {
			if h := byJob[w.Job]; h != nil {
				w.Run, w.Key = h.ID, h.Key
			}
		}
	}
	slices.SortStableFunc(rows, func(a, b Run) int {
		if c := cmp.Compare(when(b), when(a)); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return rows
}

// keys gives each row its link key: namespace/run, unless two rows of a
// namespace share the run id, then each carries its Job's UID as well.
func keys(rows []Run) {
	n := map[string]int{}
	for _, r := range rows {
		n[r.Namespace+"/"+r.ID]++
	}
	for i := range rows {
		rows[i].Key = rows[i].Namespace + "/" + rows[i].ID
		if n[rows[i].Key] > 1 && rows[i].JobUID != "" {
			rows[i].Key += "@" + rows[i].JobUID
		}
	}
}

// when orders rows: by creation, else start, of the run.
func when(r Run) int64 {
	for _, t := range []*time.Time{r.Created, r.Started, r.Finished} {
		if t != nil {
			return t.UnixNano()
		}
	}
	return 0
}

func fromJob(job *batchv1.Job, rec *store.Run) Run {
	created := job.CreationTimestamp.Time
	r := Run{
		ID:        job.Labels[contract.LabelRunID],
		Namespace: job.Namespace,
		Job:       job.Name,
		JobUID:    string(job.UID),
		Agent:     job.Labels[contract.LabelAgentID],
		Company:   job.Labels[contract.LabelCompanyID],
		Adapter:   job.Labels[contract.LabelAdapterType],
		Task:      job.Labels[contract.LabelTaskID],
		Created:   &created,
	}
	if r.ID == "" {
		r.ID = job.Name // a Job without a run id is still its agent's run
	}
	if job.Status.StartTime != nil {
		r.Started = &job.Status.StartTime.Time
	}
	if job.Status.CompletionTime != nil {
		r.Finished = &job.Status.CompletionTime.Time
	}
	r.State, r.Reason = jobState(job)
	if r.State == StateQueued {
		r.Position, _ = strconv.Atoi(job.Annotations[contract.AnnotationQueuePosition])
		if h := job.Annotations[contract.AnnotationQueueHolder]; h != "" {
			r.WaitsFor = &RunRef{Job: h}
		}
	}
	if r.Finished == nil && claim.Finished(job) {
		r.Finished = conditionTime(job)
	}
	addRecord(&r, rec)
	// The relay reads a timeout from the Job too; a run the Job
	// controller ended by its deadline is shown so whatever the record says.
	if r.State == StateFailed && r.Outcome == "timed_out" {
		r.State = StateTimedOut
	}
	return r
}

// jobState is the state a Job shows, and why when it did not succeed.
func jobState(job *batchv1.Job) (state, reason string) {
	if msg := job.Annotations[contract.AnnotationQueueError]; msg != "" {
		return StateRefused, msg
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return StateSucceeded, ""
		case batchv1.JobFailed:
			if c.Reason == batchv1.JobReasonDeadlineExceeded {
				if why := job.Annotations[contract.AnnotationStartTimeout]; why != "" {
					return StateTimedOut, "never started: " + why
				}
				return StateTimedOut, join(c.Reason, c.Message)
			}
			return StateFailed, join(c.Reason, c.Message)
		}
	}
	if contract.Suspended(job) && job.Annotations[contract.AnnotationQueued] == "true" {
		return StateQueued, ""
	}
	return StateRunning, ""
}

func join(reason, message string) string {
	if message == "" {
		return reason
	}
	if reason == "" {
		return message
	}
	return reason + ": " + message
}

// conditionTime is when the Job's Complete or Failed condition was set
// (a failed Job has no completion time).
func conditionTime(job *batchv1.Job) *time.Time {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			t := c.LastTransitionTime.Time
			return &t
		}
	}
	return nil
}

// fromRecord is the row of a run the relay keeps whose Job is gone.
func fromRecord(rec *store.Run) Run {
	r := Run{
		ID: rec.ID, Namespace: rec.Namespace, Job: rec.Job, JobUID: rec.JobUID,
		Agent: rec.Agent, Company: rec.Company, Adapter: rec.Adapter, Task: rec.Task,
		JobGone: true, Created: rec.PodCreated,
	}
	switch rec.Phase {
	case "Succeeded":
		r.State = StateSucceeded
	case "Failed", "Unknown":
		r.State = StateFailed
		r.Reason = rec.Reason
	default:
		r.State = StateRunning
	}
	r.Started, r.Finished = rec.StartedAt, rec.FinishedAt
	addRecord(&r, rec)
	if r.Outcome == "timed_out" {
		r.State = StateTimedOut
	}
	return r
}

// addRecord adds what the relay knows of the run: its log, result, cost.
func addRecord(r *Run, rec *store.Run) {
	if rec == nil {
		return
	}
	r.Logged, r.Lines, r.ExitCode = true, rec.LastSeq, rec.ExitCode
	if r.Started == nil {
		r.Started = rec.StartedAt
	}
	if r.Finished == nil {
		r.Finished = rec.FinishedAt
	}
	r.Session = rec.Session
	if res := rec.Result; res != nil {
		r.Outcome, r.Model, r.CostUSD, r.Usage, r.Errors = res.Outcome, res.Model, res.CostUSD, res.Usage, res.Errors
		if res.SessionID != "" {
			r.Session = res.SessionID
		}
		r.Summary = firstLine(res.Text, 200)
		if r.Reason == "" && res.Reason != "" && r.State != StateSucceeded {
			r.Reason = res.Reason
		}
	}
}

func firstLine(s string, max int) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}

// Total is what the runs of one agent or company cost in a period.
type Total struct {
	Company string `json:"company"`
	Agent   string `json:"agent,omitempty"` // empty: the company's total
	Runs    int    `json:"runs"`
	// Priced counts the runs whose cost is known (a result with a cost):
	// none, and CostUSD says nothing.
	Priced       int     `json:"priced"`
	CostUSD      float64 `json:"costUsd"`
	InputTokens  int64   `json:"inputTokens"`
	OutputTokens int64   `json:"outputTokens"`
}

// Totals sums the cost and tokens of the runs started in [from, until)
// (a zero bound is open) per agent and per company: each company's total
// first, then its agents, companies and agents by name.
func Totals(rows []Run, from, until time.Time) []Total {
	type key struct{ company, agent string }
	sums := map[key]*Total{}
	add := func(k key, r Run) {
		t := sums[k]
		if t == nil {
			t = &Total{Company: k.company, Agent: k.agent}
			sums[k] = t
		}
		t.Runs++
		if r.CostUSD != nil {
			t.CostUSD += *r.CostUSD
			t.Priced++
		}
		if r.Usage != nil {
			t.InputTokens += r.Usage.InputTokens + r.Usage.CacheReadInputTokens + r.Usage.CacheCreationInputTokens
			t.OutputTokens += r.Usage.OutputTokens
		}
	}
	for _, r := range rows {
		start := r.Started
		if start == nil {
			continue // a run that never started cost nothing
		}
		if (!from.IsZero() && start.Before(from)) || (!until.IsZero() && !start.Before(until)) {
			continue
		}
		add(key{r.Company, ""}, r)
		add(key{r.Company, r.Agent}, r)
	}
	out := make([]Total, 0, len(sums))
	for _, t := range sums {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b Total) int {
		return cmp.Or(cmp.Compare(a.Company, b.Company), cmp.Compare(a.Agent, b.Agent))
	})
	return out
}
