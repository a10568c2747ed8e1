package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// RealNodeName is the node a real kubelet registers beside kwok's.
const RealNodeName = "clipjob-node"

// RealNodeTaint keeps pods off the real node unless they tolerate it: the
// suite's kwok tests submit images no registry has, which only kwok can
// "run". A test that wants real containers tolerates the taint and selects
// the node (RealNodePlacement).
const RealNodeTaint = "e2e.clipjob.paperclip.io/real-node"

// NodeEnv names the one variable that runs the suite without a real node:
// CLIPJOB_E2E_NODE=kwok. Anything else (or nothing) asks for the real node,
// and a machine that cannot run one fails with what is missing.
const NodeEnv = "CLIPJOB_E2E_NODE"

// WantRealNode reads NodeEnv.
func WantRealNode() bool { return os.Getenv(NodeEnv) != "kwok" }

// Pod networking of the real node. The node's own address is on a link of
// its own, in TEST-NET-2 (the kubelet refuses a loopback node IP;
// the machine's interfaces are never touched).
const (
	nodeNet    = "198.51.100."
	podNetBase = 200 // pod CIDRs 10.200.0.0/16 .. 10.249.0.0/16
)

// realNode is a kubelet, kube-proxy and containerd of this cluster.
type realNode struct {
	dir          string // <cluster>/node
	ip           string
	link, bridge string
	podCIDR      string
	cgroupRoot   string
	socket       string
	kubeletPort  int
	sysctlsSaved map[string]string
	pathsBefore  map[string]bool
	chainsBefore iptablesChains
	setsBefore   ipsets
	imagesLoaded time.Time
	procs        []*process // containerd, kubelet, kube-proxy, kube-router
	bin          string     // where the Kubernetes binaries are
	cluster      *Cluster
	// lock is held while the node exists: one real node per machine.
	lock *os.File
	// withDNS: pods resolve with dns, the cluster's DNS server on ip.
	withDNS bool
	dns     *clusterDNS
}

// realNodeLock is the file whose lock a real node holds. Two would share
// the machine's iptables: each kube-proxy would rewrite the other's
// Service rules, and each cleanup remove the other's chains. A second
// cluster (the demo while the tests run, two test packages) waits.
var realNodeLock = filepath.Join(os.TempDir(), "clipjob-real-node.lock")

func lockRealNode(ctx context.Context, c *Cluster) (*os.File, error) {
	f, err := os.OpenFile(realNodeLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_ = f.Truncate(0)
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			if n := killShimsOf(staleNodeSocket); n > 0 {
				c.logf("real node: killed %d containerd shims (and their containers) a real node left running when its process died", n)
			}
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", realNodeLock, err)
		}
		if !logged {
			holder, _ := os.ReadFile(realNodeLock)
			c.logf("waiting for the real node of another cluster on this machine to stop (%s held by pid %s)", realNodeLock, strings.TrimSpace(string(holder)))
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("another real node holds %s: %w", realNodeLock, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// nodeRequirement is one thing a real node needs from the machine.
type nodeRequirement struct{ what, fix string }

// checkNodeRequirements lists what the machine lacks for a real node, each
// with the fix; nil when it has everything.
func checkNodeRequirements(bin string) []nodeRequirement {
	var miss []nodeRequirement
	if os.Geteuid() != 0 {
		miss = append(miss, nodeRequirement{"root (containerd, the kubelet and network links need it)", "run as root"})
	}
	for _, b := range []string{"kubelet", "kube-proxy", "kube-router"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			miss = append(miss, nodeRequirement{b + " in " + bin, "run hack/kube-binaries.sh"})
		}
	}
	for _, t := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "ip", "iptables", "ipset", "busybox"} {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, nodeRequirement{t, "run hack/node-packages.sh (Debian packages)"})
		}
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "firewall", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			miss = append(miss, nodeRequirement{"CNI plugin " + p + " in " + cniBinDir, "run hack/node-packages.sh (Debian packages)"})
		}
	}
	return miss
}

// NodeRequirementsError says what is missing, and how to run without a
// real node instead.
func nodeRequirementsError(miss []nodeRequirement) error {
	var b strings.Builder
	b.WriteString("this machine cannot run the real node the e2e suite needs:")
	for _, m := range miss {
		fmt.Fprintf(&b, "\n  - missing %s: %s", m.what, m.fix)
	}
	fmt.Fprintf(&b, "\nor run only the tests that need no real container with %s=kwok", NodeEnv)
	return errors.New(b.String())
}

