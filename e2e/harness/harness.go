// Package harness installs clipjob into a local cluster (package cluster)
// the way the Helm chart would into a real one: it builds and runs the
// webhook binary with a serving certificate from the cluster's CA, applies
// the example Paperclip install, and registers the webhook configuration.
// The e2e suite and the demo both use it.
package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/internal/manifest"
)

// Root is the repository root.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

var built struct {
	sync.Mutex
	bins map[string]*builtBin
}

type builtBin struct {
	once sync.Once
	path string
	err  error
}

// BuildOnce is Build, once per dir and command for the test binary:
// tests in parallel share one build.
func BuildOnce(dir, command string) (string, error) {
	built.Lock()
	if built.bins == nil {
		built.bins = map[string]*builtBin{}
	}
	b, ok := built.bins[dir+"\x00"+command]
	if !ok {
		b = &builtBin{}
		built.bins[dir+"\x00"+command] = b
	}
	built.Unlock()
	b.once.Do(func() { b.path, b.err = Build(dir, command) })
	return b.path, b.err
}

// Build compiles a command of this module (e.g. "clipjob-webhook") into dir.
func Build(dir, command string) (string, error) {
	out := filepath.Join(dir, command)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+command)
	cmd.Dir = Root()
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w", command, err)
	}
	return out, nil
}

// InstallCluster is the whole local installation, as an operator's: the
// example Paperclip (examples/paperclip.yaml) in its namespace paperclip,
// the clipjob-webhook binary built from this checkout, one replica named
// name running examples/config.yaml with the chart's RBAC, the chart's
// webhook configurations (for every namespace) pointing at it, and the
// chart's claim Lease policy. config is appended to the example config (""
// for none); extra flags go to the webhook. The demo, the benchmarks and
// the real-node tier run on it.
func InstallCluster(ctx context.Context, c *cluster.Cluster, name, config string, extra ...string) (*Install, error) {
	if c.HasRealNode() {
		if err := realPaperclip(ctx, c); err != nil {
			return nil, err
		}
	}
	if err := Apply(ctx, c, "examples/paperclip.yaml"); err != nil {
		return nil, fmt.Errorf("installing the example Paperclip: %w", err)
	}
	if err := waitDefaultServiceAccount(ctx, c.Clientset(), "paperclip"); err != nil {
		return nil, err
	}
	bin, err := Build(c.Dir, "clipjob-webhook")
	if err != nil {
		return nil, err
	}
	in := &Install{Namespace: "paperclip", WebhookBin: bin, c: c, wide: true, flags: extra,
		configFile: filepath.Join(Root(), "examples", "config.yaml"), sharedDir: SharedDir(c)}
	if config != "" {
		data, err := os.ReadFile(in.configFile)
		if err != nil {
			return nil, err
		}
		in.configFile = filepath.Join(c.Dir, name+"-config.yaml")
		if err := os.WriteFile(in.configFile, append(data, config...), 0o644); err != nil {
			return nil, err
		}
	}
	for _, ns := range append(append([]any{}, AgentNamespaces...), TenantNamespaces...) {
		in.Namespaces = append(in.Namespaces, ns.(string))
	}
	if in.Webhook, err = in.StartReplica(ctx, name); err != nil {
		return nil, err
	}
	if err := Register(ctx, c.Clientset(), in.Webhook.Addr, c.CA.CertPEM); err != nil {
		in.Webhook.Stop()
		return nil, fmt.Errorf("registering the webhooks: %w", err)
	}
	if err := ApplyClaimLeasePolicy(ctx, c.Clientset()); err != nil {
		in.Webhook.Stop()
		return nil, err
	}
	return in, nil
}

// SystemNamespace is where clipjob's own ServiceAccounts and its
// leader-election Lease live, as the chart's release namespace would be.
const SystemNamespace = "clipjob-system"

// Webhook is a running clipjob-webhook process.
type Webhook struct {
	*Process
	// Addr is host:port of the TLS admission endpoint.
	Addr string
	// MetricsAddr serves /metrics and /configz.
	MetricsAddr string
	// ConfigFile is the config it watches; rewrite it to reconfigure.
	ConfigFile string
	// CertDir holds tls.crt and tls.key; replace them to rotate.
	CertDir string
}

// StartWebhook runs the binary at bin against c with the config at
// configFile copied into a directory of its own and extra flags, and
// waits until ready.
func StartWebhook(ctx context.Context, c *cluster.Cluster, bin, name, configFile string, extra ...string) (*Webhook, error) {
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	kp, err := c.CA.Serving("clipjob-webhook", "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	if err := kp.WriteTLS(certDir); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(configFile)
	if err != nil {
		return nil, err
	}
	w := &Webhook{ConfigFile: filepath.Join(dir, "config.yaml"), CertDir: certDir}
	if err := os.WriteFile(w.ConfigFile, data, 0o644); err != nil {
		return nil, err
	}
	ports, err := cluster.FreePorts(3)
	if err != nil {
		return nil, err
	}
	w.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	probe := fmt.Sprintf("127.0.0.1:%d", ports[1])
	w.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
	kubeconfig, err := ChartServiceAccountKubeconfig(ctx, c, "clipjob-webhook")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--config", w.ConfigFile, "--config-poll-interval", "200ms",
		"--cert-dir", certDir, "--host", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--health-probe-bind-address", probe, "--metrics-bind-address", w.MetricsAddr,
		"--kubeconfig", kubeconfig, "--leader-election-namespace", SystemNamespace}, extra...)
	w.Process, err = StartProcess(ctx, filepath.Join(dir, "webhook.log"), probe, bin, args...)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Get fetches a path from the webhook's metrics server (/metrics, /configz).
func (w *Webhook) Get(path string) (string, error) { return httpGet(w.MetricsAddr, path) }

// Counter sums the samples of a Prometheus counter whose line starts with
// prefix and contains every one of match.
func (w *Webhook) Counter(prefix string, match ...string) (float64, error) {
	return scrapeCounter(w.MetricsAddr, prefix, match...)
}

func httpGet(addr, path string) (string, error) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func scrapeCounter(addr, prefix string, match ...string) (float64, error) {
	body, err := httpGet(addr, "/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
lines:
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue lines
			}
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// Apply creates every object of a manifest file under examples/ (or an
// absolute path), leaving existing ones alone.
func Apply(ctx context.Context, c *cluster.Cluster, file string) error {
	return ApplyTo(ctx, c.Config, file)
}

// ApplyTo is Apply on the cluster rc reaches.
func ApplyTo(ctx context.Context, rc *rest.Config, file string) error {
	set, err := readExample(file)
	if err != nil {
		return err
	}
	cl, err := client.New(rc, client.Options{})
	if err != nil {
		return err
	}
	var objs []client.Object
	for _, o := range set.Others {
		objs = append(objs, o.(client.Object))
	}
	for _, d := range set.Deployments {
		objs = append(objs, d)
	}
	for _, j := range set.Jobs {
		objs = append(objs, j)
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// readExample reads a manifest file under examples/ (or an absolute path).
func readExample(file string) (*manifest.Set, error) {
	if !filepath.IsAbs(file) {
		file = filepath.Join(Root(), file)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return manifest.Read(f, config.TypeMeta)
}
