package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/paperclipai/clipjob/internal/ociimage"
)

// Images the real node has from the start, loaded into its containerd:
// no registry is reachable, so pods name them with imagePullPolicy Never
// (or IfNotPresent, which finds them).
const (
	PauseImage     = "docker.io/local/pause:1"
	FakeAgentImage = "docker.io/local/fake-agent:1"
)

// imageRecipe builds one test image's spec from binaries it compiles.
type imageRecipe struct {
	tag   string
	build func(dir string) (ociimage.Spec, error)
}

// TestImages are the images every real node loads: the pod sandbox and
// the fake agent.
func TestImages() []imageRecipe {
	return []imageRecipe{
		{PauseImage, func(dir string) (ociimage.Spec, error) {
			pause, err := goBuild(dir, "./e2e/images/pause")
			return ociimage.Spec{Tag: PauseImage, Entrypoint: []string{"/pause"},
				Files: []ociimage.File{{Path: "/pause", Source: pause}}}, err
		}},
		{FakeAgentImage, fakeAgentSpec},
	}
}

// fakeAgentSpec: the fake agent under every agent CLI's name, and a static
// busybox for the profiles' shell commands.
func fakeAgentSpec(dir string) (ociimage.Spec, error) {
	agent, err := goBuild(dir, "./e2e/images/fakeagent")
	if err != nil {
		return ociimage.Spec{}, err
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return ociimage.Spec{}, fmt.Errorf("the fake agent image needs a static busybox (Debian's busybox-static): %w", err)
	}
	files, err := ociimage.FakeAgentFiles(agent, busybox)
	return ociimage.Spec{Tag: FakeAgentImage, Env: []string{"PATH=/usr/local/bin:/bin"},
		Entrypoint: []string{"/usr/local/bin/claude"}, Files: files}, err
}

// goBuild compiles a main package of this module, statically, into dir.
func goBuild(dir, pkg string) (string, error) {
	return filepath.Join(dir, filepath.Base(pkg)), BuildStatic(context.Background(), dir, pkg)
}

// BuildStatic compiles main packages of this module (e.g. "./cmd/...")
// into dir as `make image` does: static, trimmed, stripped.
func BuildStatic(ctx context.Context, dir string, pkgs ...string) error {
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v: %s", strings.Join(pkgs, " "), err, strings.TrimSpace(string(b)))
	}
	return nil
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// loadImages builds each image and imports it into the node's containerd.
func (n *realNode) loadImages(ctx context.Context, recipes ...imageRecipe) error {
	dir := filepath.Join(n.dir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range recipes {
		spec, err := r.build(dir)
		if err != nil {
			return fmt.Errorf("image %s: %w", r.tag, err)
		}
		archive := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(r.tag)+".tar")
		if err := ociimage.WriteArchive(archive, spec); err != nil {
			return fmt.Errorf("image %s: %w", r.tag, err)
		}
		if err := n.importArchive(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

// importArchive loads a docker-archive tarball into the node's containerd
// (the namespace the CRI uses).
func (n *realNode) importArchive(ctx context.Context, archive string) error {
	for attempt := 1; ; attempt++ {
		cmd := exec.CommandContext(ctx, "ctr", "--address", n.socket, "--namespace", "k8s.io",
			"images", "import", "--all-platforms", archive)
		b, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if attempt < 3 && unmountRaced(b) && ctx.Err() == nil {
			n.cluster.logf("importing %s: containerd could not unmount a layer's temporary mount (busy); importing again", filepath.Base(archive))
			continue
		}
		return fmt.Errorf("ctr images import %s: %v: %s", archive, err, strings.TrimSpace(string(b)))
	}
	n.cluster.logf("loaded image %s", filepath.Base(archive))
	return nil
}

// unmountRaced says whether ctr's output is containerd failing to unmount
// the temporary mount it unpacks a layer through because it was busy.
// The suite saw it once when the Paperclip image was imported while agent
// pods started (a new container's mount namespace takes a copy of the
// node's mounts, and an unmount that propagates to a busy copy fails);
// containerd's issues 4127, 5538 and 10239 report it on pulls, which the
// kubelet retries. The layer was not unpacked and the content is stored,
// so importing again unpacks it anew.
func unmountRaced(out []byte) bool {
	s := string(out)
	return strings.Contains(s, "failed to unmount") && strings.Contains(s, "device or resource busy")
}

// LoadImage imports a docker-archive tarball (e.g. `make image`'s) into
// the real node's containerd.
func (c *Cluster) LoadImage(ctx context.Context, archive string) error {
	if c.node == nil {
		return fmt.Errorf("no real node to load %s into (%s=kwok)", archive, NodeEnv)
	}
	return c.node.importArchive(ctx, archive)
}

// TagImage gives an image the real node has another name, so a pod naming
// that image runs it (e.g. the fake agent as the Paperclip image).
func (c *Cluster) TagImage(ctx context.Context, image, as string) error {
	if c.node == nil {
		return fmt.Errorf("no real node to tag %s in (%s=kwok)", image, NodeEnv)
	}
	cmd := exec.CommandContext(ctx, "ctr", "--address", c.node.socket, "--namespace", "k8s.io", "images", "tag", "--force", image, as)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images tag %s %s: %v: %s", image, as, err, strings.TrimSpace(string(b)))
	}
	return nil
}
