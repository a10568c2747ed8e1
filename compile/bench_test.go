package compile

import (
	"testing"

	"github.com/paperclipai/clipjob/contract"
)

// BenchmarkMutating: compiling a namespace's policies (every profile),
// what a controller pays when the source or the config changes.
func BenchmarkMutating(b *testing.B) {
	inh, cfg := testSource(b)
	for b.Loop() {
		if _, err := Mutating(Input{Namespace: "paperclip", Inherited: inh, Config: cfg}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTypeCheck: the API server's compile of one profile's policy
// (type-checking its CEL), paid once per policy change.
func BenchmarkTypeCheck(b *testing.B) {
	inh, cfg := testSource(b)
	ps, err := Mutating(Input{Namespace: "paperclip", Inherited: inh, Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := compileEvaluator(ps[0].Policy); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmit: what the API server spends in CEL on one bare Job's
// CREATE with the policy of its profile: the match conditions and the
// patch (the webhook's equivalent is BenchmarkMutate in webhook/).
func BenchmarkAdmit(b *testing.B) {
	inh, cfg := testSource(b)
	c := compileFor(b, inh, cfg, "paperclip")
	job := bareJob("bench", map[string]string{contract.LabelAgentID: "a", contract.LabelCompanyID: "c", contract.LabelRunID: "r", contract.LabelAdapterType: "claude_local"},
		map[string]string{contract.AnnotationEnvSecret: "r-env"}, map[string]string{contract.AnnotationPrompt: "Fix it."})
	e := c.evals[0]
	for b.Loop() {
		if _, ok, err := e.mutate(job, creator); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkAdmitMatchOnly: the match conditions alone, for an agent Job
// they leave to the webhook (an adapter type no profile knows).
func BenchmarkAdmitMatchOnly(b *testing.B) {
	inh, cfg := testSource(b)
	c := compileFor(b, inh, cfg, "paperclip")
	job := bareJob("bench", map[string]string{contract.LabelAgentID: "a", contract.LabelRunID: "r", contract.LabelAdapterType: "hermes_local"},
		map[string]string{}, map[string]string{contract.AnnotationPrompt: "Fix it."})
	e := c.evals[0]
	for b.Loop() {
		if _, ok, err := e.mutate(job, creator); err != nil || ok {
			b.Fatal(ok, err)
		}
	}
}