// newRealNode picks the node's address, pod network and names, and
// creates its dummy link, before the API server starts (it listens there
// too, for pods).
func newRealNode(ctx context.Context, c *Cluster) (_ *realNode, err error) {
	lock, err := lockRealNode(ctx, c)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	used, err := usedAddresses()
	if err != nil {
		return nil, err
	}
	n := &realNode{dir: filepath.Join(c.Dir, "node"), cluster: c, lock: lock}
	for _, i := range rand.Perm(200) {
		ip := nodeNet + strconv.Itoa(i+20)
		if !used.contains(ip) {
			n.ip = ip
			break
		}
	}
	for _, i := range rand.Perm(50) {
		cidr := fmt.Sprintf("10.%d.0.0/16", podNetBase+i)
		if !used.overlaps(cidr) {
			n.podCIDR = cidr
			break
		}
	}
	if n.ip == "" || n.podCIDR == "" {
		return nil, errors.New("real node: no free address in 198.51.100.0/24 or pod network in 10.200-249.0.0/16")
	}
	id := strings.TrimPrefix(filepath.Base(c.Dir), "clipjob-cluster-")
	id = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, strings.ToLower(id))
	if len(id) > 8 {
		id = id[len(id)-8:]
	}
	n.link, n.bridge, n.cgroupRoot = "cjn"+id, "cjb"+id, "/clipjob-"+id
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return nil, err
	}
	// A dummy link where the kernel has the module; else an empty bridge,
	// which holds an address just as well.
	if err := ipCmd("link", "add", n.link, "type", "dummy"); err != nil {
		if err := ipCmd("link", "add", n.link, "type", "bridge"); err != nil {
			return nil, err
		}
	}
	if err := ipCmd("addr", "add", n.ip+"/32", "dev", n.link); err != nil {
		n.removeLinks()
		return nil, err
	}
	if err := ipCmd("link", "set", n.link, "up"); err != nil {
		n.removeLinks()
		return nil, err
	}
	n.socket = filepath.Join(n.dir, "containerd", "containerd.sock")
	return n, nil
}

// start runs containerd, loads the test images, then the kubelet and
// kube-proxy, and waits for the node to be Ready.
func (n *realNode) start(ctx context.Context, bin string, apiPort int) error {
	c := n.cluster
	n.bin = bin
	n.sysctlsSaved = saveSysctls()
	n.pathsBefore = existingMachinePaths()
	// Each container's log is a watch of the kubelet's (inotify): the
	// machine's default of 128 instances per user would cap the node near
	// 120 followed containers. Put back at stop.
	_ = os.WriteFile(sysctlPath("fs.inotify.max_user_instances"), []byte("8192"), 0o644)
	n.chainsBefore = readChains()
	n.setsBefore = readSets()
	files, err := n.writeConfigs(apiPort)
	if err != nil {
		return err
	}
	if err := makeCgroups(n.cgroupRoot); err != nil {
		return err
	}
	began := time.Now()
	c.logf("starting containerd (socket %s)", n.socket)
	if err := n.run("", "containerd", "--config", files.containerd); err != nil {
		return err
	}
	if err := n.waitSocket(ctx, 60*time.Second); err != nil {
		return err
	}
	if err := n.loadImages(ctx, TestImages()...); err != nil {
		return err
	}
	n.imagesLoaded = time.Now()
	ports, err := FreePorts(3)
	if err != nil {
		return err
	}
	n.kubeletPort = files.kubeletPort
	if n.withDNS {
		if n.dns, err = startClusterDNS(c.Clientset(), n.ip); err != nil {
			return fmt.Errorf("the cluster's DNS server on %s: %w", n.ip, err)
		}
	}
	c.logf("starting kubelet (node %s at %s, pods in %s)", RealNodeName, n.ip, n.podCIDR)
	if err := n.run(bin, "kubelet",
		"--config", files.kubelet, "--kubeconfig", files.kubeletKubeconfig,
		"--hostname-override", RealNodeName, "--node-ip", n.ip,
		"--root-dir", filepath.Join(n.dir, "kubelet"),
		"--register-with-taints", RealNodeTaint+"=true:NoSchedule",
		"--node-labels", "type=real", "--v", "1"); err != nil {
		return err
	}
	c.logf("starting kube-proxy")
	if err := n.run(bin, "kube-proxy",
		"--kubeconfig", files.proxyKubeconfig, "--hostname-override", RealNodeName,
		"--cluster-cidr", n.podCIDR, "--proxy-mode", "iptables",
		// The bridge forwards pod-to-pod replies below iptables: masquerade
		// every Service connection so replies come back through the host.
		"--masquerade-all",
		// Leave the machine's conntrack and localhost sysctls alone.
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--iptables-localhost-nodeports=false",
		"--metrics-bind-address", "127.0.0.1:"+strconv.Itoa(ports[0]),
		"--healthz-bind-address", "127.0.0.1:"+strconv.Itoa(ports[1]),
		"--v", "1"); err != nil {
		return err
	}
	if err := n.waitReady(ctx, c.Clientset(), 120*time.Second); err != nil {
		return err
	}
	c.logf("node %s Ready %.1fs after containerd started (images built and loaded %.1fs in)", RealNodeName, time.Since(began).Seconds(), n.imagesLoaded.Sub(began).Seconds())
	// The kubelet takes a config field it does not know with a warning;
	// the node would run with the default instead (e.g. its logs in the
	// machine's /var/log/pods).
	if b, err := os.ReadFile(c.LogFile("kubelet")); err == nil {
		if i := strings.Index(string(b), "strict decoding error"); i >= 0 {
			line, _, _ := strings.Cut(string(b[i:]), "\n")
			return fmt.Errorf("the kubelet does not know a field of %s: %s", files.kubelet, line)
		}
	}
	return nil
}

