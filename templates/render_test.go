package templates_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/golden"
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

func TestIsAgentJob(t *testing.T) {
	if contract.IsAgentJob(map[string]string{"app": "x"}) {
		t.Error("a Job without the agent label is not an agent Job")
	}
	if !contract.IsAgentJob(map[string]string{contract.LabelAgentID: ""}) {
		t.Error("the label's presence marks an agent Job")
	}
}
