package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/replicas"
	"github.com/paperclipai/clipjob/relay/store"
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
	// CA signed its serving certificate; Get trusts it.
	CA *cluster.CA
}

// Counter sums the samples of a Prometheus counter whose line starts with
// prefix and contains every one of match.
func (r *Relay) Counter(prefix string, match ...string) (float64, error) {
	return scrapeCounter(r.MetricsAddr, prefix, match...)
}

// RefusedCommits is how many commits r's store refused because another
// writer had moved the stream's cursor (its debug log says so).
func (r *Relay) RefusedCommits() (int, error) {
	log, err := os.ReadFile(r.Log)
	return strings.Count(string(log), "another writer stored lines"), err
}

// WaitCollecting waits until each of rs collects its share of the runs,
// seeing live replicas (itself included).
func WaitCollecting(ctx context.Context, live int, rs ...*Relay) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		for _, r := range rs {
			n, err := r.Counter("clipjob_relay_replicas ")
			c, err2 := r.Counter("clipjob_relay_replica_collecting ")
			if err != nil || err2 != nil || int(n) != live || c != 1 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%d replicas do not all collect, each seeing %d live: %w", len(rs), live, err)
	}
	return nil
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
		MetricsAddr: fmt.Sprintf("127.0.0.1:%d", ports[2]), CA: c.CA}
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

// installRelay is an install's relay and the tokens to read it with.
type installRelay struct {
	r                *Relay
	reader, stranger string
}

// Relay is the install's relay, started on first use for its namespace
// with its mirror in SharedDir and stopped with the install, and the
// tokens for the relay's audience of a ServiceAccount allowed to read pod
// logs in its namespace (as the Paperclip server is) and of one that is
// not.
func (in *Install) Relay(t testing.TB) (r *Relay, reader, stranger string) {
	t.Helper()
	r, reader, stranger, err := in.SharedRelay()
	if err != nil {
		t.Fatal(err)
	}
	return r, reader, stranger
}

// SharedRelay is Relay outside a test.
func (in *Install) SharedRelay() (r *Relay, reader, stranger string, err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.relay == nil {
		ir, err := in.startRelay()
		if err != nil {
			return nil, "", "", err
		}
		in.relay = ir
	}
	return in.relay.r, in.relay.reader, in.relay.stranger, nil
}

func (in *Install) startRelay() (*installRelay, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := BuildOnce(in.c.Dir, "clipjob-relay")
	if err != nil {
		return nil, err
	}
	r, err := StartRelay(ctx, in.c, bin, in.name("relay"), in.Namespace, "--mirror-dir", in.SharedDir())
	if err != nil {
		return nil, err
	}
	ir := &installRelay{r: r}
	if ir.reader, err = ServiceAccountToken(ctx, in.c, in.Namespace, "paperclip-server", LogReaderRules, relay.DefaultTokenAudience); err != nil {
		r.Stop()
		return nil, err
	}
	if ir.stranger, err = ServiceAccountToken(ctx, in.c, in.Namespace, "stranger", nil, relay.DefaultTokenAudience); err != nil {
		r.Stop()
		return nil, err
	}
	return ir, nil
}

// ReplicaIDs reads the ids of the relays of schema on the PostgreSQL at
// conn, by their names (--replica-id): of a name started again, its
// newest.
func ReplicaIDs(ctx context.Context, conn, schema string) (map[string]string, error) {
	db, err := pgx.Connect(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer db.Close(context.WithoutCancel(ctx))
	ms, err := ReadReplicas(ctx, db, schema)
	if err != nil {
		return nil, fmt.Errorf("the relays' table of replicas in schema %s: %w", schema, err)
	}
	ids := map[string]string{}
	for _, m := range ms {
		ids[m.Name] = m.ID
	}
	return ids, nil
}

// ReadReplicas reads the rows of the relays of schema through q, newest
// renewal last, to work out which replica collects a run (relay/replicas
// picks over the live ids).
func ReadReplicas(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string) ([]store.Replica, error) {
	rows, err := q.Query(ctx, `SELECT id, name FROM `+pgx.Identifier{schema}.Sanitize()+`.replicas ORDER BY renewed_at`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[store.Replica])
}

// RunCollector names the relay of schema on the PostgreSQL at conn that
// collects run while the relays named live are the live ones: rendezvous
// hashing of the run over their ids, as the relays divide the runs.
func RunCollector(ctx context.Context, conn, schema, run string, live []string) (string, error) {
	ids, err := ReplicaIDs(ctx, conn, schema)
	if err != nil {
		return "", err
	}
	names := map[string]string{}
	var liveIDs []string
	for _, name := range live {
		id, ok := ids[name]
		if !ok {
			return "", fmt.Errorf("no relay named %s in the table of replicas of schema %s: %v", name, schema, ids)
		}
		liveIDs = append(liveIDs, id)
		names[id] = name
	}
	return names[replicas.Pick(liveIDs, run)], nil
}