func (n *realNode) run(bin, name string, args ...string) error {
	path := name
	if bin != "" {
		path = filepath.Join(bin, name)
	}
	p := &process{name: name, bin: path, args: args}
	if err := n.cluster.start(p); err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return nil
}

func (n *realNode) waitSocket(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := n.exited(); err != nil {
			return err
		}
		if c, err := net.Dial("unix", n.socket); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("containerd socket %s not there after %s; see %s", n.socket, timeout, n.cluster.LogFile("containerd"))
}

func (n *realNode) waitReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := n.exited(); err != nil {
			return err
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, RealNodeName, metav1.GetOptions{})
		if err == nil {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("node %s not Ready after %s; see %s", RealNodeName, timeout, n.cluster.LogFile("kubelet"))
}

func (n *realNode) exited() error {
	for _, p := range n.procs {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited (%v); see %s", p.name, err, n.cluster.LogFile(p.name))
		default:
		}
	}
	return nil
}

// EnforceNetworkPolicy starts kube-router's network policy controller on
// the real node (its router and service proxy off: the bridge CNI and
// kube-proxy stay), so NetworkPolicies hold for the node's pods from then
// on. It stops with the node, which removes its iptables rules and ipsets.
func (c *Cluster) EnforceNetworkPolicy(ctx context.Context) error {
	n := c.node
	if n == nil {
		return fmt.Errorf("no real node to enforce network policy on (%s=kwok)", NodeEnv)
	}
	for _, p := range n.procs {
		if p.name == "kube-router" {
			return nil
		}
	}
	// kube-router reads the node's pod range from its spec; nothing else
	// here allocates one (the controller manager's nodeipam is off).
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.podCIDR, n.podCIDR)
	if _, err := c.Clientset().CoreV1().Nodes().Patch(ctx, RealNodeName, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("giving node %s its pod range: %w", RealNodeName, err)
	}
	c.logf("starting kube-router's network policy controller on %s", RealNodeName)
	if err := n.run(n.bin, "kube-router", "--kubeconfig", c.Kubeconfig, "--hostname-override", RealNodeName,
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
		"--service-cluster-ip-range", serviceCIDR, "--health-port", "0", "--metrics-port", "0",
		"--iptables-sync-period", "10s", "--v", "1"); err != nil {
		return err
	}
	return n.exited()
}

// RealNodePlacement is what a pod needs to run on the real node: the
// toleration of its taint and a selector naming it.
func RealNodePlacement() (map[string]string, []corev1.Toleration) {
	return map[string]string{"kubernetes.io/hostname": RealNodeName},
		[]corev1.Toleration{{Key: RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
}

// HasRealNode says whether Start brought up a real node.
func (c *Cluster) HasRealNode() bool { return c.node != nil }

// RealNodeIP is the real node's address (pods reach the API server there).
func (c *Cluster) RealNodeIP() string {
	if c.node == nil {
		return ""
	}
	return c.node.ip
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// addresses are the machine's addresses and routes, so the node picks
// neither an address nor a pod network already in use.
type addresses struct{ nets []*net.IPNet }

func usedAddresses() (addresses, error) {
	var a addresses
	ifaces, err := net.InterfaceAddrs()
	if err != nil {
		return a, err
	}
	for _, addr := range ifaces {
		if ipn, ok := addr.(*net.IPNet); ok {
			a.nets = append(a.nets, ipn)
		}
	}
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			dst := f[0]
			if dst == "local" || dst == "broadcast" {
				if len(f) < 2 {
					continue
				}
				dst = f[1]
			}
			if !strings.Contains(dst, "/") {
				dst += "/32"
			}
			if _, ipn, err := net.ParseCIDR(dst); err == nil && dst != "0.0.0.0/0" {
				a.nets = append(a.nets, ipn)
			}
		}
	}
	return a, nil
}

func (a addresses) contains(ip string) bool {
	p := net.ParseIP(ip)
	for _, n := range a.nets {
		if n.IP.Equal(p) {
			return true
		}
	}
	return false
}

func (a addresses) overlaps(cidr string) bool {
	_, want, _ := net.ParseCIDR(cidr)
	for _, n := range a.nets {
		if want.Contains(n.IP) || n.Contains(want.IP) {
			return true
		}
	}
	return false
}
