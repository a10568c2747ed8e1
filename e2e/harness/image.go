package harness

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/internal/ociimage"
)

var imageOnce struct {
	sync.Once
	ref string
	err error
}

// LoadClipjobImage builds clipjob's image as `make image` does (static
// binaries of ./cmd/..., assembled by internal/ociimage), tagged as the
// chart's default image, and loads it into the real node. Built once per
// run; returns the reference.
func LoadClipjobImage(ctx context.Context, c *cluster.Cluster) (string, error) {
	imageOnce.Do(func() {
		imageOnce.ref, imageOnce.err = loadClipjobImage(ctx, c)
	})
	return imageOnce.ref, imageOnce.err
}

func loadClipjobImage(ctx context.Context, c *cluster.Cluster) (string, error) {
	ch, err := charts.Load()
	if err != nil {
		return "", err
	}
	ref := "ghcr.io/paperclipai/clipjob:" + ch.Metadata.AppVersion
	dir := filepath.Join(c.Dir, "clipjob-image")
	bins := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bins, 0o755); err != nil {
		return "", err
	}
	if err := cluster.BuildStatic(ctx, bins, "./cmd/..."); err != nil {
		return "", err
	}
	spec, err := ociimage.ClipjobFromDir(ref, bins)
	if err != nil {
		return "", err
	}
	archive := filepath.Join(dir, "clipjob-image.tar")
	if err := ociimage.WriteArchive(archive, spec); err != nil {
		return "", err
	}
	return ref, c.LoadImage(ctx, archive)
}
