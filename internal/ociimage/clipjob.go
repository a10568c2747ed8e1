package ociimage

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
)

// rootfs holds the files of clipjob's image that are not binaries: the
// nonroot user (uid and gid 65532, as distroless names it). The Dockerfile
// copies the same directory.
//
//go:embed rootfs
var rootfs embed.FS

// ClipjobUser is who clipjob's containers run as.
const ClipjobUser = "65532:65532"

// BinDir is where clipjob's binaries live in its image; the chart runs
// them by these paths.
const BinDir = "/usr/local/bin"

// Clipjob is clipjob's own image: the binaries (file name -> host path,
// static builds of ./cmd/...) in BinDir, the files of rootfs/, run as
// ClipjobUser with the webhook as entrypoint.
func Clipjob(tag string, binaries map[string]string) (Spec, error) {
	s := Spec{Tag: tag, User: ClipjobUser, Entrypoint: []string{path.Join(BinDir, "clipjob-webhook")}}
	names := make([]string, 0, len(binaries))
	for n := range binaries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s.Files = append(s.Files, File{Path: path.Join(BinDir, n), Source: binaries[n], Mode: 0o755})
	}
	err := fs.WalkDir(rootfs, "rootfs", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := rootfs.ReadFile(p)
		if err != nil {
			return err
		}
		s.Files = append(s.Files, File{Path: "/" + p[len("rootfs/"):], Data: data, Mode: 0o644})
		return nil
	})
	return s, err
}

// ClipjobFromDir is Clipjob with every regular file of dir (static builds
// of ./cmd/...) as the binaries.
func ClipjobFromDir(tag, dir string) (Spec, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Spec{}, err
	}
	bins := map[string]string{}
	for _, e := range entries {
		if e.Type().IsRegular() {
			bins[e.Name()] = filepath.Join(dir, e.Name())
		}
	}
	if len(bins) == 0 {
		return Spec{}, fmt.Errorf("%s holds no binaries: build ./cmd/... into it first", dir)
	}
	return Clipjob(tag, bins)
}
