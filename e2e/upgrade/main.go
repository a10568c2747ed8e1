// Command upgrade is `make relay-upgrade`: a rolling upgrade of the relay
// from the last one that divided the runs through Kubernetes Leases
// (oldCommit, built from the repository's own history and cached) to this
// checkout's, which divides them through a table of replicas in
// PostgreSQL, under a flood of agent runs, on the integration tier's
// control plane (kwok).
//
// Three old relays share one PostgreSQL store with the rights the old
// chart gave them (its Lease Role and the policy confining their Lease
// writes) while several runs write as fast as a busy agent. Then, one by
// one, a new relay starts beside them and an old one is stopped
// (SIGTERM); once the first new one is ready the old chart's Lease
// objects are deleted, as `helm upgrade` to the new chart deletes them.
// The old replicas still running must then stop collecting (they can no
// longer renew their Leases). Once only new relays remain, an old relay
// started on the migrated store must refuse it. Every line written must
// be stored once, in order, read through each new replica's API and in
// the mirror files: the program prints the figures and exits non-zero on
// any loss, duplicate or misbehaving old replica.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

type options struct {
	repo, old string
	runs      int
	// step is how many lines more every run must have stored, through
	// the newest relay, before each step of the roll goes on.
	step int
	// leasesFirst deletes the old chart's Lease objects before the first
	// new relay starts, not once it is ready.
	leasesFirst bool
}

func main() {
	var o options
	flag.StringVar(&o.repo, "repo", harness.Root(), "the git repository whose history holds the old relay")
	flag.StringVar(&o.old, "old", oldCommit, "the commit of the Lease-based relay to upgrade from")
	flag.IntVar(&o.runs, "runs", 6, "agent runs flooding lines through the upgrade")
	flag.IntVar(&o.step, "step", 150, "lines more every run must have stored before each step of the roll")
	flag.BoolVar(&o.leasesFirst, "leases-gone-first", false, "delete the old chart's Lease objects before the first new relay starts, as a `helm upgrade` whose new pods are slow to start does, not once it is ready")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "relay-upgrade:", err)
		os.Exit(1)
	}
}

// The store's schema, and the old chart's names for the relays' Leases.
const (
	schema     = "clipjob_upgrade"
	leaseGroup = "clipjob-relay"
)

// upgrade is the run's state: its control plane, store and relays.
type upgrade struct {
	c       *cluster.Cluster
	in      *harness.Install
	pg      *pgtest.Server
	old     *oldRelay
	newBin  string
	mirror  string
	token   string
	started time.Time
}

func (u *upgrade) logf(format string, args ...any) {
	fmt.Printf("%6.1fs "+format+"\n", append([]any{time.Since(u.started).Seconds()}, args...)...)
}

func run(ctx context.Context, o options) (err error) {
	u := &upgrade{started: time.Now()}
	if u.old, err = buildOld(ctx, o.repo, o.old); err != nil {
		return err
	}
	u.logf("the Lease-based relay of %s: %s", u.old.commit[:12], u.old.bin)
	if u.c, err = controlPlane(ctx); err != nil {
		return err
	}
	defer func() {
		u.c.KeepDir = err != nil // a failed run keeps its logs
		if err != nil {
			fmt.Fprintf(os.Stderr, "relay-upgrade: the relays' and the cluster's logs are in %s\n", u.c.Dir)
		}
		u.c.Stop()
	}()
	if err := harness.ApplyChartRBAC(ctx, u.c.Clientset()); err != nil {
		return err
	}
	webhook, err := harness.Build(u.c.Dir, "clipjob-webhook")
	if err != nil {
		return err
	}
	if u.newBin, err = harness.Build(u.c.Dir, "clipjob-relay"); err != nil {
		return err
	}
	ns := "upgrade-" + strconv.FormatInt(time.Now().Unix()%(36*36*36), 36)
	if u.in, err = harness.NewInstall(ctx, u.c, webhook, harness.InstallOptions{Namespace: ns}); err != nil {
		return err
	}
	defer u.in.Stop(context.WithoutCancel(ctx))
	if u.pg, err = pgtest.Start(); err != nil {
		return err
	}
	defer u.pg.Stop()
	if u.token, err = harness.ServiceAccountToken(ctx, u.c, ns, "paperclip-server", harness.LogReaderRules, relay.DefaultTokenAudience); err != nil {
		return err
	}
	u.mirror = filepath.Join(u.c.Dir, "upgrade-mirror")
	return u.roll(ctx, o)
}

