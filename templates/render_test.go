package templates_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
	"github.com/paperclipai/clipjob/templates"
)

// TestRenderGolden renders every fixture, compares it with its golden file,
// then renders the result again: a second render must change nothing.
func TestRenderGolden(t *testing.T) {
	for _, c := range golden.Cases(t) {
		t.Run(c.Name, func(t *testing.T) {
			res, err := c.Render()
			if err != nil {
				golden.Compare(t, c.GoldenPath, golden.Format("", nil, nil, err))
				return
			}
			if !res.Changed {
				t.Errorf("first render reports no change")
			}
			golden.Compare(t, c.GoldenPath, golden.Format(res.Profile, res.Job, res.Warnings, nil))

			again := c
			again.Job = res.Job
			res2, err := again.Render()
			if err != nil {
				t.Fatalf("re-render failed: %v", err)
			}
			if res2.Changed {
				t.Errorf("re-render changed the Job (not idempotent):\n%s", cmp.Diff(res.Job, res2.Job))
			}
			if diff := cmp.Diff(res.Job, res2.Job); diff != "" {
				t.Errorf("re-render differs (-first +second):\n%s", diff)
			}
		})
	}
}

func TestRenderDoesNotModifyInput(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	before := c.Job.DeepCopy()
	if _, err := c.Render(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, c.Job); diff != "" {
		t.Errorf("Render modified its input (-before +after):\n%s", diff)
	}
}

// TestTemplateHashesMemo: a memo shared by renders of one source and
// Config gives each profile the hash a fresh render computes, never
// another profile's.
func TestTemplateHashesMemo(t *testing.T) {
	c := golden.Case(t, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	memo := &templates.TemplateHashes{}
	seen := map[string]string{}
	for _, adapter := range []string{"claude_local", "codex_local", "claude_local", "opencode_local", "codex_local"} {
		job := jobs.MakeJob("run-1", "paperclip").Agent("a").Company("c").Adapter(adapter).Obj()
		fresh, err := templates.Render(templates.Input{Job: job, Inherited: inh, Config: c.Config})
		if err != nil {
			t.Fatal(err)
		}
		memoized, err := templates.Render(templates.Input{Job: job, Inherited: inh, Config: c.Config, Hashes: memo})
		if err != nil {
			t.Fatal(err)
		}
		want, got := fresh.Job.Annotations[contract.AnnotationTemplateHash], memoized.Job.Annotations[contract.AnnotationTemplateHash]
		if want == "" || got != want {
			t.Errorf("%s: memoized hash %q, fresh %q", adapter, got, want)
		}
		seen[adapter] = want
	}
	if seen["claude_local"] == seen["codex_local"] || seen["codex_local"] == seen["opencode_local"] {
		t.Errorf("profiles share a hash: %v", seen)
	}
}

// Run options and the working directory take exactly what they claim.
func TestRunOptionsAndWorkingDirAreStrict(t *testing.T) {
	for _, tc := range []struct{ key, value, want string }{
		{contract.AnnotationMaxTurns, "+5", "a number of turns"},
		{contract.AnnotationMaxTurns, "05", "a number of turns"},
		{contract.AnnotationWorkingDir, "/paperclip/a\nb", "control characters"},
	} {
		c := golden.Cases(t)[0]
		c.Job = c.Job.DeepCopy()
		if c.Job.Annotations == nil {
			c.Job.Annotations = map[string]string{}
		}
		c.Job.Annotations[tc.key] = tc.value
		_, err := c.Render()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: %v, want %q", tc.key, tc.value, err, tc.want)
		}
	}
}

// TestRunOptionsCannotComeFromElsewhere: a Job naming no session, model or
// turn limit gets them set empty, so the run's env Secret (envFrom, which
// explicit env overrides) or the server's env cannot fill them in past
// clipjob's checks (a model name, 1 to 10000 turns) and resume a session
// the Job does not name (the adapter's hostile review: an agent's config
// put PAPERCLIP_MAX_TURNS=999999 and another agent's session id there).
func TestRunOptionsCannotComeFromElsewhere(t *testing.T) {
	c := golden.Case(t, "profile-claude_local")
	c.Source = c.Source.DeepCopy()
	src := &c.Source.Spec.Template.Spec.Containers[0]
	src.Env = append(src.Env,
		corev1.EnvVar{Name: "PAPERCLIP_MODEL", Value: "--not-a-model"},
		corev1.EnvVar{Name: "PAPERCLIP_MAX_TURNS", Value: "999999"},
		corev1.EnvVar{Name: "PAPERCLIP_SESSION_ID", Value: "another-agents-session"})
	res, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, ctr := range res.Job.Spec.Template.Spec.Containers {
		seen := map[string][]string{}
		for _, e := range ctr.Env {
			seen[e.Name] = append(seen[e.Name], e.Value)
		}
		for _, name := range []string{"PAPERCLIP_MODEL", "PAPERCLIP_MAX_TURNS", "PAPERCLIP_SESSION_ID"} {
			if got := seen[name]; len(got) != 1 || got[0] != "" {
				t.Errorf("container %s: %s = %q, want set once and empty", ctr.Name, name, got)
			}
		}
	}
}

// The source's revision on a Job is what agents inherit, not the
// Deployment's generation: scaling the server (which bumps the generation)
// leaves it, a new image changes it. A Job rendered the moment before a
// scale is still the render of the moment after, which the validating
// webhook requires.
func TestSourceRevisionIsWhatIsInherited(t *testing.T) {
	fx := golden.Case(t, "profile-claude_local")
	base, err := templates.InheritFromDeployment(fx.Source, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	scaled := fx.Source.DeepCopy()
	scaled.Generation++
	scaled.Spec.Replicas = ptr.To[int32](7)
	again, err := templates.InheritFromDeployment(scaled, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	if again.Revision != base.Revision || !strings.HasPrefix(base.Revision, "inherited ") {
		t.Errorf("scaled: revision %q, was %q", again.Revision, base.Revision)
	}
	image := fx.Source.DeepCopy()
	for i := range image.Spec.Template.Spec.Containers {
		image.Spec.Template.Spec.Containers[i].Image += "-next"
	}
	changed, err := templates.InheritFromDeployment(image, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Revision == base.Revision {
		t.Errorf("a new image kept revision %q", base.Revision)
	}
}
