package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkStoreAppend commits batches of 64 stream-json-sized lines with
// their cursor, one transaction (and fsync) per batch.
func BenchmarkStoreAppend(b *testing.B) {
	s, err := OpenStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	line := `{"type":"assistant","message":{"id":"msg_01","content":[{"type":"text","text":"` + strings.Repeat("x", 300) + `"}]}}`
	batch := make([]Line, 64)
	b.ReportAllocs()
	b.SetBytes(int64(len(line) * len(batch)))
	i := 0
	for b.Loop() {
		for j := range batch {
			batch[j] = Line{TS: time.Unix(0, int64(i*64+j)), Container: "agent", Line: line}
		}
		if _, err := s.Append("run-1", "stream", Cursor{TS: int64(i*64 + 63), Count: 1}, batch, time.Now()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

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
		s, err := OpenStore(b.TempDir())
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
