package main

import "fmt"

// outputFormat writes the events of one agent CLI.
type outputFormat interface {
	init() any
	text(string) any
	toolResult(string) any
	result(exit, lines int) any
}

func format(cli, session, model string) outputFormat {
	if cli == "opencode" {
		return opencode{session: session}
	}
	return claude{session: session, model: model}
}

// claude writes Claude Code's --output-format stream-json events.
type claude struct{ session, model string }

func (c claude) init() any {
	return map[string]any{"type": "system", "subtype": "init", "session_id": c.session, "model": c.model}
}

func (c claude) text(s string) any {
	return map[string]any{"type": "assistant", "session_id": c.session, "message": map[string]any{
		"role": "assistant", "content": []any{map[string]any{"type": "text", "text": s}}}}
}

func (c claude) toolResult(s string) any {
	return map[string]any{"type": "user", "session_id": c.session, "message": map[string]any{
		"role": "user", "content": []any{map[string]any{"type": "tool_result", "content": s}}}}
}

func (c claude) result(exit, lines int) any {
	subtype, text := "success", fmt.Sprintf("done after %d lines", lines)
	if exit != 0 {
		subtype, text = "error_during_execution", fmt.Sprintf("failed with exit code %d", exit)
	}
	return map[string]any{"type": "result", "subtype": subtype, "is_error": exit != 0, "result": text,
		"session_id": c.session, "num_turns": 1, "total_cost_usd": 0.0123,
		"usage": map[string]any{"input_tokens": 100, "output_tokens": lines}}
}

// opencode writes OpenCode's `run --format json` events.
type opencode struct{ session string }

func (o opencode) init() any {
	return map[string]any{"type": "step_start", "sessionID": o.session}
}

func (o opencode) text(s string) any {
	return map[string]any{"type": "text", "sessionID": o.session, "part": map[string]any{"type": "text", "text": s}}
}

func (o opencode) toolResult(s string) any {
	return map[string]any{"type": "tool_use", "sessionID": o.session, "part": map[string]any{
		"type": "tool", "state": map[string]any{"status": "completed", "output": s}}}
}

func (o opencode) result(exit, lines int) any {
	if exit != 0 {
		return map[string]any{"type": "error", "sessionID": o.session, "error": map[string]any{"message": fmt.Sprintf("failed with exit code %d", exit)}}
	}
	return map[string]any{"type": "step_finish", "sessionID": o.session, "part": map[string]any{
		"type": "step-finish", "cost": 0.0123, "tokens": map[string]any{"input": 100, "output": lines}}}
}
