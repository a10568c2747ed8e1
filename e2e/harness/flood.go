package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
)

// Flood is agent runs whose logs are written to as fast as a busy agent
// writes, three lines per timestamp, until stopped; it remembers every
// line written, to judge a store by (Tally).
type Flood struct {
	in *Install
	// Runs are the runs' ids; Jobs their Jobs, in the same order.
	Runs, Jobs []string
	mu         sync.Mutex
	want       map[string][]string
	err        error
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

// StartFlood starts n runs named name-0 … name-<n-1> and writes to each
// until Stop.
func (in *Install) StartFlood(ctx context.Context, name string, n int) (*Flood, error) {
	f := &Flood{in: in, want: map[string][]string{}, stop: make(chan struct{})}
	logs := make([]*cluster.PodLog, n)
	for i := range n {
		pod, log, err := in.AgentRun(ctx, fmt.Sprintf("%s-%d", name, i))
		if err != nil {
			return nil, err
		}
		f.Runs = append(f.Runs, pod.Labels[contract.LabelRunID])
		f.Jobs = append(f.Jobs, pod.Labels["batch.kubernetes.io/job-name"])
		logs[i] = log
	}
	for i, run := range f.Runs {
		f.wg.Go(func() {
			for n := 0; ; n += 3 {
				select {
				case <-f.stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				ts := time.Now()
				lines := []string{fmt.Sprintf(`{"type":"assistant","run":%q,"n":%d}`, run, n),
					fmt.Sprintf(`{"type":"assistant","run":%q,"n":%d}`, run, n+1), fmt.Sprintf(`{"type":"assistant","run":%q,"n":%d}`, run, n+2)}
				if err := logs[i].WriteAt(ts, lines...); err != nil {
					f.mu.Lock()
					f.err = err
					f.mu.Unlock()
					return
				}
				f.mu.Lock()
				f.want[run] = append(f.want[run], lines...)
				f.mu.Unlock()
			}
		})
	}
	return f, nil
}

// Written is how many lines of run were written so far.
func (f *Flood) Written(run string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.want[run])
}

// Want is every line written to run so far, in order.
func (f *Flood) Want(run string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.want[run]
}

// Stop stops writing, and says whether a write failed; stopped again, it
// says so again.
func (f *Flood) Stop() error {
	f.stopOnce.Do(func() { close(f.stop) })
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Finish ends every run's pod with exit code 0 and waits for its Job to
// finish.
func (f *Flood) Finish(ctx context.Context) error {
	for _, job := range f.Jobs {
		if err := f.in.EndRun(ctx, job, "0"); err != nil {
			return err
		}
	}
	return nil
}

// MirrorFile is where relays mirroring to dir (--mirror-dir) write run's
// lines: the example Paperclip's company, the run's agent.
func (f *Flood) MirrorFile(dir, run string) string {
	return filepath.Join(dir, "run-logs", "acme", "agent-"+run, run+".pod.ndjson")
}

// ReadMirror reads run's mirror file in dir once its done marker, written
// last, is beside it: then the file is whole.
func (f *Flood) ReadMirror(ctx context.Context, dir, run string) ([]string, error) {
	file := f.MirrorFile(dir, run)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(file + ".done")
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("run %s: no done marker beside its mirror file %s: %w", run, file, err)
	}
	b, err := os.ReadFile(file)
	return SplitLines(string(b)), err
}
