package cluster

import "testing"

// TestUnmountRaceIsImportedAgain: the one import failure the node retries
// is containerd's busy temporary mount; any other failure (a bad archive,
// a full disk) is reported at once.
func TestUnmountRaceIsImportedAgain(t *testing.T) {
	for _, c := range []struct {
		out  string
		want bool
	}{
		{`unpacking docker.io/local/paperclip-clipjob:2026.916.1 (sha256:921d)...time="2026-11-29T10:34:25Z" level=info msg="apply failure, attempting cleanup" error="failed to extract layer sha256:0acd: failed to unmount /n/containerd/root/tmpmounts/containerd-mount1555361513: failed to unmount target /n/containerd/root/tmpmounts/containerd-mount1555361513: device or resource busy: unknown"`, true},
		{`ctr: failed to extract layer sha256:0acd: write /n/containerd/root/io.containerd.snapshotter.v1.overlayfs/snapshots/9/fs/x: no space left on device: unknown`, false},
		{`ctr: unrecognized image format`, false},
		{`ctr: failed to remove /x: device or resource busy`, false},
	} {
		if got := unmountRaced([]byte(c.out)); got != c.want {
			t.Errorf("unmountRaced(%q) = %v, want %v", c.out, got, c.want)
		}
	}
}
