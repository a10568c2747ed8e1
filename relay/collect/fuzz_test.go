package collect

import (
	"testing"

	"github.com/paperclipai/clipjob/relay/result"
)

// FuzzLineDecoding: whatever a container prints, splitting the timestamp
// and parsing the result never panic.
func FuzzLineDecoding(f *testing.F) {
	f.Add([]byte(`2026-11-21T10:00:05.123456789Z {"type":"result","usage":{"input_tokens":1},"total_cost_usd":0.1}`))
	f.Add([]byte(`2026-11-21T10:00:05Z {"type":"step_finish","sessionID":"s","part":{"type":"step-finish","tokens":{"input":1},"cost":1}}`))
	f.Add([]byte(`no timestamp at all`))
	f.Fuzz(func(t *testing.T, line []byte) {
		var p result.Parser
		if _, msg, err := splitTimestamp(string(line)); err == nil {
			p.Feed([]byte(msg))
		}
		p.Feed(line)
		_ = p.Result(&result.Termination{ExitCode: 137, Reason: "OOMKilled"})
	})
}
