package decide_test

import (
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// A run is judged again when it starts (is unsuspended), by every rule of
// a CREATE:
// with compiled admission policies its CREATE may have been admitted by
// the API server alone (clipjob down, or the validating webhook skipping
// queued runs), so the start is where a Job dressed as complete, or one
// completed under a source or config no longer in force, is stopped. The
// run clipjob queued starts, whatever the claim controller wrote on it
// while it waited and whatever the mode is now.
func TestStartCheckJudgesAQueuedRunAsItsCreate(t *testing.T) {
	fx, inh := claudeFixture(t)
	const creator = "system:serviceaccount:paperclip:paperclip"
	const controller = "system:serviceaccount:clipjob-system:clipjob-webhook"
	queue := fx.Config.InMode(config.ModeQueue)
	m := decide.Mutate(decide.Input{Operation: policy.Create, Job: fx.Job, Config: queue, Facts: sourceFacts(inh), User: creator})
	if m.Result == nil {
		t.Fatalf("the fixture is not completed: %+v", m.Refusal)
	}
	queued := m.Result.Job
	queued.UID = "uid-1"
	if queued.Annotations[contract.AnnotationQueued] != "true" || !*queued.Spec.Suspend {
		t.Fatal("the fixture was not queued")
	}
	// What the claim controller writes while the run waits, and its start.
	waiting := queued.DeepCopy()
	waiting.Annotations[contract.AnnotationQueuePosition] = "1"
	waiting.Annotations[contract.AnnotationStartFailures] = "1"
	start := func(old *batchv1.Job) *batchv1.Job {
		j := old.DeepCopy()
		j.Spec.Suspend = ptr.To(false)
		delete(j.Annotations, contract.AnnotationQueuePosition)
		return j
	}
	judge := func(old *batchv1.Job, cfg *config.Config, inh *templates.Inherited) decide.Validation {
		return decide.Validate(decide.Input{Operation: policy.Update, Job: start(old), Old: old, Config: cfg, Facts: sourceFacts(inh), User: controller})
	}

	for name, cfg := range map[string]*config.Config{"in Queue mode": queue, "after a switch to Reject mode": fx.Config} {
		v := judge(waiting, cfg, inh)
		if v.Refusal != nil {
			t.Fatalf("%s: the run clipjob queued cannot start: %s", name, v.Refusal.Message)
		}
		if !slices.Contains(v.Decision.Checked, policy.RuleRendered) {
			t.Errorf("%s: the start was not judged as a CREATE (checked %v)", name, v.Decision.Checked)
		}
	}
	// A run its client created suspended (Reject mode) and now resumes:
	// judged as its CREATE too, and admitted.
	m = decide.Mutate(decide.Input{Operation: policy.Create, Job: func() *batchv1.Job {
		j := fx.Job.DeepCopy()
		j.Spec.Suspend = ptr.To(true)
		return j
	}(), Config: fx.Config, Facts: sourceFacts(inh), User: creator})
	if m.Result == nil {
		t.Fatalf("the suspended fixture is not completed: %+v", m.Refusal)
	}
	paused := m.Result.Job
	if v := judge(paused, fx.Config, inh); v.Refusal != nil || !slices.Contains(v.Decision.Checked, policy.RuleRendered) {
		t.Errorf("resuming a run its client created suspended: refused %+v, or not judged as a CREATE", v.Refusal)
	}
	if !decide.StartsRun(policy.Update, start(waiting), waiting) || decide.StartsRun(policy.Update, waiting, waiting) {
		t.Error("StartsRun does not tell a start from another update")
	}

	refusals := map[string]struct {
		old  *batchv1.Job
		inh  *templates.Inherited
		want string
	}{
		"a source that moved on while it waited": {old: waiting, inh: func() *templates.Inherited {
			moved := *inh
			moved.Image = "ghcr.io/paperclipai/paperclip:next"
			return &moved
		}(), want: "metadata.annotations[clipjob.paperclip.io/template-hash]: Forbidden: not as clipjob completes this Job"},
		"a Job dressed as complete and queued, privileged": {old: func() *batchv1.Job {
			j := waiting.DeepCopy()
			j.Spec.Template.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
			return j
		}(), inh: inh, want: "privileged"},
		// The attacker first drops the queued mark (an annotation change
		// reaches no webhook), then unsuspends: still a start.
		"a Job dressed as complete, its queued mark dropped": {old: func() *batchv1.Job {
			j := waiting.DeepCopy()
			delete(j.Annotations, contract.AnnotationQueued)
			j.Spec.Template.Spec.Containers[0].Image = "evil.example.com/miner:1"
			return j
		}(), inh: inh, want: "evil.example.com/miner:1"},
		// Its pods carry the agent's labels, the Job itself none: the API
		// server's objectSelectors (policy, agent-runs) do not see it.
		"a Job whose pods alone carry the agent's labels": {old: func() *batchv1.Job {
			j := waiting.DeepCopy()
			delete(j.Labels, contract.LabelAgentID)
			return j
		}(), inh: inh, want: "paperclip.io/agent-id"},
		"a Job dressed as complete and queued, its own image": {old: func() *batchv1.Job {
			j := waiting.DeepCopy()
			j.Spec.Template.Spec.Containers = append(j.Spec.Template.Spec.Containers, corev1.Container{Name: "miner", Image: "evil.example.com/miner:1"})
			return j
		}(), inh: inh, want: "evil.example.com/miner:1"},
	}
	for name, c := range refusals {
		t.Run(name, func(t *testing.T) {
			v := judge(c.old, queue, c.inh)
			if v.Refusal == nil {
				t.Fatal("started")
			}
			if v.Refusal.Code != 403 || !strings.HasPrefix(v.Refusal.Message, "this run cannot start") || !strings.Contains(v.Refusal.Message, c.want) {
				t.Errorf("refusal %d %q; want 403 saying the queued run cannot start and naming %q", v.Refusal.Code, v.Refusal.Message, c.want)
			}
		})
	}
}

// A compiled admission policy of Queue mode can still complete a Job
// after the config switched to Reject mode (the API server applies a
// replaced or deleted policy for a moment): the Job reaches the mutating
// webhook suspended and marked queued. Render drops the mark, as it drops
// every annotation of clipjob's; the suspension must go with it, or the
// Job is admitted as a run the claim controller never starts (it starts
// only marked runs), holding its agent's claim meanwhile. A Job its client
// suspended, without the mark, stays suspended.
func TestAJobAStaleQueuePolicyCompletedRunsInRejectMode(t *testing.T) {
	fx, inh := claudeFixture(t)
	const creator = "system:serviceaccount:paperclip:paperclip"
	// What the Queue-mode policy stores (compile's tests hold the policy
	// to Render's output).
	m := decide.Mutate(decide.Input{Operation: policy.Create, Job: fx.Job, Config: fx.Config.InMode(config.ModeQueue), Facts: sourceFacts(inh), User: creator})
	if m.Result == nil || !contract.Suspended(m.Result.Job) || m.Result.Job.Annotations[contract.AnnotationQueued] != "true" {
		t.Fatalf("the fixture was not queued: %+v", m.Refusal)
	}
	stale := m.Result.Job
	for _, mode := range []config.ConcurrencyMode{config.ModeReject, config.ModeDisabled} {
		cfg := fx.Config.InMode(mode)
		m := decide.Mutate(decide.Input{Operation: policy.Create, Job: stale, Config: cfg, Facts: sourceFacts(inh), User: creator})
		if m.Result == nil {
			t.Fatalf("%s: refused: %+v", mode, m.Refusal)
		}
		got := m.Result.Job
		if contract.Suspended(got) || got.Annotations[contract.AnnotationQueued] != "" {
			t.Errorf("%s mode: a Job a stale Queue-mode policy completed is stored suspended %v, marked queued %q: a run nothing starts",
				mode, contract.Suspended(got), got.Annotations[contract.AnnotationQueued])
		}
		if !m.Result.Changed {
			t.Errorf("%s mode: the mutation says the Job was already complete, so the webhook would patch nothing", mode)
		}
		if len(m.Result.Warnings) == 0 || !strings.Contains(m.Result.Warnings[0], "metadata.annotations[clipjob.paperclip.io/queued]") ||
			!strings.Contains(m.Result.Warnings[0], "policy.concurrency.mode is "+string(mode)) {
			t.Errorf("%s mode: warnings %q do not say why the Job was not left suspended", mode, m.Result.Warnings)
		}
		// The validating half re-renders it unchanged.
		v := decide.Validate(decide.Input{Operation: policy.Create, Job: got, Config: cfg, Facts: sourceFacts(inh), User: creator})
		if v.Decision == nil || slices.Contains(v.Decision.Failed, policy.RuleRendered) {
			t.Errorf("%s mode: the unqueued Job is not as clipjob completes it: %+v", mode, v.Refusal)
		}
	}
	// A Job its client suspended is its client's to resume.
	paused := fx.Job.DeepCopy()
	paused.Spec.Suspend = ptr.To(true)
	m = decide.Mutate(decide.Input{Operation: policy.Create, Job: paused, Config: fx.Config.InMode(config.ModeReject), Facts: sourceFacts(inh), User: creator})
	if m.Result == nil || !contract.Suspended(m.Result.Job) {
		t.Errorf("Reject mode: a Job its client created suspended was not kept suspended")
	}
}
