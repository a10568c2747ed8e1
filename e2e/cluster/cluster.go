package cluster

import (
	"context"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

//go:embed kwok.yaml
var kwokConfig []byte

//go:embed kwok-logs-crd.yaml
var kwokLogsCRD []byte

// AnnotationExitCode on a running pod makes kwok terminate its containers
// with that exit code ("0" succeeds the pod, anything else fails it).
const AnnotationExitCode = "e2e.clipjob.paperclip.io/exit-code"

// serviceCIDR is where Services get their cluster IPs.
const serviceCIDR = "10.0.0.0/24"

// NodeName is the kwok node pods are scheduled to.
const NodeName = "kwok-node-0"

// Options configure Start.
type Options struct {
	// BinDir holds the binaries. Default $KUBE_BIN_DIR, else the output of
	// hack/kube-binaries.sh (which builds them on first use).
	BinDir string
	// Dir holds certificates, data and logs. Default a new temporary dir,
	// removed by Stop.
	Dir string
	// Log receives progress lines. Default os.Stderr.
	Log io.Writer
	// RealNode adds a real kubelet, kube-proxy and containerd beside kwok
	// (see node.go); Start fails, naming what is missing, on a machine that
	// cannot run one.
	RealNode bool
	// ClusterDNS gives the real node's pods a DNS server answering the
	// cluster's Service names, as a cluster's CoreDNS does (dns.go), so
	// manifests written for a real cluster run as they are. Off, pods
	// resolve with the machine's resolver, and the suite gives them
	// Services' addresses in hostAliases.
	ClusterDNS bool
}

// Cluster is a running local control plane.
type Cluster struct {
	// Dir holds kubeconfig, pki/, logs/ and data.
	Dir string
	// Kubeconfig is an admin kubeconfig file.
	Kubeconfig string
	// Config is the admin REST config.
	Config *rest.Config
	// CA signed every certificate of the cluster; use it for webhook
	// serving certs so the caBundle is CA.CertPEM.
	CA *CA

	// KeepDir keeps Dir after Stop (for a failed run's logs).
	KeepDir bool

	ownDir   bool
	attached bool
	procs    []*process
	node     *realNode
	log      io.Writer
}

type process struct {
	name, bin string
	args      []string
	cmd       *exec.Cmd
	done      chan error
}

// Start brings up etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok with one Ready node (and, with RealNode, a real
// one beside it), and waits until the API server is ready. On error
// everything started is stopped.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.Log == nil {
		o.Log = os.Stderr
	}
	c := &Cluster{Dir: o.Dir, log: o.Log}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "clipjob-cluster-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	bin, err := BinDir(o.BinDir, o.Log)
	if err != nil {
		return nil, err
	}
	if o.RealNode {
		if miss := checkNodeRequirements(bin); len(miss) > 0 {
			return nil, nodeRequirementsError(miss)
		}
		if c.node, err = newRealNode(ctx, c); err != nil {
			return nil, err
		}
		c.node.withDNS = o.ClusterDNS
	}
	if err := c.writePKI(); err != nil {
		return nil, err
	}
	ports, err := FreePorts(6)
	if err != nil {
		return nil, err
	}
	etcdPort, peerPort, apiPort, kcmPort, schedPort, kwokPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	pki := func(f string) string { return filepath.Join(c.Dir, "pki", f) }

	c.logf("starting etcd on 127.0.0.1:%d", etcdPort)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	if err := c.run(bin, "etcd",
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return nil, err
	}

	// Without a real node every client is on loopback. With one, pods reach
	// the API server at the node's address, through the kubernetes Service.
	bind, advertise, reconciler := "127.0.0.1", "127.0.0.1", "none"
	if c.node != nil {
		bind, advertise, reconciler = "0.0.0.0", c.node.ip, "lease"
	}
	c.logf("starting kube-apiserver on https://%s:%d", bind, apiPort)
	if err := c.run(bin, "kube-apiserver",
		"--etcd-servers", etcdURL,
		"--bind-address", bind, "--secure-port", strconv.Itoa(apiPort),
		"--advertise-address", advertise, "--endpoint-reconciler-type", reconciler,
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		"--cert-dir", filepath.Join(c.Dir, "apiserver"),
		"--tls-cert-file", pki("apiserver.crt"), "--tls-private-key-file", pki("apiserver.key"),
		"--client-ca-file", pki("ca.crt"),
		"--kubelet-client-certificate", pki("admin.crt"), "--kubelet-client-key", pki("admin.key"),
		"--kubelet-certificate-authority", pki("ca.crt"),
		"--service-cluster-ip-range", serviceCIDR,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pki("sa.pub"), "--service-account-signing-key-file", pki("sa.key"),
		"--authorization-mode", "Node,RBAC",
		"--enable-priority-and-fairness=false",
		// As real clusters do, so privileged pods reach admission webhooks.
		"--allow-privileged=true",
		"--v", "1"); err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := c.writeKubeconfig(apiPort); err != nil {
		return nil, err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, cs, 90*time.Second); err != nil {
		return nil, err
	}

	common := []string{"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig,
		"--authorization-kubeconfig", c.Kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1", "--v", "1"}
	c.logf("starting kube-controller-manager and kube-scheduler")
	kcmKubeconfig := c.controllerManagerKubeconfig()
	if err := c.run(bin, "kube-controller-manager",
		"--kubeconfig", kcmKubeconfig, "--authentication-kubeconfig", kcmKubeconfig,
		"--authorization-kubeconfig", kcmKubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1", "--v", "1",
		"--secure-port", strconv.Itoa(kcmPort),
		"--service-account-private-key-file", pki("sa.key"), "--root-ca-file", pki("ca.crt"),
		"--use-service-account-credentials=true",
		"--controllers", "*,-nodeipam"); err != nil {
		return nil, err
	}
	if err := c.run(bin, "kube-scheduler", append(common, "--secure-port", strconv.Itoa(schedPort))...); err != nil {
		return nil, err
	}

	if err := c.installLogsCRD(ctx); err != nil {
		return nil, err
	}
	kwokCfg := filepath.Join(c.Dir, "kwok.yaml")
	if err := os.WriteFile(kwokCfg, kwokConfig, 0o644); err != nil {
		return nil, err
	}
	c.logf("starting kwok (node %s)", NodeName)
	if err := c.run(bin, "kwok", "--config", kwokCfg, "--kubeconfig", c.Kubeconfig,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
		"--node-ip", "127.0.0.1", "--node-port", strconv.Itoa(kwokPort), "--cidr", "10.244.0.0/16",
		"--server-address", fmt.Sprintf("127.0.0.1:%d", kwokPort),
		"--tls-cert-file", pki("kwok.crt"), "--tls-private-key-file", pki("kwok.key"),
		"--enable-crds", "Logs"); err != nil {
		return nil, err
	}
	if err := c.createNode(ctx, cs); err != nil {
		return nil, err
	}
	if c.node != nil {
		if err := c.node.start(ctx, bin, apiPort); err != nil {
			return nil, err
		}
	}
	if err := c.exited(); err != nil {
		return nil, err
	}
	c.logf("control plane ready; kubeconfig %s", c.Kubeconfig)
	return c, nil
}

