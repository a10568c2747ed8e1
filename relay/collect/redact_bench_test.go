package collect

import "testing"

// BenchmarkRedact is redaction on the line loop: most agent lines hold no
// secret; some do.
func BenchmarkRedact(b *testing.B) {
	r, _ := NewRedactor(nil, []string{"some-configured-secret-value"})
	for _, c := range []struct{ name, line string }{
		{"clean", `{"type":"assistant","message":{"id":"msg_01","content":[{"type":"text","text":"I will run the tests in pkg/foo and then look at the failing assertion in bar_test.go"}]}}`},
		{"secret", `{"type":"user","message":{"content":[{"type":"tool_result","content":"ANTHROPIC_API_KEY=sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAA and more output"}]}}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			line := []byte(c.line)
			b.ReportAllocs()
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				r.Redact(line)
			}
		})
	}
}
