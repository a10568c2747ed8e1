package cluster

import "testing"

// TestAStaleNodesShimsAreKnownByTheirSocket: with the real-node lock held,
// the shims of any real node's containerd (under a cluster directory) are
// a dead node's and are killed; a shim of the machine's own containerd, or
// any other process naming a cluster directory, is left alone.
func TestAStaleNodesShimsAreKnownByTheirSocket(t *testing.T) {
	for _, c := range []struct {
		cmdline string
		want    bool
	}{
		{"/usr/bin/containerd-shim-runc-v2\x00-namespace\x00k8s.io\x00-id\x00d569\x00-address\x00/tmp/clipjob-cluster-592018314/node/containerd/containerd.sock\x00", true},
		{"/usr/bin/containerd-shim-runc-v2\x00-namespace\x00k8s.io\x00-id\x00d569\x00-address\x00/run/containerd/containerd.sock\x00", false},
		{"/usr/bin/containerd-shim-runc-v2\x00-namespace\x00moby\x00-address\x00/tmp/other/node/containerd/containerd.sock\x00", false},
	} {
		if got := staleNodeSocket(c.cmdline); got != c.want {
			t.Errorf("staleNodeSocket(%q) = %v, want %v", c.cmdline, got, c.want)
		}
	}
}
