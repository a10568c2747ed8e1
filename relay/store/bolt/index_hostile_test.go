package bolt

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A hostile agent controls its run's result: every OpenCode error event it
// prints is appended to Result.Errors (and the last one is Text and Raw
// too), each up to --max-line-bytes (1 MiB). Before the index, a finished
// run's record lived in the bbolt file (mmap, page cache) and was decoded
// only when asked for. The index decodes every record into the Go heap at
// commit and at Open, and keeps it for the run's whole retention
// (168h by default): a few hundred such runs exceed the relay's 1 GiB
// limit, and because Open loads every record before retention ever
// runs, the relay then OOMs at every start (a crash loop retention cannot
// end).
func TestHostileResultsArePinnedInTheHeapByTheIndex(t *testing.T) {
	const (
		runs        = 24
		errorsEach  = 4
		lineBytes   = 1 << 20 // the default --max-line-bytes
		maxResident = 32 << 20
	)
	// What a hostile agent prints: OpenCode error events, each one line.
	big := strings.Repeat("x", lineBytes-100)
	var p result.Parser
	for range errorsEach {
		p.Feed([]byte(`{"type":"error","sessionID":"s","error":"` + big + `"}`))
	}
	res := p.Result(&result.Termination{ExitCode: 1})

	dir := t.TempDir()
	before := heapAfterGC()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range runs {
		if _, err := s.UpdateRun(fmt.Sprintf("run-%02d", i), func(r *store.Run) {
			r.Namespace, r.Agent, r.Phase, r.Done = "tenant", "a", "Failed", true
			r.Result = res
		}); err != nil {
			t.Fatal(err)
		}
	}
	res = nil
	p = result.Parser{}
	resident := int64(heapAfterGC()) - int64(before)
	s.Close()
	afterClose := int64(heapAfterGC()) - int64(before)

	reopened, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	atOpen := int64(heapAfterGC()) - int64(before)
	t.Logf("%d finished runs: heap held by an open store %d MiB, after Close %d MiB, after Open (before any retention) %d MiB",
		runs, resident>>20, afterClose>>20, atOpen>>20)
	if resident > maxResident || atOpen > maxResident {
		t.Errorf("finished runs' records pin %d MiB (%d MiB after a restart) of heap for their retention: %.1f MiB per hostile run; the relay's 1 GiB limit falls to ~%d such runs",
			resident>>20, atOpen>>20, float64(resident)/float64(runs)/(1<<20), (1<<30)/(max(resident, 1)/runs))
	}
}
