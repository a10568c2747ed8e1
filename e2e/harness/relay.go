package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// Relay is a running clipjob-relay.
type Relay struct {
	*Process
	// APIAddr serves the relay's HTTP API over TLS (cluster CA).
	APIAddr string
	// DataDir is its store; a restarted relay keeps it.
	DataDir string
	// MetricsAddr serves /metrics.
	MetricsAddr string
}

// Counter sums the samples of a Prometheus counter whose line starts with
// prefix and contains every one of match.
func (r *Relay) Counter(prefix string, match ...string) (float64, error) {
	return scrapeCounter(r.MetricsAddr, prefix, match...)
}

// StartRelay builds nothing: it runs bin against c, collecting namespace,
// with a store under c.Dir/name and short drain times for tests.
func StartRelay(ctx context.Context, c *cluster.Cluster, bin, name, namespace string, extra ...string) (*Relay, error) {
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := cluster.FreePorts(3)
	if err != nil {
		return nil, err
	}
	r := &Relay{APIAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), DataDir: filepath.Join(dir, "data"),
		MetricsAddr: fmt.Sprintf("127.0.0.1:%d", ports[2])}
	kp, err := c.CA.Serving("clipjob-relay", "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	if err := kp.WriteTLS(filepath.Join(dir, "certs")); err != nil {
		return nil, err
	}
	probe := fmt.Sprintf("127.0.0.1:%d", ports[1])
	kubeconfig, err := ChartServiceAccountKubeconfig(ctx, c, "clipjob-relay")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--kubeconfig", kubeconfig, "--namespace", namespace, "--data-dir", r.DataDir,
		"--api-address", r.APIAddr, "--cert-dir", filepath.Join(dir, "certs"), "--health-probe-bind-address", probe,
		"--metrics-bind-address", r.MetricsAddr,
		"--drain-idle", "1s", "--zap-log-level", "debug"}, extra...)
	r.Process, err = StartProcess(ctx, filepath.Join(dir, "relay.log"), probe, bin, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}
