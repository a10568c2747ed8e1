package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stop takes the node down and leaves the machine as it found it: the
// kubelet first (so nothing restarts a pod), then every pod sandbox through
// the CRI (containerd runs each one's CNI teardown: its address, its
// iptables rules), containerd and any shim it left, kube-proxy's rules,
// the mounts under the node's directory, the links and cgroups it made,
// and the forwarding sysctl as it was.
func (n *realNode) stop() {
	if n.dns != nil {
		n.dns.stop()
	}
	byName := map[string]*process{}
	for _, p := range n.procs {
		byName[p.name] = p
	}
	for _, name := range []string{"kubelet", "kube-proxy", "kube-router"} {
		if p := byName[name]; p != nil {
			p.terminate()
		}
	}
	if p := byName["kube-router"]; p != nil {
		_ = exec.Command(p.bin, "--cleanup-config").Run()
	}
	if p := byName["containerd"]; p != nil {
		n.removeSandboxes()
		p.terminate()
	}
	n.killShims()
	if bin := n.kubeProxyBin(); bin != "" {
		_ = exec.Command(bin, "--cleanup").Run()
	}
	n.chainsBefore.removeNewChains()
	n.setsBefore.destroyNewSets()
	n.removeLogLinks()
	unmountUnder(n.dir)
	n.removeLinks()
	removeCgroups(n.cgroupRoot)
	restoreSysctls(n.sysctlsSaved)
	n.removeMachinePaths()
	n.procs = nil
	if n.lock != nil {
		n.lock.Close() // and with it the lock
		n.lock = nil
	}
}

func (n *realNode) kubeProxyBin() string {
	for _, p := range n.procs {
		if p.name == "kube-proxy" {
			return p.bin
		}
	}
	return ""
}

// removeSandboxes stops and removes every pod sandbox containerd has.
func (n *realNode) removeSandboxes() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+n.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		n.cluster.logf("real node cleanup: CRI: %v", err)
		return
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		n.cluster.logf("real node cleanup: listing pod sandboxes: %v", err)
		return
	}
	for _, sb := range list.Items {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			n.cluster.logf("real node cleanup: stopping sandbox of %s/%s: %v", sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			n.cluster.logf("real node cleanup: removing sandbox of %s/%s: %v", sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err)
		}
	}
}

// killShims kills the runc shims of this node's containerd (they outlive
// it by design) and the containers they hold, found by the socket path in
// their command line.
func (n *realNode) killShims() {
	killShimsOf(func(cmdline string) bool { return strings.Contains(cmdline, n.socket) })
}

// staleNodeSocket tells a shim of any real node's containerd by its
// command line. Called with the real-node lock held, every such shim is a
// dead node's: a test binary that panicked or was killed never ran its
// node's stop, and its containers (a flood, a sleeping agent) would run on
// beside the next suite.
func staleNodeSocket(cmdline string) bool {
	return strings.Contains(cmdline, string(filepath.Separator)+"clipjob-cluster-") &&
		strings.Contains(cmdline, filepath.Join("node", "containerd", "containerd.sock"))
}

// killShimsOf kills the containerd shims whose command line ours says
// are wanted, and their containers; it returns how many.
func killShimsOf(ours func(cmdline string) bool) int {
	killed := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), "containerd-shim") || !ours(string(b)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		// The shim's children are the containers: kill the group.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		killed++
	}
	return killed
}

// unmountUnder detaches every mount below dir, deepest first: the kubelet's
// volume tmpfs, containerd's rootfs overlays and sandbox shm.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// removeLogLinks removes the kubelet's links to this node's container logs
// from /var/log/containers, a path it does not let a config change.
func (n *realNode) removeLogLinks() {
	links, _ := filepath.Glob("/var/log/containers/*.log")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, n.dir+"/") {
			_ = os.Remove(l)
		}
	}
}

func (n *realNode) removeLinks() {
	for _, l := range []string{n.bridge, n.link} {
		if l != "" {
			_ = exec.Command("ip", "link", "delete", l).Run()
		}
	}
}

// makeCgroups creates the node's cgroup root in every v1 hierarchy (the
// kubelet refuses a root that is missing from one); a cpuset gets its
// parent's CPUs and memory nodes, as a new cpuset starts with none.
func makeCgroups(root string) error {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			continue // not a hierarchy (e.g. a unified-mode file)
		}
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("real node: creating cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("real node: %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes the node's cgroup root in every v1 hierarchy, its
// children first (a cgroup directory goes only once empty).
func removeCgroups(root string) {
	if root == "" {
		return
	}
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			_ = syscall.Rmdir(d)
		}
	}
}

