package result

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"
)

func parseFile(t *testing.T, name string, term *Termination) *Result {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var p Parser
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p.Feed(sc.Bytes())
	}
	return p.Result(term)
}

func TestClaudeResult(t *testing.T) {
	got := parseFile(t, "claude-success.ndjson", &Termination{ExitCode: 0, Reason: "Completed"})
	want := &Result{
		Format: "claude-stream-json", SessionID: "9f2c1a57-3b9e-4c8e-a1d2-5e7f8a9b0c1d", Model: "claude-sonnet-4-5-20250929",
		Subtype: "success", Text: "Fixed the off-by-one in pkg/foo and opened a pull request.",
		Usage:   &Usage{InputTokens: 1203, OutputTokens: 2391, CacheReadInputTokens: 88210, CacheCreationInputTokens: 5120},
		CostUSD: ptr.To(0.1873),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestClaudeTruncatedByOOM(t *testing.T) {
	got := parseFile(t, "claude-truncated.ndjson", &Termination{ExitCode: 137, Reason: "OOMKilled"})
	if !got.Truncated || got.Reason != "output ended without a result; container exited 137 (OOMKilled): likely killed for memory (OOM); raise the profile's memory limit" {
		t.Errorf("got %+v", got)
	}
	if running := parseFile(t, "claude-truncated.ndjson", nil); running.Truncated {
		t.Error("a run still going is not truncated")
	}
}

func TestOpenCodeResult(t *testing.T) {
	got := parseFile(t, "opencode.ndjson", &Termination{})
	want := &Result{
		Format: "opencode-json", SessionID: "ses_5f8a9b0c1d2e3f4a", Text: "Done: the test passes now.",
		Usage:   &Usage{InputTokens: 2000, OutputTokens: 250, ReasoningTokens: 40, CacheReadInputTokens: 4900, CacheCreationInputTokens: 100},
		CostUSD: ptr.To(0.02),
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestPlainLinesHaveNoResult(t *testing.T) {
	var p Parser
	for _, l := range []string{"hello", `{"not":"an event"}`, "", `{"type":`} {
		p.Feed([]byte(l))
	}
	if r := p.Result(&Termination{ExitCode: 1}); r != nil {
		t.Errorf("plain output parsed as %+v", r)
	}
}