// Stop ends every process (SIGTERM, then SIGKILL after 5s) and removes the
// directory if Start created it.
func (c *Cluster) Stop() {
	if c.node != nil {
		c.node.stop()
		c.node = nil
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].terminate()
	}
	c.procs = nil
	if c.ownDir && !c.KeepDir && os.Getenv("CLIPJOB_KEEP_CLUSTER_DIR") == "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// AttachEnv names the directory of a control plane already running
// (`make controlplane`): the tiers that need no real node attach to it
// instead of starting their own.
const AttachEnv = "CLIPJOB_E2E_CONTROLPLANE"

// Attach is the control plane Start left running in dir (its kubeconfig
// and CA), for a test binary to use without starting one: Stop leaves it
// running, and it has no real node and no component to Restart.
func Attach(dir string) (*Cluster, error) {
	c := &Cluster{Dir: dir, Kubeconfig: filepath.Join(dir, "kubeconfig"), log: os.Stderr, attached: true}
	var err error
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, fmt.Errorf("attaching to the control plane in %s: %w", dir, err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("attaching to the control plane in %s: %w", dir, err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "pki", "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("attaching to the control plane in %s (started by an older suite?): %w", dir, err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("attaching to the control plane in %s: its CA is not PEM", dir)
	}
	c.CA = &CA{CertPEM: certPEM}
	if c.CA.Cert, err = x509.ParseCertificate(cb.Bytes); err != nil {
		return nil, err
	}
	if c.CA.Key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
		return nil, err
	}
	if err := c.waitReady(context.Background(), c.Clientset(), 30*time.Second); err != nil {
		return nil, fmt.Errorf("the control plane in %s does not answer: %w", dir, err)
	}
	return c, nil
}