// controlPlane is the one named by CLIPJOB_E2E_CONTROLPLANE (make
// controlplane), else a new one.
func controlPlane(ctx context.Context) (*cluster.Cluster, error) {
	if dir := os.Getenv(cluster.AttachEnv); dir != "" {
		return cluster.Attach(dir)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	return cluster.Start(ctx, cluster.Options{})
}

// chartValues are the install's values: the relays on PostgreSQL, three.
var chartValues = map[string]any{"relay": map[string]any{"store": "postgres", "replicas": 3,
	"postgres": map[string]any{"url": "postgres://db/clipjob"}}}

func (u *upgrade) roll(ctx context.Context, o options) error {
	leases, err := leaseObjects(filepath.Join(u.old.src, "charts", "clipjob"), harness.Release, chartValues)
	if err != nil {
		return err
	}
	if len(leases) == 0 {
		return errors.New("the old chart grants the relays nothing the current one does not: no Lease Role to take away")
	}
	cl, err := client.New(u.c.Config, client.Options{})
	if err != nil {
		return err
	}
	// What an earlier run on an attached control plane left goes first.
	if _, err := u.deleteLeftLeases(ctx); err != nil {
		return err
	}
	var names []string
	for _, obj := range leases {
		if err := cl.Create(ctx, obj.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the old chart's %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		names = append(names, obj.GetKind()+" "+obj.GetName())
	}
	defer func() {
		for _, obj := range leases {
			_ = cl.Delete(context.WithoutCancel(ctx), obj.DeepCopy())
		}
	}()
	u.logf("the old chart's Lease objects applied: %s", strings.Join(names, ", "))

	olds := make([]*harness.Relay, 3)
	for i := range olds {
		if olds[i], err = u.startOld(ctx, fmt.Sprintf("old-%d", i)); err != nil {
			return err
		}
	}
	if err := harness.WaitCollecting(ctx, 3, olds...); err != nil {
		return err
	}
	u.logf("3 Lease-based relays collect, each seeing 3 live")
	f, err := u.in.StartFlood(ctx, "upgrade", o.runs)
	if err != nil {
		return err
	}
	defer f.Stop() // a run that failed before the flood ended
	if err := waitStored(ctx, olds[0], u.token, f, o.step, "before the upgrade"); err != nil {
		return err
	}
	u.logf("%d runs flood; each has %d lines stored or more", o.runs, o.step)

	// The roll.
	rollStart := time.Now()
	storedBefore, err := storedLines(olds[0], u.token, f.Runs)
	if err != nil {
		return err
	}
	var hostile []string
	var mixed mixedPeriod
	// leasesGone deletes the old chart's Lease objects, as `helm upgrade`
	// to the new chart does, and checks that the old replicas still
	// running stop collecting.
	leasesGone := func(first *harness.Relay) error {
		if err := mixed.start(olds, first); err != nil {
			return err
		}
		for _, obj := range leases {
			if err := cl.Delete(ctx, obj.DeepCopy()); err != nil {
				return fmt.Errorf("deleting the old chart's %s %s: %w", obj.GetKind(), obj.GetName(), err)
			}
		}
		deleted := time.Now()
		u.logf("the old chart's Lease objects deleted (helm upgrade)")
		stopped, err := stopCollecting(ctx, olds)
		if err != nil {
			return err
		}
		if err := mixed.end(olds, first, slices.MaxFunc(stopped, time.Time.Compare)); err != nil {
			return err
		}
		if err := storeNothing(olds); err != nil {
			return err
		}
		for j, at := range stopped {
			hostile = append(hostile, fmt.Sprintf("old relay %d, left running without its Lease Role: stopped collecting and turned unready %s after it went, stored no line more",
				j, at.Sub(deleted).Round(100*time.Millisecond)))
			u.logf("%s", hostile[len(hostile)-1])
		}
		return nil
	}
	if o.leasesFirst {
		if err := leasesGone(nil); err != nil {
			return err
		}
	}
	news := make([]*harness.Relay, 3)
	for i := range news {
		if news[i], err = u.startNew(ctx, fmt.Sprintf("new-%d", i)); err != nil {
			return err
		}
		if err := harness.WaitCollecting(ctx, i+1, news[:i+1]...); err != nil {
			return err
		}
		u.logf("new relay %d ready and collecting, %d new live", i, i+1)
		if i == 0 && !o.leasesFirst {
			if err := leasesGone(news[0]); err != nil {
				return err
			}
		}
		if err := waitStored(ctx, news[i], u.token, f, o.step, fmt.Sprintf("with new relay %d beside the old", i)); err != nil {
			return err
		}
		olds[i].Stop()
		u.logf("old relay %d stopped (SIGTERM)", i)
	}
	roll := time.Since(rollStart)
	storedAfter, err := storedLines(news[2], u.token, f.Runs)
	if err != nil {
		return err
	}
	if err := harness.WaitCollecting(ctx, 3, news...); err != nil {
		return err
	}
	if err := waitStored(ctx, news[2], u.token, f, o.step, "with the new relays alone"); err != nil {
		return err
	}

	// An old relay started on the migrated store must refuse it.
	refused, err := u.oldRefusesTheNewSchema(ctx)
	if err != nil {
		return err
	}
	hostile = append(hostile, refused)
	u.logf("%s", refused)

	// The old relays' Leases outlive them: they could delete them only
	// with the Role that went. Read by nobody now; deleted, as the
	// operator may.
	left, err := u.deleteLeftLeases(ctx)
	if err != nil {
		return err
	}
	hostile = append(hostile, fmt.Sprintf("Leases the old relays left in %s (their Role went before they could delete them): %s", harness.Release.Namespace, strings.Join(left, ", ")))

	if err := f.Stop(); err != nil {
		return err
	}
	if err := f.Finish(ctx); err != nil {
		return err
	}
	j := &judge{}
	total := 0
	for _, run := range f.Runs {
		want := f.Want(run)
		total += len(want)
		if _, err := news[0].AwaitRun(ctx, u.token, run, func(x *store.Run) bool { return x.Done }); err != nil {
			return err
		}
		for i, r := range news {
			got, err := r.LogLines(u.token, run)
			if err != nil {
				return err
			}
			j.add(fmt.Sprintf("new relay %d", i), run, harness.Tally(got, want))
		}
		mirror, err := f.ReadMirror(ctx, u.mirror, run)
		if err != nil {
			return err
		}
		j.add("mirror files", run, harness.Tally(mirror, want))
	}
	fmt.Printf("\nrelay upgrade from %s (Leases) to this checkout (table of replicas), %s\n", u.old.commit[:12], time.Now().UTC().Format("2006-01-02"))
	fmt.Printf("  %d runs, %d lines; the roll took %s, %d lines stored while old and new relays ran together\n",
		len(f.Runs), total, roll.Round(100*time.Millisecond), storedAfter-storedBefore)
	fmt.Printf("  %s\n", mixed)
	fmt.Printf("  commits refused by the cursor check (another writer stored lines first): old relays %d, new relays %d\n",
		refusals(olds...), refusals(news...))
	for _, h := range hostile {
		fmt.Printf("  %s\n", h)
	}
	j.print(os.Stdout)
	for _, r := range news {
		r.Stop()
	}
	if !j.ok() {
		return errors.New("a line was lost or stored twice")
	}
	return nil
}

// startOld starts an old relay as the old chart ran it: its Leases in the
// release namespace, in the chart's group.
func (u *upgrade) startOld(ctx context.Context, name string) (*harness.Relay, error) {
	return u.start(ctx, u.old.bin, name, "--lease-namespace", harness.Release.Namespace, "--lease-group", leaseGroup)
}

// startNew starts a relay of this checkout as the current chart runs it.
func (u *upgrade) startNew(ctx context.Context, name string) (*harness.Relay, error) {
	return u.start(ctx, u.newBin, name)
}

func (u *upgrade) start(ctx context.Context, bin, name string, extra ...string) (*harness.Relay, error) {
	url := filepath.Join(u.c.Dir, "upgrade-"+name+".pgurl")
	if err := os.WriteFile(url, []byte(u.pg.ConnString("postgres")), 0o600); err != nil {
		return nil, err
	}
	return harness.StartRelay(ctx, u.c, bin, "upgrade-"+name, u.in.Namespace, append([]string{"--store", "postgres", "--postgres-url-file", url,
		"--postgres-schema", schema, "--replica-id", name, "--mirror-dir", u.mirror}, extra...)...)
}

// deleteLeftLeases deletes the old relays' Leases in the release
// namespace and names them.
func (u *upgrade) deleteLeftLeases(ctx context.Context) ([]string, error) {
	leases := u.c.Clientset().CoordinationV1().Leases(harness.Release.Namespace)
	sel := metav1.ListOptions{LabelSelector: "clipjob.paperclip.io/relay-group=" + leaseGroup}
	list, err := leases.List(ctx, sel)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range list.Items {
		names = append(names, l.Name)
	}
	if len(names) > 0 {
		if err := leases.DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// oldRefusesTheNewSchema starts an old relay on the store the new ones
// migrated: it must exit, saying the schema is newer than it knows.
func (u *upgrade) oldRefusesTheNewSchema(ctx context.Context) (string, error) {
	r, err := u.startOld(ctx, "old-late")
	if err == nil {
		r.Stop()
		return "", errors.New("an old relay started on the migrated store and became ready: it should refuse the newer schema")
	}
	log, rerr := os.ReadFile(filepath.Join(u.c.Dir, "upgrade-old-late", "relay.log"))
	if rerr != nil {
		return "", rerr
	}
	if why := logSays(log, "the schema is at migration"); why != "" {
		return "an old relay started after the upgrade exited: " + why, nil
	}
	return "", fmt.Errorf("an old relay started on the migrated store failed (%v) without saying the schema is newer: its log is %s", err,
		filepath.Join(u.c.Dir, "upgrade-old-late", "relay.log"))
}

// stopCollecting waits until each of rs says it collects nothing and is
// unready, and returns when each said so.
func stopCollecting(ctx context.Context, rs []*harness.Relay) ([]time.Time, error) {
	at := make([]time.Time, len(rs))
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		for i, r := range rs {
			if !at[i].IsZero() {
				continue
			}
			if c, err := r.Counter("clipjob_relay_replica_collecting "); err != nil || c != 0 {
				continue
			}
			if resp, err := http.Get("http://" + r.ProbeAddr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					at[i] = time.Now()
				}
			}
		}
		return !slices.ContainsFunc(at, time.Time.IsZero), nil
	})
	if err != nil {
		return nil, fmt.Errorf("old relays still collecting, or ready, without their Lease Role (stopped at %v): %w", at, err)
	}
	return at, nil
}

// storeNothing checks that rs, which said they collect nothing, store no
// line more.
func storeNothing(rs []*harness.Relay) error {
	// What was in flight when they stopped may still commit; then nothing.
	time.Sleep(2 * time.Second)
	before, err := linesStored(rs...)
	if err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	after, err := linesStored(rs...)
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("old relays said they collect nothing, and stored %.0f lines in the 5 s after", after-before)
	}
	return nil
}

