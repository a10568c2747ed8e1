package cluster

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestStartStop brings the control plane up and checks that the API server
// answers with the version it was built as and that the kwok node is Ready.
func TestStartStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; run without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	cs := c.Clientset()
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.Major != "1" || v.GitVersion == "" || v.GitVersion[0] != 'v' || v.GitVersion == "v0.0.0-master+$Format:%H$" {
		t.Errorf("server version %+v: not stamped", v)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestRealNodeRunsAPodAndCleansUp: the real node runs a container from a
// locally built image, its log comes back through the API server and the
// kubelet, and Stop leaves nothing behind: no link, mount, cgroup, shim or
// changed forwarding setting.
func TestRealNodeRunsAPodAndCleansUp(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; run without -short")
	}
	if !WantRealNode() {
		t.Skipf("%s=kwok: no real node asked for", NodeEnv)
	}
	// Generous: the e2e package's real node may hold the machine's one
	// real-node lock for its whole run first (26 minutes on a busy CI
	// machine, past a fixed 25-minute wait): wait until 5 minutes before
	// the test binary's own deadline, which leaves this test its run.
	wait := 25 * time.Minute
	if deadline, ok := t.Deadline(); ok {
		wait = time.Until(deadline) - 5*time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := Start(ctx, Options{Log: os.Stderr, RealNode: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	node := *c.node
	cs := c.Clientset()
	sel, tol := RealNodePlacement()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, NodeSelector: sel, Tolerations: tol,
			Containers: []corev1.Container{{
				Name: "c", Image: FakeAgentImage, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", "echo hello from $(id -u); echo 'lines=2' | claude"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000)},
			}},
		},
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) || !strings.Contains(err.Error(), "serviceaccount") {
			t.Fatal(err) // the default ServiceAccount is made moments after start
		}
	}
	var phase corev1.PodPhase
	var podUID types.UID
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		podUID = p.UID
		if phase = p.Status.Phase; phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			break
		}
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod phase %s; kubelet log %s", phase, c.LogFile("kubelet"))
	}
	logs, err := cs.CoreV1().Pods("default").GetLogs("hello", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(logs), "hello from 1000\n") || !strings.Contains(string(logs), `"type":"result"`) {
		t.Errorf("logs through the kubelet:\n%s", logs)
	}

	// Another program's chain, made while the node runs (dockerd started
	// beside it, say), is not the node's to remove.
	if err := exec.Command("iptables", "-w", "-N", "E2E-FOREIGN").Run(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = exec.Command("iptables", "-w", "-X", "E2E-FOREIGN").Run() }()

	c.Stop()
	stopped = true
	if !readChains()["iptables filter E2E-FOREIGN"] {
		t.Error("the node's cleanup removed a chain another program made while it ran")
	}
	if _, err := net.InterfaceByName(node.link); err == nil {
		t.Errorf("link %s still there", node.link)
	}
	if _, err := net.InterfaceByName(node.bridge); err == nil {
		t.Errorf("bridge %s still there", node.bridge)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), node.dir) {
		t.Errorf("mounts under %s remain", node.dir)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", node.cgroupRoot)); err == nil {
		t.Errorf("cgroup %s remains", node.cgroupRoot)
	}
	// What the machine had is what the node read once it held the
	// machine's real-node lock (another cluster's node may have run while
	// this one waited for it).
	sysctls, paths, chains := node.sysctlsSaved, node.pathsBefore, node.chainsBefore
	for name, was := range sysctls {
		if now := saveSysctls()[name]; now != was {
			t.Errorf("sysctl %s is %q, was %q", name, now, was)
		}
	}
	for p := range existingMachinePaths() {
		if !paths[p] {
			t.Errorf("%s was made by the node and remains", p)
		}
	}
	for key := range readChains() {
		if !chains[key] && isNodeChain(strings.Fields(key)[2]) {
			t.Errorf("iptables chain %s remains", key)
		}
	}
	logLinks, _ := filepath.Glob("/var/log/containers/hello_default_*")
	if len(logLinks) > 0 {
		t.Errorf("log links remain: %v", logLinks)
	}
	if _, err := os.Stat("/var/log/pods/default_hello_" + string(podUID)); err == nil {
		t.Error("the pod's logs went to the machine's /var/log/pods")
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), node.socket) {
			t.Errorf("a process of the node still runs: %q", b)
		}
	}
}

// TestMissingNodeRequirementsAreNamed: a machine without what the real node
// needs gets an error naming each missing piece and its fix, and the one
// variable that runs without a real node.
func TestMissingNodeRequirementsAreNamed(t *testing.T) {
	empty := t.TempDir()
	miss := checkNodeRequirements(empty)
	err := nodeRequirementsError(miss)
	for _, want := range []string{"kubelet in " + empty, "kube-proxy in " + empty, "hack/kube-binaries.sh", NodeEnv + "=kwok"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	t.Setenv("PATH", empty)
	miss = checkNodeRequirements(empty)
	err = nodeRequirementsError(miss)
	for _, want := range []string{"missing containerd", "missing runc", "missing busybox", "hack/node-packages.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("with no PATH, error %q does not name %q", err, want)
		}
	}
}

// TestFreePortsStayBelowTheNodePortRange: no server of the suite listens
// in the API server's NodePort range, where kube-router lets every pod
// through to its node whatever its NetworkPolicy (the egress test's API
// server was reachable from a confined agent whenever it got such a port).
func TestFreePortsStayBelowTheNodePortRange(t *testing.T) {
	// Nearly the whole ring, so the walk crosses its top whatever block
	// this process started in; ports others hold are skipped.
	got, err := FreePorts(portsHigh - portsLow - 2000)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range got {
		if p >= 30000 || p < 1024 {
			t.Fatalf("FreePorts handed out %d, outside 1024-29999", p)
		}
	}
}
