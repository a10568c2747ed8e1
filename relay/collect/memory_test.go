package collect

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// An open stream that has gone quiet holds little: its read buffer and
// its goroutines, not the lines of its last batch, nor the room it took
// for a long line. The relay follows hundreds of streams, most of them
// quiet at any moment; this held 198 KB a stream (a 64 KiB read buffer,
// the last batch's lines) when it was written.
func TestQuietStreamsHoldLittleMemory(t *testing.T) {
	const streams, lines = 100, 600
	const perStream = 32 << 10
	s, _ := storetest.Open(t)
	srcs := make([]*fakeLog, streams)
	for i := range srcs {
		srcs[i] = newFakeLog()
		for j := range lines {
			text := strings.Repeat("x", 280)
			if j == lines/2 {
				text = strings.Repeat("y", 200<<10) // a long line, kept whole
			}
			srcs[i].write(t0.Add(time.Duration(j)*time.Microsecond), fmt.Sprintf(`{"n":%d,"text":"%s"}`, j, text))
		}
	}
	before := heapInUse()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, src := range srcs {
		f := newFollower(t, s, src)
		f.ref.Run = fmt.Sprintf("run-%d", i)
		f.slots = make(chan struct{}, 1)
		f.opts = DefaultFollowOptions()
		f.opts.DrainIdle = time.Hour
		wg.Go(func() { f.run(ctx) })
	}
	for i := range srcs {
		run := fmt.Sprintf("run-%d", i)
		waitFor(t, func() bool {
			r, _ := s.Run(run)
			return r != nil && r.LastSeq == lines
		}, run+" not stored")
	}
	got := (heapInUse() - before) / streams
	t.Logf("a quiet stream holds %d bytes of heap", got)
	if got > perStream {
		t.Errorf("a quiet stream holds %d bytes of heap; want at most %d", got, perStream)
	}
}

// heapInUse is the heap in use after a collection, with the pools'
// spare objects (held until the second collection) gone.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}
