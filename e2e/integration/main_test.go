package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// suite is the control plane every test shares and the binaries built
// once for all of them.
var suite struct {
	cluster    *cluster.Cluster
	cs         kubernetes.Interface
	webhookBin string
	relayBin   string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	// The harness's controller-runtime clients log nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := controlPlane(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: cluster:", err)
		return 1
	}
	defer func() {
		c.KeepDir = code != 0 // a failed run keeps its logs
		c.Stop()
	}()
	// Tests in parallel share the admin client's rate limit; the API
	// server's own fairness is what the suite exercises.
	c.Config.QPS, c.Config.Burst = 1000, 2000
	suite.cluster, suite.cs = c, c.Clientset()
	if err := harness.ApplyChartRBAC(ctx, suite.cs); err != nil {
		fmt.Fprintln(os.Stderr, "integration: the chart's RBAC:", err)
		return 1
	}
	for bin, cmd := range map[*string]string{&suite.webhookBin: "clipjob-webhook", &suite.relayBin: "clipjob-relay"} {
		if *bin, err = harness.BuildOnce(c.Dir, cmd); err != nil {
			fmt.Fprintln(os.Stderr, "integration:", err)
			return 1
		}
	}
	code = m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "integration: failed; logs of the cluster and of each test's webhook are in %s\n", c.Dir)
	}
	return code
}

// controlPlane is the one named by CLIPJOB_E2E_CONTROLPLANE (make
// controlplane), else a new one for this run.
func controlPlane(ctx context.Context) (*cluster.Cluster, error) {
	if dir := os.Getenv(cluster.AttachEnv); dir != "" {
		fmt.Fprintf(os.Stderr, "integration: attaching to the control plane in %s (%s)\n", dir, cluster.AttachEnv)
		return cluster.Attach(dir)
	}
	fmt.Fprintln(os.Stderr, "integration: starting a local control plane with kwok (the first run builds Kubernetes from the Go module proxy: several minutes)")
	return cluster.Start(ctx, cluster.Options{})
}

// ctxT is a context for one test, ended with it.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var installs atomic.Int32

// run tells this run's namespaces from an earlier one's on a control plane
// they share (CLIPJOB_E2E_CONTROLPLANE).
var runID = strconv.FormatInt(time.Now().UnixNano()%(36*36*36), 36)

var notDNS = regexp.MustCompile(`[^a-z0-9]+`)

// namespaceFor is a namespace of the test's own, named after it.
func namespaceFor(t *testing.T) string {
	name := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(strings.TrimPrefix(t.Name(), "Test")), "-"), "-")
	n := installs.Add(1)
	prefix := fmt.Sprintf("t%d-", n)
	if suite.cluster.Attached() {
		prefix = fmt.Sprintf("t%s%d-", runID, n)
	}
	if len(prefix+name) > 40 {
		name = strings.TrimRight(name[:40-len(prefix)], "-")
	}
	return prefix + name
}

// newInstall runs t in parallel with the others and gives it clipjob
// installed for a namespace of its own (harness.Install), stopped when t
// ends. o, if given, says what the test needs beyond the defaults.
func newInstall(t *testing.T, o ...harness.InstallOptions) *harness.Install {
	t.Helper()
	t.Parallel()
	return addInstall(t, o...)
}

// addInstall is one more install for a test that has one (newInstall).
func addInstall(t *testing.T, o ...harness.InstallOptions) *harness.Install {
	t.Helper()
	var opts harness.InstallOptions
	if len(o) > 0 {
		opts = o[0]
	}
	opts.Namespace = namespaceFor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	in, err := harness.NewInstall(ctx, suite.cluster, suite.webhookBin, opts)
	if err != nil {
		t.Fatalf("installing clipjob for %s: %v", opts.Namespace, err)
	}
	t.Cleanup(func() { in.Stop(context.Background()) })
	return in
}
