package bolt

import (
	"strings"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// BenchmarkStoreAppend commits batches of 64 stream-json-sized lines with
// their cursor, one transaction (and fsync) per batch.
func BenchmarkStoreAppend(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	line := `{"type":"assistant","message":{"id":"msg_01","content":[{"type":"text","text":"` + strings.Repeat("x", 300) + `"}]}}`
	batch := make([]store.Line, 64)
	b.ReportAllocs()
	b.SetBytes(int64(len(line) * len(batch)))
	i := 0
	for b.Loop() {
		for j := range batch {
			batch[j] = store.Line{TS: time.Unix(0, int64(i*64+j)), Container: "agent", Line: line}
		}
		if _, err := s.Append("run-1", "stream", store.Cursor{TS: int64(i*64 + 63), Count: 1}, batch, time.Now()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
