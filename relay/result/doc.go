// Package result reads a run's result from its log: the agent CLIs' final
// JSON events (Claude's stream-json, OpenCode's) and the agent container's
// termination give the session to resume, usage, cost, a summary, and
// whether the run was cut short. It has no I/O: feed it lines in order.
package result
