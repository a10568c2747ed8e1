package decide_test

import (
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// claudeFixture is the golden fixture profile-claude_local and what its
// source Deployment gives agents.
func claudeFixture(t *testing.T) (golden.Fixture, *templates.Inherited) {
	t.Helper()
	fx := golden.Case(t, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(fx.Source, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	return fx, inh
}

// sourceFacts are facts whose source gives agents inh.
func sourceFacts(inh *templates.Inherited) decide.Facts {
	return decide.Facts{Source: func(*config.Config) (*templates.Inherited, *templates.TemplateHashes, error) { return inh, nil, nil }}
}

// An agent Job is admitted only as clipjob completes it: the validating
// half holds the final Job to a fresh render, so a Job that skipped the
// mutating webhook (failing open, or dressed as complete by its client),
// or one completed by a stale compiled policy, is refused naming the first
// field that differs; the Job clipjob completes passes.
func TestValidateRefusesAJobClipjobDidNotComplete(t *testing.T) {
	fx, inh := claudeFixture(t)
	const user = "system:serviceaccount:paperclip:paperclip"
	facts := sourceFacts(inh)
	validate := func(j *batchv1.Job) decide.Validation {
		return decide.Validate(decide.Input{Operation: policy.Create, Job: j, Config: fx.Config, Facts: facts, User: user})
	}
	m := decide.Mutate(decide.Input{Operation: policy.Create, Job: fx.Job, Config: fx.Config, Facts: facts, User: user})
	if m.Result == nil {
		t.Fatalf("the fixture is not completed: %+v", m.Refusal)
	}
	complete := m.Result.Job
	if v := validate(complete); !slices.Contains(v.Decision.Checked, policy.RuleRendered) || slices.Contains(v.Decision.Failed, policy.RuleRendered) {
		t.Fatalf("the completed Job: checked %v, failed %v", v.Decision.Checked, v.Decision.Failed)
	}

	cases := map[string]struct {
		change func(j *batchv1.Job)
		path   string
	}{
		"the HOME clipjob sets left out": {func(j *batchv1.Job) {
			env := j.Spec.Template.Spec.Containers[0].Env
			for i := range env {
				if env[i].Name == "HOME" {
					j.Spec.Template.Spec.Containers[0].Env = append(env[:i:i], env[i+1:]...)
					break
				}
			}
		}, "spec.template.spec.containers[0].env"},
		"the profile's resource limits left out": {func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Resources.Limits = nil
		}, "spec.template.spec.containers[0].resources.limits"},
		"no floor on privilege escalation": {func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		}, "spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation"},
		"no egress label on the pods": {func(j *batchv1.Job) { delete(j.Spec.Template.Labels, contract.LabelEgress) },
			"spec.template.metadata.labels[paperclip.io/egress-profile]"},
		"a stale template hash (a policy compiled before the config changed)": {func(j *batchv1.Job) {
			j.Annotations[contract.AnnotationTemplateHash] = "0000000000000000"
		}, "metadata.annotations[clipjob.paperclip.io/template-hash]"},
		"an older source revision": {func(j *batchv1.Job) {
			j.Annotations[contract.AnnotationSource] = "paperclip/paperclip generation 1"
		}, "metadata.annotations[clipjob.paperclip.io/source]"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			j := complete.DeepCopy()
			c.change(j)
			v := validate(j)
			if v.Refusal == nil || !slices.Contains(v.Decision.Failed, policy.RuleRendered) {
				t.Fatalf("admitted, or refused without the rendered rule (failed %v)", v.Decision.Failed)
			}
			if !strings.Contains(v.Refusal.Message, c.path+": Forbidden: not as clipjob completes this Job") {
				t.Errorf("refusal %q does not name %s", v.Refusal.Message, c.path)
			}
		})
	}

	t.Run("a bare Job that skipped the mutating webhook", func(t *testing.T) {
		bare := fx.Job.DeepCopy()
		bare.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: inh.Image, Command: []string{"claude"}}}
		v := validate(bare)
		if v.Refusal == nil || !slices.Contains(v.Decision.Failed, policy.RuleRendered) {
			t.Fatalf("admitted, or refused without the rendered rule (failed %v)", v.Decision.Failed)
		}
	})
	t.Run("a Job clipjob refuses to complete", func(t *testing.T) {
		j := complete.DeepCopy()
		j.Annotations[contract.AnnotationMaxTurns] = "0"
		v := validate(j)
		if v.Refusal == nil || !strings.Contains(v.Refusal.Message, "clipjob does not complete this Job") {
			t.Fatalf("refusal %+v", v.Refusal)
		}
	})
}

// Without the source, whether clipjob completed a Job cannot be told: an
// agent Job's CREATE is refused (503, as the mutating webhook refuses it),
// never judged without the rendered rule — a client that made its Job
// look complete would otherwise skip clipjob's completion while the
// source is away. Offline (no source given) it is not refused here:
// the mutation's half says what is undecided.
func TestValidateRefusesWhenTheSourceIsAway(t *testing.T) {
	fx, inh := claudeFixture(t)
	withSource := sourceFacts(inh)
	m := decide.Mutate(decide.Input{Operation: policy.Create, Job: fx.Job, Config: fx.Config, Facts: withSource})
	if m.Result == nil {
		t.Fatal("fixture not completed")
	}
	away := decide.Facts{Source: func(*config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
		return nil, nil, &templates.SourceError{Source: "paperclip/paperclip", Reason: "not listed yet"}
	}}
	v := decide.Validate(decide.Input{Operation: policy.Create, Job: m.Result.Job, Config: fx.Config, Facts: away})
	if v.Refusal == nil || v.Refusal.Code != 503 || !strings.Contains(v.Refusal.Message, "cannot check that this Job is as clipjob completes it") {
		t.Fatalf("source away: refusal %+v; want 503", v.Refusal)
	}
	offline := decide.Validate(decide.Input{Operation: policy.Create, Job: m.Result.Job, Config: fx.Config, Facts: decide.Facts{}})
	if offline.Refusal != nil && offline.Refusal.Code == 503 {
		t.Fatalf("offline without a source: refused %+v", offline.Refusal)
	}
}
