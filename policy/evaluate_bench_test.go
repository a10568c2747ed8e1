package policy

import "testing"

// BenchmarkEvaluate is the pure part of every validating admission.
func BenchmarkEvaluate(b *testing.B) {
	in := Input{Operation: Create, Job: renderedJob(b), Config: mustConfig(b, "policy:\n  images:\n    allow: ['ghcr.io/paperclipai/*']\n"),
		SourceImages: []string{sourceImage}, Claims: rwx}
	b.ReportAllocs()
	for b.Loop() {
		if d := Evaluate(in); !d.Allowed() {
			b.Fatal(d.Errs)
		}
	}
}
