package templates_test

import (
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

// BenchmarkRender is the core of every mutating admission: one bare Job
// (no containers, inline prompt) rendered with the claude_local profile.
func BenchmarkRender(b *testing.B) {
	c := golden.Case(b, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		b.Fatal(err)
	}
	in := templates.Input{Job: c.Job, Inherited: inh, Config: c.Config, Hashes: &templates.TemplateHashes{}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := templates.Render(in); err != nil {
			b.Fatal(err)
		}
	}
}
