package ociimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of an image's single layer.
type File struct {
	// Path is absolute in the image, e.g. /usr/local/bin/clipjob-webhook.
	Path string
	// Source is a file on the host whose content is copied; or Data is the
	// content; or Link makes a symbolic link to that target; or Dir makes
	// a directory (one that must exist with its own mode or owner: parent
	// directories are otherwise made 0755, root's).
	Source string
	Data   []byte
	Link   string
	Dir    bool
	// Mode is the permission bits (default 0o755 for Source and Dir, 0o644
	// for Data), with the sticky bit (os.ModeSticky's 01000) for /tmp.
	Mode int64
	// UID and GID own it (default root).
	UID, GID int
}

// Spec is an image: its files and how it runs.
type Spec struct {
	// Tag is the reference it is loaded under, e.g. docker.io/local/pause:1.
	Tag        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	// User as uid:gid; empty runs as the image's root.
	User       string
	Env        []string
	WorkingDir string
}

// epoch stamps every file, so the same inputs make the same layer digest.
var epoch = time.Unix(0, 0).UTC()

// Build assembles the image: one layer holding the files (and their parent
// directories), a config for linux on this machine's architecture.
func Build(s Spec) (v1.Image, error) {
	var layerTar bytes.Buffer
	if err := writeLayer(&layerTar, s.Files); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	})
	if err != nil {
		return nil, err
	}
	return withLayer(s, layer)
}

// withLayer is the image of s with its one layer.
func withLayer(s Spec, layer v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	// A config without a platform is filtered out by containerd's import.
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.User = s.User
	cf.Config.Env = s.Env
	cf.Config.WorkingDir = s.WorkingDir
	return mutate.ConfigFile(img, cf)
}

// WriteArchive builds the image and writes it, tagged s.Tag, as a
// docker-archive tarball at path. The layer is written once, into a file
// beside path, not held in memory (an image with a Node.js install in it
// is over a gigabyte), and it stays uncompressed, as `docker save` writes
// it: the archive only ever travels to a containerd on the same machine,
// and gzip was most of the time to make it (the Paperclip image: 70 s or
// more of both cores, 36 s without). containerd's import takes as long
// either way: it writes the layer twice, into its content store and
// unpacked, syncing each, and a gunzip of 523 MiB costs about what
// writing the extra gigabyte does.
func WriteArchive(path string, s Spec) error {
	ref, err := name.NewTag(s.Tag)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", s.Tag, err)
	}
	layerFile := path + ".layer.tar"
	defer os.Remove(layerFile)
	layer, err := writeLayerFile(layerFile, s.Files)
	if err != nil {
		return err
	}
	img, err := withLayer(s, layer)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeLayerFile writes the layer of files to path as a plain tar stream
// (the same files make the same bytes) and returns it as an uncompressed
// layer.
func writeLayerFile(path string, files []File) (v1.Layer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if err := writeLayer(w, files); err != nil {
		f.Close()
		return nil, err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return &uncompressedLayer{path: path, size: st.Size(),
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}, nil
}

// uncompressedLayer is a layer kept as a plain tar file: its blob is its
// tar stream, so its digest is its diff ID. go-containerregistry's own
// layers always offer a gzip-compressed blob.
type uncompressedLayer struct {
	path   string
	size   int64
	digest v1.Hash
}

func (l *uncompressedLayer) Digest() (v1.Hash, error) { return l.digest, nil }
func (l *uncompressedLayer) DiffID() (v1.Hash, error) { return l.digest, nil }
func (l *uncompressedLayer) Size() (int64, error)     { return l.size, nil }
func (l *uncompressedLayer) MediaType() (types.MediaType, error) {
	return types.DockerUncompressedLayer, nil
}
func (l *uncompressedLayer) Compressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *uncompressedLayer) Uncompressed() (io.ReadCloser, error) {
	return os.Open(l.path)
}

// Paths lists the files and directories of an image, flattened over its
// layers, each as an absolute path ("/usr/local/bin/clipjob").
func Paths(img v1.Image) ([]string, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return nil, err
			}
			seen["/"+strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = true
		}
		rc.Close()
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// writeLayer writes the files to w as a tar stream in path order, each
// parent directory once before its children (made 0755, root's, unless
// listed as a Dir).
func writeLayer(w io.Writer, files []File) error {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	var addDir func(string) error
	addDir = func(d string) error {
		if d == "/" || d == "." || dirs[d] {
			return nil
		}
		if err := addDir(path.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	seen := map[string]bool{}
	for _, f := range sorted {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return fmt.Errorf("image file %q: want a clean absolute path", f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("image file %q listed twice", f.Path)
		}
		seen[f.Path] = true
		if err := addDir(path.Dir(f.Path)); err != nil {
			return err
		}
		h := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), ModTime: epoch, Mode: f.Mode, Uid: f.UID, Gid: f.GID, Format: tar.FormatPAX}
		var data []byte
		switch {
		case f.Dir:
			dirs[f.Path] = true
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
			if h.Mode == 0 {
				h.Mode = 0o777
			}
		case f.Source != "":
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return fmt.Errorf("image file %s: %w", f.Path, err)
			}
			data = b
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		default:
			data = f.Data
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeDir {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}
