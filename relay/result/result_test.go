package result

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

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
		CostUSD: ptr.To(0.1873), Outcome: "succeeded",
	}
	if len(got.Raw) == 0 || !strings.HasPrefix(string(got.Raw), `{"type":"result"`) {
		t.Errorf("raw result event %s", got.Raw)
	}
	got.Raw = nil
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
		CostUSD: ptr.To(0.02), Outcome: "succeeded",
	}
	if !strings.Contains(string(got.Raw), `"step-finish"`) {
		t.Errorf("raw result event %s", got.Raw)
	}
	got.Raw = nil
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

// What Paperclip's adapters read from a run beyond the answer: how it
// ended, the agent's errors, a session that could not be resumed, an
// empty answer.
func TestOutcomes(t *testing.T) {
	feed := func(term *Termination, lines ...string) *Result {
		var p Parser
		for _, l := range lines {
			p.Feed([]byte(l))
		}
		return p.Result(term)
	}
	errResult := `{"type":"result","subtype":"error_during_execution","is_error":true,"result":"API Error: 529 overloaded","session_id":"s"}`
	for _, tc := range []struct {
		name  string
		got   *Result
		check func(*Result) bool
	}{
		{"an error result", feed(&Termination{ExitCode: 1}, errResult), func(r *Result) bool {
			return r.Outcome == "failed" && len(r.Errors) == 1 && r.Errors[0] == "API Error: 529 overloaded"
		}},
		{"killed", feed(&Termination{ExitCode: 137}, `{"type":"assistant","message":{}}`), func(r *Result) bool { return r.Outcome == "killed" && r.Truncated }},
		{"terminated", feed(&Termination{ExitCode: 143}, `{"type":"assistant","message":{}}`), func(r *Result) bool { return r.Outcome == "killed" }},
		{"a session that is gone", feed(&Termination{ExitCode: 1}, "Error: No conversation found with session ID: 7c1e9d20"), func(r *Result) bool {
			return r != nil && r.SessionUnavailable && r.Outcome == "failed"
		}},
		{"an empty answer", feed(&Termination{}, `{"type":"result","subtype":"success","is_error":false,"result":"","session_id":"s"}`), func(r *Result) bool {
			return r.Outcome == "succeeded" && r.EmptyResponse
		}},
		{"OpenCode's error event", feed(&Termination{ExitCode: 1}, `{"type":"error","sessionID":"ses_1","error":{"name":"ProviderAuthError","message":"bad key"}}`), func(r *Result) bool {
			return r.Outcome == "failed" && len(r.Errors) == 1 && strings.Contains(r.Errors[0], "ProviderAuthError")
		}},
		{"still running", feed(nil, errResult), func(r *Result) bool { return r.Outcome == "" }},
		// Output that pretends: the words inside a tool's output, an init
		// after the result.
		{"'session not found' in a tool's output", feed(&Termination{}, `{"type":"system","subtype":"init","session_id":"s1","model":"m"}`,
			`{"type":"user","message":{"content":[{"type":"tool_result","content":"grep: session not found"}]}}`,
			`{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"s1"}`), func(r *Result) bool {
			return !r.SessionUnavailable && r.SessionID == "s1"
		}},
		{"an init after the result", feed(&Termination{}, `{"type":"system","subtype":"init","session_id":"s1","model":"m"}`,
			`{"type":"result","subtype":"success","is_error":false,"result":"ok"}`,
			`{"type":"system","subtype":"init","session_id":"someone-elses","model":"cheap"}`), func(r *Result) bool {
			return r.SessionID == "s1" && r.Model == "m"
		}},
	} {
		if tc.got == nil || !tc.check(tc.got) {
			t.Errorf("%s: %+v", tc.name, tc.got)
		}
	}
}

// An agent that prints error after error, each huge, leaves a bounded
// result: the latest MaxErrors, each cut to MaxErrorBytes.
func TestErrorsAreBounded(t *testing.T) {
	var p Parser
	big := strings.Repeat("é", MaxErrorBytes) // two bytes each: a cut may fall mid-rune
	for i := range 3 * MaxErrors {
		p.Feed([]byte(`{"type":"error","sessionID":"s","error":"` + fmt.Sprint(i) + big + `"}`))
	}
	r := p.Result(&Termination{ExitCode: 1})
	if len(r.Errors) != MaxErrors {
		t.Fatalf("%d errors kept, want %d", len(r.Errors), MaxErrors)
	}
	if !strings.HasPrefix(strings.TrimPrefix(r.Errors[MaxErrors-1], `"`), fmt.Sprint(3*MaxErrors-1)) { // OpenCode errors are kept as their JSON
		t.Errorf("the last error kept is not the latest: %.20q", r.Errors[MaxErrors-1])
	}
	for _, e := range r.Errors {
		if len(e) > MaxErrorBytes+40 || !utf8.ValidString(e) || !strings.HasSuffix(e, "[clipjob: error truncated]") {
			t.Fatalf("error of %d bytes (valid UTF-8 %v): %.40q…", len(e), utf8.ValidString(e), e)
		}
	}
}