// Attached reports whether the cluster is one Attach found running.
func (c *Cluster) Attached() bool { return c.attached }

// Clientset returns an admin clientset.
func (c *Cluster) Clientset() *kubernetes.Clientset {
	return kubernetes.NewForConfigOrDie(c.Config)
}

// LogFile is where a component's output goes.
func (c *Cluster) LogFile(component string) string {
	return filepath.Join(c.Dir, "logs", component+".log")
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.log, "cluster: "+format+"\n", args...)
}

func (c *Cluster) run(bin, name string, args ...string) error {
	p := &process{name: name, bin: filepath.Join(bin, name), args: args}
	if err := c.start(p); err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

func (c *Cluster) start(p *process) error {
	if err := os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(c.LogFile(p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = loopbackEnv()
	// Children die with the test process, even when it is killed. Each
	// has a process group of its own: a terminal's Ctrl-C goes to the
	// foreground group, and the components must not get it beside the
	// program that stops them in order (an API server whose etcd died
	// first hangs; containerd gone before its sandboxes were removed
	// leaves their network namespaces and iptables chains behind).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan error, 1)
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	return nil
}

// Restart stops a component (SIGTERM) and starts it again with the same
// arguments, e.g. "kwok" to break every log stream it serves.
func (c *Cluster) Restart(component string) error {
	if c.attached {
		return fmt.Errorf("restarting %s: the control plane is one this test binary attached to (%s), not its own", component, AttachEnv)
	}
	for _, p := range c.procs {
		if p.name != component {
			continue
		}
		p.terminate()
		if component == "kwok" {
			// kwok holds the node's Lease; a new instance would wait for it
			// to expire (40s) before managing the node and its pods again.
			err := c.Clientset().CoordinationV1().Leases("kube-node-lease").Delete(context.Background(), NodeName, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return c.start(p)
	}
	return fmt.Errorf("no component %q", component)
}

// terminate sends SIGTERM and, after 5s, SIGKILL, and waits for the exit.
func (p *process) terminate() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// loopbackEnv is the environment without proxies: every address the
// control plane uses is on loopback, including the webhooks it calls.
func loopbackEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToLower(k) {
		case "http_proxy", "https_proxy", "all_proxy", "no_proxy":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
}

func (c *Cluster) waitReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if err := c.exited(); err != nil {
			return err
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready after %s: %v; see %s", timeout, last, c.LogFile("kube-apiserver"))
}

// installLogsCRD installs kwok's Logs CRD and waits until it is served.
func (c *Cluster) installLogsCRD(ctx context.Context) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(kwokLogsCRD, crd); err != nil {
		return err
	}
	return c.CreateCRDs(ctx, crd)
}

// CreateCRDs creates the CRDs (leaving existing ones alone) and waits until
// each is served.
func (c *Cluster) CreateCRDs(ctx context.Context, crds ...*apiextensionsv1.CustomResourceDefinition) error {
	cs, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		deadline := time.Now().Add(time.Minute)
		for established := false; !established; {
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established after a minute", crd.Name)
			}
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err == nil {
				for _, cond := range got.Status.Conditions {
					established = established || cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue
				}
			}
			if !established {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	return nil
}

// exited returns an error naming the first component that has exited.
func (c *Cluster) exited() error {
	for _, p := range c.procs {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited (%v); see %s", p.name, err, c.LogFile(p.name))
		default:
		}
	}
	return nil
}

func (c *Cluster) createNode(ctx context.Context, cs kubernetes.Interface) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        NodeName,
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
		Labels:      map[string]string{"kubernetes.io/hostname": NodeName, "kubernetes.io/os": "linux", "type": "kwok"},
	}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// Generous: kwok reports the node Ready after its informers sync,
	// which took over a minute with two tiers and other work on 2 cores.
	const readyWithin = 5 * time.Minute
	deadline := time.Now().Add(readyWithin)
	for time.Now().Before(deadline) {
		n, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("node %s not Ready after %s; see %s", NodeName, readyWithin, c.LogFile("kwok"))
}

func (c *Cluster) writePKI() error {
	dir := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := NewCA("clipjob-local-ca")
	if err != nil {
		return err
	}
	c.CA = ca
	caKey, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return err
	}
	// The key too: a test binary attaching to this control plane (Attach)
	// signs its webhooks' serving certificates with it.
	files := map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": pemBlock("EC PRIVATE KEY", caKey)}
	add := func(name string, kp *KeyPair, err error) error {
		if err != nil {
			return err
		}
		files[name+".crt"], files[name+".key"] = kp.CertPEM, kp.KeyPEM
		return nil
	}
	hosts := []string{"127.0.0.1", "localhost", "10.0.0.1",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if c.node != nil {
		hosts = append(hosts, c.node.ip)
	}
	apiserver, err := ca.Serving("kube-apiserver", hosts...)
	if err := add("apiserver", apiserver, err); err != nil {
		return err
	}
	admin, err := ca.Client("clipjob-admin", "system:masters")
	if err := add("admin", admin, err); err != nil {
		return err
	}
	// The controller manager's own identity, as kubeadm and kind give it:
	// its controllers then act as their own ServiceAccounts, so a pod the
	// Job controller creates is known by who created it.
	kcm, err := ca.Client("system:kube-controller-manager")
	if err := add("controller-manager", kcm, err); err != nil {
		return err
	}
	kwok, err := ca.Serving(NodeName, "127.0.0.1", "localhost", NodeName)
	if err := add("kwok", kwok, err); err != nil {
		return err
	}
	priv, pub, err := serviceAccountKeys()
	if err != nil {
		return err
	}
	files["sa.key"], files["sa.pub"] = priv, pub
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) writeKubeconfig(port int) error {
	if err := c.writeKubeconfigFor(port, "admin", c.Kubeconfig); err != nil {
		return err
	}
	return c.writeKubeconfigFor(port, "controller-manager", c.controllerManagerKubeconfig())
}

func (c *Cluster) controllerManagerKubeconfig() string {
	return filepath.Join(c.Dir, "controller-manager.kubeconfig")
}

// writeKubeconfigFor writes a kubeconfig to path for the client
// certificate pki/<user>.crt.
func (c *Cluster) writeKubeconfigFor(port int, user, path string) error {
	pki := filepath.Join(c.Dir, "pki")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{
		Server:               fmt.Sprintf("https://127.0.0.1:%d", port),
		CertificateAuthority: filepath.Join(pki, "ca.crt"),
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificate: filepath.Join(pki, user+".crt"),
		ClientKey:         filepath.Join(pki, user+".key"),
	}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, path)
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1 for servers the
// suite starts. A port is free when asked and taken only when its server
// binds it, so two choices must not meet meanwhile: ports come from below
// the kernel's ephemeral range (where outgoing connections take theirs),
// are never handed out twice by one process, and each process starts in
// a block of its own (by PID) so test binaries running at once rarely
// walk the same ports.
func FreePorts(n int) ([]int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.next == 0 {
		ports.next = portsLow + (os.Getpid()%portBlocks)*((portsHigh-portsLow)/portBlocks)
	}
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > portsHigh-portsLow {
			return nil, fmt.Errorf("no free port left in %d-%d", portsLow, portsHigh)
		}
		p := ports.next
		if ports.next++; ports.next >= portsHigh {
			ports.next = portsLow
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // another process's
		}
		l.Close()
		out = append(out, p)
	}
	return out, nil
}

// The ports FreePorts hands out: below the API server's NodePort range
// (30000-32767) and so below Linux's default ephemeral range
// (32768-60999). A server of the suite on a port in the NodePort range
// would meet the NodePorts the API server allocates, and kube-router lets
// every pod reach its own node's ports in that range whatever the pod's
// NetworkPolicy says: the test API server there was reachable from an
// agent the egress policy confines (about one run in eight failed).
const (
	portsLow, portsHigh = 12000, 30000
	portBlocks          = 16
)

var ports struct {
	sync.Mutex
	next int
}

// BinDir returns the directory holding the control-plane binaries, building
// them with hack/kube-binaries.sh when needed.
func BinDir(dir string, log io.Writer) (string, error) {
	if dir == "" {
		dir = os.Getenv("KUBE_BIN_DIR")
	}
	if dir != "" {
		return dir, nil
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "hack", "kube-binaries.sh")
	cmd := exec.Command("bash", script)
	cmd.Stderr = log
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building the control-plane binaries (%s): %w", script, err)
	}
	dir = strings.TrimSpace(string(out))
	if dir == "" {
		return "", errors.New("kube-binaries.sh printed no directory")
	}
	return dir, nil
}
