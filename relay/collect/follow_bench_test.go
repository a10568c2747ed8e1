package collect

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// BenchmarkFollowLines is the relay's line loop end to end: read a
// timestamped stream, decide what is new, redact, batch and commit.
func BenchmarkFollowLines(b *testing.B) {
	const n = 20000
	src := newFakeLog()
	for i := 0; i < n; i++ {
		src.write(t0.Add(time.Duration(i)*time.Microsecond), fmt.Sprintf(`{"type":"assistant","n":%d,"text":"token sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAA and more text to make a realistic line"}`, i))
	}
	src.ended = true
	redact, _ := NewRedactor(nil, []string{"some-configured-secret-value"})
	b.ReportAllocs()
	for b.Loop() {
		s, err := store.OpenStore(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		f := newFollower(nil, s, src)
		f.redact = redact
		f.opts.BatchLines = 256
		f.run(context.Background())
		if r, _ := s.Run("run-1"); r.LastSeq != n {
			b.Fatalf("stored %d of %d", r.LastSeq, n)
		}
		s.Close()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "lines/s")
}
