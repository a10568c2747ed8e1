package result

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Result is what a run produced, read from its log.
type Result struct {
	// Format is the log format recognised: "claude-stream-json",
	// "opencode-json", or "" when the lines are plain text.
	Format    string `json:"format,omitempty"`
	SessionID string `json:"sessionId,omitempty"`
	Model     string `json:"model,omitempty"`
	// Subtype and IsError come from Claude's result event
	// ("success", "error_max_turns", …).
	Subtype string `json:"subtype,omitempty"`
	IsError bool   `json:"isError,omitempty"`
	// Text is the final answer: Claude's result, or OpenCode's last text.
	Text    string   `json:"text,omitempty"`
	Usage   *Usage   `json:"usage,omitempty"`
	CostUSD *float64 `json:"costUsd,omitempty"`
	// Truncated: the agent produced output but no result event, e.g. it
	// was killed. Reason says what the container's termination suggests.
	Truncated bool   `json:"truncated,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// Outcome, once the run has ended: "succeeded", "failed" (an error
	// result, or a non-zero exit), "killed" (a signal or OOM, exit 137 or
	// 143), "timed_out" (its Job's deadline passed). What Paperclip records
	// as the run's status.
	Outcome string `json:"outcome,omitempty"`
	// Errors are the agent's own error reports: an error result's text,
	// OpenCode's error events.
	Errors []string `json:"errors,omitempty"`
	// SessionUnavailable: resuming the session failed because the agent no
	// longer has it; the adapter starts a new session instead.
	SessionUnavailable bool `json:"sessionUnavailable,omitempty"`
	// EmptyResponse: the run succeeded with no answer text.
	EmptyResponse bool `json:"emptyResponse,omitempty"`
	// Raw is the terminal result event as the agent wrote it.
	Raw json.RawMessage `json:"raw,omitempty"`
}

// Usage is token accounting, summed over the run where the format reports
// it per step.
type Usage struct {
	InputTokens              int64 `json:"inputTokens"`
	OutputTokens             int64 `json:"outputTokens"`
	CacheReadInputTokens     int64 `json:"cacheReadInputTokens,omitempty"`
	CacheCreationInputTokens int64 `json:"cacheCreationInputTokens,omitempty"`
	ReasoningTokens          int64 `json:"reasoningTokens,omitempty"`
}

// Parser reads a run's lines in order. Lines that are not JSON, or
// JSON of no known shape, are simply not part of the result.
type Parser struct {
	r          Result
	noSession  bool // a line said the session to resume is gone
	sawOutput  bool // assistant or text output seen
	sawResult  bool // a terminal result event seen
	openCost   float64
	openTokens Usage
	openSteps  int
}

type claudeEvent struct {
	Type      string   `json:"type"`
	Subtype   string   `json:"subtype"`
	SessionID string   `json:"session_id"`
	Model     string   `json:"model"`
	IsError   bool     `json:"is_error"`
	Result    *string  `json:"result"`
	CostUSD   *float64 `json:"total_cost_usd"`
	Usage     *struct {
		InputTokens              int64 `json:"input_tokens"`
		OutputTokens             int64 `json:"output_tokens"`
		CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
		CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	} `json:"usage"`
	Message *json.RawMessage `json:"message"`
}

type openCodeEvent struct {
	Type      string `json:"type"`
	SessionID string `json:"sessionID"`
	Part      *struct {
		Type   string   `json:"type"`
		Text   string   `json:"text"`
		Cost   *float64 `json:"cost"`
		Tokens *struct {
			Input     int64 `json:"input"`
			Output    int64 `json:"output"`
			Reasoning int64 `json:"reasoning"`
			Cache     struct {
				Read  int64 `json:"read"`
				Write int64 `json:"write"`
			} `json:"cache"`
		} `json:"tokens"`
	} `json:"part"`
	Error *json.RawMessage `json:"error"`
}

// sessionGone are what the agents print when asked to resume a session
// they no longer have (Claude: "No conversation found with session ID").
var sessionGone = [][]byte{[]byte("no conversation found"), []byte("session not found")}

func goneSession(b []byte) bool {
	lower := bytes.ToLower(b)
	return bytes.Contains(lower, sessionGone[0]) || bytes.Contains(lower, sessionGone[1])
}

func (p *Parser) Feed(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		// The CLI's own complaint is a plain line (stderr); the same words
		// inside JSON are the agent's work (a file it read, a tool's output)
		// and must not cost the run its session.
		if goneSession(line) {
			p.noSession = true
		}
		return
	}
	if bytes.Contains(line, []byte(`"sessionID"`)) {
		p.feedOpenCode(line)
		return
	}
	var ev claudeEvent
	if json.Unmarshal(line, &ev) != nil || ev.Type == "" {
		return
	}
	switch ev.Type {
	case "system":
		p.r.Format = "claude-stream-json"
		// The first init is the run's; one after the result, or a second
		// one, is output pretending.
		if ev.Subtype == "init" && p.r.SessionID == "" && !p.sawResult {
			p.r.SessionID, p.r.Model = ev.SessionID, ev.Model
		}
	case "assistant":
		p.r.Format = "claude-stream-json"
		p.sawOutput = true
	case "result":
		p.r.Format = "claude-stream-json"
		p.sawResult = true
		p.r.Subtype, p.r.IsError, p.r.CostUSD = ev.Subtype, ev.IsError, ev.CostUSD
		if ev.SessionID != "" {
			p.r.SessionID = ev.SessionID
		}
		if ev.Result != nil {
			p.r.Text = *ev.Result
		}
		if ev.IsError && p.r.Text != "" {
			p.addError(p.r.Text)
			if goneSession([]byte(p.r.Text)) {
				p.noSession = true
			}
		}
		p.r.Raw = append(json.RawMessage{}, line...)
		if u := ev.Usage; u != nil {
			p.r.Usage = &Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
				CacheReadInputTokens: u.CacheReadInputTokens, CacheCreationInputTokens: u.CacheCreationInputTokens}
		}
	}
}

// MaxErrors and MaxErrorBytes bound Result.Errors: the agent writes them,
// a run's record holds them for its retention, and every list and log end
// carries them. The latest are kept, each cut to MaxErrorBytes.
const (
	MaxErrors     = 10
	MaxErrorBytes = 4 << 10
)

func (p *Parser) addError(e string) {
	if len(e) > MaxErrorBytes {
		e = strings.ToValidUTF8(e[:MaxErrorBytes], "") + " [clipjob: error truncated]"
	}
	if len(p.r.Errors) == MaxErrors {
		p.r.Errors = append(p.r.Errors[:0:0], p.r.Errors[1:]...)
	}
	p.r.Errors = append(p.r.Errors, e)
}

func (p *Parser) feedOpenCode(line []byte) {
	var ev openCodeEvent
	if json.Unmarshal(line, &ev) != nil || ev.Type == "" {
		return
	}
	p.r.Format = "opencode-json"
	if ev.SessionID != "" {
		p.r.SessionID = ev.SessionID
	}
	switch {
	case ev.Type == "error":
		p.r.IsError = true
		if ev.Error != nil {
			p.r.Text = string(*ev.Error)
			p.addError(string(*ev.Error))
		}
		p.r.Raw = append(json.RawMessage{}, line...)
	case ev.Part == nil:
	case ev.Part.Type == "text" || ev.Type == "text":
		p.sawOutput = true
		p.r.Text = ev.Part.Text
	case ev.Part.Type == "step-finish" || ev.Type == "step_finish":
		p.sawResult = true
		p.r.Raw = append(json.RawMessage{}, line...)
		p.openSteps++
		if ev.Part.Cost != nil {
			p.openCost += *ev.Part.Cost
		}
		if tk := ev.Part.Tokens; tk != nil {
			p.openTokens.InputTokens += tk.Input
			p.openTokens.OutputTokens += tk.Output + tk.Reasoning
			p.openTokens.ReasoningTokens += tk.Reasoning
			p.openTokens.CacheReadInputTokens += tk.Cache.Read
			p.openTokens.CacheCreationInputTokens += tk.Cache.Write
		}
	}
}

// Termination is how the agent container ended, from its status.
type Termination struct {
	ExitCode int32  `json:"exitCode"`
	Reason   string `json:"reason,omitempty"`
}

// result returns what was parsed; term, when the run has ended, decides
// whether output without a result counts as truncated.
func (p *Parser) Result(term *Termination) *Result {
	r := p.r
	if r.Format == "opencode-json" && p.openSteps > 0 {
		cost, usage := p.openCost, p.openTokens
		r.CostUSD, r.Usage = &cost, &usage
	}
	if term != nil && p.sawOutput && !p.sawResult {
		r.Truncated = true
		r.Reason = fmt.Sprintf("output ended without a result; container exited %d", term.ExitCode)
		if term.Reason != "" {
			r.Reason += " (" + term.Reason + ")"
		}
		if term.ExitCode == 137 || term.Reason == "OOMKilled" {
			r.Reason += ": likely killed for memory (OOM); raise the profile's memory limit"
		}
	}
	r.SessionUnavailable = p.noSession
	if term != nil {
		r.Outcome = outcome(&r, term)
		r.EmptyResponse = r.Outcome == "succeeded" && strings.TrimSpace(r.Text) == "" && r.Format != ""
	}
	if r.Format == "" && !r.Truncated && !r.SessionUnavailable {
		return nil
	}
	return &r
}

// OutcomeTimedOut is the outcome of a run whose Job failed with
// DeadlineExceeded: the relay learns it from the Job, after the pod.
const OutcomeTimedOut = "timed_out"

// outcome is how an ended run went: a signal first (the agent did not
// finish), then the agent's own verdict, then its exit code.
func outcome(r *Result, term *Termination) string {
	switch {
	case term.ExitCode == 137 || term.ExitCode == 143 || term.Reason == "OOMKilled":
		return "killed"
	case r.IsError || term.ExitCode != 0 || r.Truncated:
		return "failed"
	}
	return "succeeded"
}