// linesStored is how many lines rs stored, by their metrics.
func linesStored(rs ...*harness.Relay) (float64, error) {
	var sum float64
	for _, r := range rs {
		n, err := r.Counter("clipjob_relay_lines_stored_total")
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// mixedPeriod is from the first new relay collecting beside the old ones
// until the last old one stopped collecting, and what each kind stored
// in it.
type mixedPeriod struct {
	from, to             time.Time
	old0, new0           float64
	oldStored, newStored float64
	// alone: the Lease objects went before any new relay collected.
	alone bool
}

// start begins the period, once first (nil: none yet) collects.
func (m *mixedPeriod) start(olds []*harness.Relay, first *harness.Relay) error {
	m.from, m.alone = time.Now(), first == nil
	var err error
	if m.old0, err = linesStored(olds...); err != nil || first == nil {
		return err
	}
	m.new0, err = linesStored(first)
	return err
}

// end ends it, the last old relay having stopped collecting at to.
func (m *mixedPeriod) end(olds []*harness.Relay, first *harness.Relay, to time.Time) error {
	m.to = to
	n, err := linesStored(olds...)
	if err != nil {
		return err
	}
	m.oldStored = n - m.old0
	if first != nil {
		if n, err = linesStored(first); err != nil {
			return err
		}
		m.newStored = n - m.new0
	}
	return nil
}

func (m mixedPeriod) String() string {
	if m.alone {
		return fmt.Sprintf("the Lease objects went before any new relay collected: the old relays stored %.0f lines until they stopped collecting", m.oldStored)
	}
	return fmt.Sprintf("old and new relays collecting together (the first new one ready until the old ones stopped collecting, %s): old relays stored %.0f lines, the new one %.0f",
		m.to.Sub(m.from).Round(100*time.Millisecond), m.oldStored, m.newStored)
}

// waitStored waits until every run of f has n lines more stored, asked
// through r, than were written to it when called.
func waitStored(ctx context.Context, r *harness.Relay, token string, f *harness.Flood, n int, why string) error {
	for _, run := range f.Runs {
		want := f.Written(run) + n
		if _, err := r.AwaitRun(ctx, token, run, func(x *store.Run) bool { return int(x.LastSeq) >= want }); err != nil {
			return fmt.Errorf("waiting for %d lines stored %s: %w", want, why, err)
		}
	}
	return nil
}

// storedLines is how many lines of runs the store holds, asked through r.
func storedLines(r *harness.Relay, token string, runs []string) (int, error) {
	total := 0
	for _, run := range runs {
		x, _, err := r.RunRecord(token, run)
		if err != nil {
			return 0, err
		}
		total += int(x.LastSeq)
	}
	return total, nil
}

// refusals is how many commits of rs their store refused
// (RefusedCommits).
func refusals(rs ...*harness.Relay) int {
	total := 0
	for _, r := range rs {
		n, _ := r.RefusedCommits()
		total += n
	}
	return total
}

// logSays is the first field of a JSON log line of log that holds text,
// else the first line that does, else "".
func logSays(log []byte, text string) string {
	for l := range strings.SplitSeq(string(log), "\n") {
		if !strings.Contains(l, text) {
			continue
		}
		var fields map[string]any
		if json.Unmarshal([]byte(l), &fields) == nil {
			for _, k := range slices.Sorted(maps.Keys(fields)) {
				if v, ok := fields[k].(string); ok && strings.Contains(v, text) && k != "stacktrace" {
					return v
				}
			}
		}
		return l
	}
	return ""
}