// iptablesChains are the chains of each table ("iptables filter KUBE-X"),
// read before the node starts so stop can remove the ones it made: the
// kubelet's canaries and firewall, the CNI firewall plugin's chains.
type iptablesChains map[string]bool

var iptablesTables = []string{"filter", "nat", "mangle"}

func readChains() iptablesChains {
	chains := iptablesChains{}
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, table := range iptablesTables {
			out, err := exec.Command(cmd, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && (f[0] == "-N" || f[0] == "-P") {
					chains[cmd+" "+table+" "+f[1]] = true
				}
			}
		}
	}
	return chains
}

// nodeChainPrefixes name the chains the node's components make: the
// kubelet's, kube-proxy's and kube-router's (KUBE-), the CNI plugins'
// (CNI-). A chain of another name made meanwhile (dockerd started beside
// the node, say) is not the node's to remove.
var nodeChainPrefixes = []string{"KUBE-", "CNI-"}

func isNodeChain(name string) bool {
	for _, p := range nodeChainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// removeNewChains deletes every rule that jumps to a node chain made since
// before was read, then those chains.
func (before iptablesChains) removeNewChains() {
	if before == nil {
		return
	}
	for key := range readChains() {
		if before[key] || !isNodeChain(strings.Fields(key)[2]) {
			continue
		}
		f := strings.Fields(key)
		cmd, table, chain := f[0], f[1], f[2]
		out, _ := exec.Command(cmd, "-w", "-t", table, "-S").Output()
		for _, line := range strings.Split(string(out), "\n") {
			rule := splitRule(line)
			if len(rule) > 2 && rule[0] == "-A" && strings.Contains(" "+line+" ", " -j "+chain+" ") {
				_ = exec.Command(cmd, append([]string{"-w", "-t", table, "-D"}, rule[1:]...)...).Run()
			}
		}
		_ = exec.Command(cmd, "-w", "-t", table, "-F", chain).Run()
	}
	for key := range readChains() {
		if f := strings.Fields(key); !before[key] && isNodeChain(f[2]) {
			_ = exec.Command(f[0], "-w", "-t", f[1], "-X", f[2]).Run()
		}
	}
}

// splitRule splits a line of `iptables -S` into arguments; a comment is
// printed in double quotes.
func splitRule(line string) []string {
	var args []string
	var cur strings.Builder
	quoted, inArg := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, inArg = !quoted, true
		case r == ' ' && !quoted:
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// ipsets are the machine's ipset names, read before the node starts so
// stop can destroy the ones kube-router made.
type ipsets map[string]bool

func readSets() ipsets {
	sets := ipsets{}
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return sets
	}
	for _, name := range strings.Fields(string(out)) {
		sets[name] = true
	}
	return sets
}

func (before ipsets) destroyNewSets() {
	if before == nil {
		return
	}
	for name := range readSets() {
		// kube-router's sets are KUBE-SRC-…, KUBE-DST-…, kube-router-….
		if !before[name] && (strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "kube-router")) {
			_ = exec.Command("ipset", "destroy", name).Run()
		}
	}
}

// nodeSysctls are the machine-wide settings the node changes: the bridge
// plugin turns on forwarding, the kubelet sets its kernel tunables at start
// (protectKernelDefaults off), the node raises the inotify instances.
var nodeSysctls = []string{
	"net.ipv4.ip_forward",
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
	"fs.inotify.max_user_instances",
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

func saveSysctls() map[string]string {
	saved := map[string]string{}
	for _, name := range nodeSysctls {
		if b, err := os.ReadFile(sysctlPath(name)); err == nil {
			saved[name] = strings.TrimSpace(string(b))
		}
	}
	return saved
}

func restoreSysctls(saved map[string]string) {
	for name, v := range saved {
		_ = os.WriteFile(sysctlPath(name), []byte(v), 0o644)
	}
}

// machinePaths are where the kubelet and containerd write outside the
// node's directory whatever their configuration: removed at stop when the
// node made them (a directory only when empty).
var machinePaths = []string{
	"/var/lib/kubelet/device-plugins/kubelet.sock", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet",
	"/var/lib/cni/results", "/var/lib/cni",
	"/run/containerd/runc/k8s.io", "/run/containerd/runc", "/run/containerd/s", "/run/containerd", "/run/netns",
}

// existingMachinePaths records which of machinePaths were there before.
func existingMachinePaths() map[string]bool {
	there := map[string]bool{}
	for _, p := range machinePaths {
		if _, err := os.Lstat(p); err == nil {
			there[p] = true
		}
	}
	return there
}

func (n *realNode) removeMachinePaths() {
	for _, p := range machinePaths {
		if n.pathsBefore[p] {
			continue
		}
		_ = syscall.Unlink(p)
		_ = syscall.Rmdir(p)
	}
}
