package redact

import (
	"strings"
	"testing"
)

// BenchmarkRedact is redaction on the line loop: most agent lines hold no
// secret; some do.
func BenchmarkRedact(b *testing.B) {
	r, _ := New(nil, []string{"some-configured-secret-value"})
	for _, c := range []struct{ name, line string }{
		{"clean", `{"type":"assistant","message":{"id":"msg_01","content":[{"type":"text","text":"I will run the tests in pkg/foo and then look at the failing assertion in bar_test.go"}]}}`},
		// A tool result with a long unbroken run of letters and digits (a
		// hash, base64, minified code): the fleet benchmark's lines.
		{"long-word", `{"type":"user","message":{"content":[{"type":"tool_result","content":"` + strings.Repeat("a1B2c3D4e5", 30) + `"}]}}`},
		{"secret", `{"type":"user","message":{"content":[{"type":"tool_result","content":"ANTHROPIC_API_KEY=sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAA and more output"}]}}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			line := c.line
			b.ReportAllocs()
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				r.Redact(line)
			}
		})
	}
}
