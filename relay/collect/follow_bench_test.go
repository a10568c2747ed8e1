package collect

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/redact"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// BenchmarkFollowLines is the relay's line loop end to end: read a
// timestamped stream, decide what is new, redact, batch and commit.
func BenchmarkFollowLines(b *testing.B) {
	const n = 20000
	src := endedLog(n, `{"type":"assistant","n":%d,"text":"token sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAA and more text to make a realistic line"}`)
	redactor, _ := redact.New(nil, []string{"some-configured-secret-value"})
	b.ReportAllocs()
	for b.Loop() {
		s, err := bolt.Open(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		f := newFollower(nil, s, src)
		f.c.Redact = redactor
		f.c.Follow.BatchLines = 256
		f.run(context.Background())
		if r, _ := s.Run("run-1"); r.LastSeq != n {
			b.Fatalf("stored %d of %d", r.LastSeq, n)
		}
		s.Close()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkFollowManyStreams is the relay's own ingest ceiling at fleet
// scale: 200 streams of 1,000 lines each into one store at once, with
// the API server and kubelets out of the picture (the fleet run in
// `make bench` has them in, and they take most of the cores there). On
// PostgreSQL it reports the relay's CPU per line too (the server's is
// its own process's).
func BenchmarkFollowManyStreams(b *testing.B) {
	const streams, n = 200, 1000
	srcs := make([]*fakeLog, streams)
	for i := range srcs {
		srcs[i] = endedLog(n, `{"type":"assistant","n":%d,"text":"`+strings.Repeat("a1B2c3D4e5", 25)+`"}`)
	}
	redactor, _ := redact.New(nil, []string{"some-configured-secret-value"})
	b.Run("bolt", func(b *testing.B) {
		followMany(b, srcs, redactor, func() store.Backend {
			s, err := bolt.Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	})
	b.Run("postgres", func(b *testing.B) {
		srv, err := pgtest.Start()
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Stop()
		followMany(b, srcs, redactor, func() store.Backend {
			s, err := postgres.Open(context.Background(), postgres.Options{ConnString: srv.ConnString("postgres"), Schema: fmt.Sprintf("bench_%d", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	})
}

func followMany(b *testing.B, srcs []*fakeLog, redactor *redact.Redactor, open func() store.Backend) {
	b.ReportAllocs()
	var cpu time.Duration
	lines := 0
	for b.Loop() {
		s := open()
		cpu -= cpuTime()
		var wg sync.WaitGroup
		for i, src := range srcs {
			f := newFollower(nil, s, src)
			f.ref.Run = fmt.Sprintf("run-%d", i)
			f.c.Redact, f.c.slots = redactor, make(chan struct{}, 1)
			f.c.Follow.BatchLines, f.c.Follow.BatchWait = 256, 100*time.Millisecond
			wg.Go(func() { f.run(context.Background()) })
		}
		wg.Wait()
		cpu += cpuTime()
		for i, src := range srcs {
			if r, _ := s.Run(fmt.Sprintf("run-%d", i)); r == nil || r.LastSeq != uint64(len(src.lines)) {
				b.Fatalf("run-%d: stored %v of %d", i, r, len(src.lines))
			}
			lines += len(src.lines)
		}
		s.(io.Closer).Close()
	}
	b.ReportMetric(float64(lines)/b.Elapsed().Seconds(), "lines/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(lines), "cpu-ns/line")
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// endedLog is a container log of n lines, a microsecond apart, each line
// format with its number, that has ended.
func endedLog(n int, format string) *fakeLog {
	src := newFakeLog()
	for i := range n {
		src.write(t0.Add(time.Duration(i)*time.Microsecond), fmt.Sprintf(format, i))
	}
	src.ended = true
	return src
}
