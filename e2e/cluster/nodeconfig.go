package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// nodeFiles are the configuration files writeConfigs wrote.
type nodeFiles struct {
	containerd, kubelet, kubeletKubeconfig, proxyKubeconfig string
	kubeletPort                                             int
}

// ContainerLogMaxSize is the kubelet's log rotation size: small, so a test
// can make the kubelet rotate a running container's log within seconds.
const ContainerLogMaxSize = "1Mi"

// writeConfigs writes containerd's, the CNI's and the kubelet's
// configuration, and the kubelet's and kube-proxy's certificates and
// kubeconfigs, all under the node's directory.
func (n *realNode) writeConfigs(apiPort int) (nodeFiles, error) {
	var f nodeFiles
	c := n.cluster
	pki := func(name string) string { return filepath.Join(c.Dir, "pki", name) }
	serving, err := c.CA.Serving(RealNodeName, n.ip, RealNodeName)
	if err != nil {
		return f, err
	}
	if err := writePair(pki("kubelet-serving"), serving); err != nil {
		return f, err
	}
	// The Node authorizer knows a kubelet by this name and group.
	kubelet, err := c.CA.Client("system:node:"+RealNodeName, "system:nodes")
	if err != nil {
		return f, err
	}
	if err := writePair(pki("kubelet"), kubelet); err != nil {
		return f, err
	}
	// The default ClusterRoleBinding system:node-proxier names this user.
	proxy, err := c.CA.Client("system:kube-proxy")
	if err != nil {
		return f, err
	}
	if err := writePair(pki("kube-proxy"), proxy); err != nil {
		return f, err
	}
	f.kubeletKubeconfig = filepath.Join(n.dir, "kubelet.kubeconfig")
	f.proxyKubeconfig = filepath.Join(n.dir, "kube-proxy.kubeconfig")
	if err := c.writeKubeconfigFor(apiPort, "kubelet", f.kubeletKubeconfig); err != nil {
		return f, err
	}
	if err := c.writeKubeconfigFor(apiPort, "kube-proxy", f.proxyKubeconfig); err != nil {
		return f, err
	}

	cniDir := filepath.Join(n.dir, "cni")
	if err := os.MkdirAll(filepath.Join(cniDir, "net.d"), 0o755); err != nil {
		return f, err
	}
	conflist, _ := json.MarshalIndent(map[string]any{
		"cniVersion": "0.4.0",
		"name":       "clipjob-" + n.bridge,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": n.bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": n.podCIDR}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(cniDir, "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
			// Without it, pod traffic is dropped where the machine's FORWARD
			// policy is DROP (Docker sets one).
			map[string]any{"type": "firewall"},
		},
	}, "", "  ")
	if err := os.WriteFile(filepath.Join(cniDir, "net.d", "10-clipjob.conflist"), conflist, 0o644); err != nil {
		return f, err
	}

	ctrd := filepath.Join(n.dir, "containerd")
	f.containerd = filepath.Join(ctrd, "config.toml")
	if err := os.MkdirAll(ctrd, 0o755); err != nil {
		return f, err
	}
	toml := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # This machine's processes lack CAP_SYS_RESOURCE: runc cannot lower a
  # container's oom_score_adj below its own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(ctrd, "root"), filepath.Join(ctrd, "state"), n.socket, filepath.Join(ctrd, "opt"),
		PauseImage, cniBinDir, filepath.Join(cniDir, "net.d"))
	if err := os.WriteFile(f.containerd, []byte(toml), 0o644); err != nil {
		return f, err
	}

	ports, err := FreePorts(2)
	if err != nil {
		return f, err
	}
	f.kubeletPort = ports[0]
	f.kubelet = filepath.Join(n.dir, "kubelet.yaml")
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// This machine's cgroups are v1, which 1.37 refuses by default.
		"failCgroupV1": false,
		"cgroupDriver": "cgroupfs",
		// Pods' cgroups under a root of this node's own, removed by Stop.
		"cgroupRoot":               n.cgroupRoot,
		"containerRuntimeEndpoint": "unix://" + n.socket,
		"address":                  n.ip,
		"port":                     f.kubeletPort,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              ports[1],
		"tlsCertFile":              pki("kubelet-serving.crt"),
		"tlsPrivateKeyFile":        pki("kubelet-serving.key"),
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": pki("ca.crt")},
		},
		"authorization":       map[string]any{"mode": "Webhook"},
		"failSwapOn":          false,
		"clusterDomain":       "cluster.local",
		"resolvConf":          "/etc/resolv.conf",
		"podCIDR":             n.podCIDR,
		"maxPods":             110,
		"serializeImagePulls": false,
		// Never collect the images loaded at start: nothing could pull them again.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%",
		},
		"containerLogMaxSize":  ContainerLogMaxSize,
		"containerLogMaxFiles": 3,
		// Checked every 3s (the least allowed; 10s by default), so a test's
		// agent sees its log rotated several times within seconds.
		"containerLogMonitorInterval": "3s",
		// Pods' logs under the node's directory, not the machine's /var/log.
		"podLogsDir":         n.podLogsDir(),
		"syncFrequency":      "5s",
		"fileCheckFrequency": "5s",
		"staticPodPath":      "",
	}
	if n.withDNS {
		// Pods' resolv.conf names the cluster's DNS server (dns.go), on
		// the node's own address, which every pod reaches.
		cfg["clusterDNS"] = []string{n.ip}
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return f, err
	}
	return f, os.WriteFile(f.kubelet, b, 0o644)
}

func writePair(prefix string, kp *KeyPair) error {
	if err := os.WriteFile(prefix+".crt", kp.CertPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(prefix+".key", kp.KeyPEM, 0o600)
}

func (n *realNode) podLogsDir() string { return filepath.Join(n.dir, "pod-logs") }

// PodLogsDir is where the real node's kubelet keeps container logs:
// <namespace>_<pod>_<uid>/<container>/<restart>.log, and the rotated files
// beside each.
func (c *Cluster) PodLogsDir() string {
	if c.node == nil {
		return ""
	}
	return c.node.podLogsDir()
}
