package ociimage

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// dockerfileImage is what the Dockerfile's last stage puts in its image,
// read instruction by instruction; an instruction this reader does not
// know fails the test, so a Dockerfile change cannot go unnoticed.
type dockerfileImage struct {
	files      []string
	user       string
	entrypoint []string
}

func readDockerfile(t *testing.T, root string, binaries []string) dockerfileImage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var last []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			last = nil
		}
		last = append(last, line)
	}
	if len(last) == 0 || last[0] != "FROM scratch" {
		t.Fatalf("the Dockerfile's last stage starts %q; internal/ociimage builds FROM scratch", last)
	}
	var img dockerfileImage
	for _, in := range last[1:] {
		word, rest, _ := strings.Cut(in, " ")
		switch word {
		case "COPY":
			f := strings.Fields(rest)
			switch {
			case len(f) == 3 && f[0] == "--from=build" && f[1] == "/out/":
				for _, n := range binaries {
					img.files = append(img.files, path.Join(f[2], n))
				}
			case len(f) == 2 && !strings.HasPrefix(f[0], "--"):
				src := filepath.Join(root, f[0])
				err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
					if err != nil || d.IsDir() {
						return err
					}
					rel, _ := filepath.Rel(src, p)
					img.files = append(img.files, path.Join(f[1], filepath.ToSlash(rel)))
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("Dockerfile: %q: a COPY this test does not know", in)
			}
		case "USER":
			img.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &img.entrypoint); err != nil {
				t.Fatalf("Dockerfile: %q: %v", in, err)
			}
		default:
			t.Fatalf("Dockerfile: %q: an instruction internal/ociimage does not reproduce", in)
		}
	}
	sort.Strings(img.files)
	return img
}

// commands are the main packages under cmd/: the binaries `go build
// ./cmd/...` makes.
func commands(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(root, "cmd", e.Name(), "main.go"))
		if err == nil && (strings.HasPrefix(string(b), "package main\n") || strings.Contains(string(b), "\npackage main\n")) {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		t.Fatal("no main package under cmd/")
	}
	return out
}

// TestDockerfileMakesTheSameFiles: the image `make image` assembles holds
// exactly the files the Dockerfile's image holds, runs as the same user
// with the same entrypoint.
func TestDockerfileMakesTheSameFiles(t *testing.T) {
	root := filepath.Join("..", "..")
	cmds := commands(t, root)
	want := readDockerfile(t, root, cmds)

	bins := map[string]string{}
	for _, c := range cmds {
		p := filepath.Join(t.TempDir(), c)
		if err := os.WriteFile(p, []byte("#!binary "+c), 0o755); err != nil {
			t.Fatal(err)
		}
		bins[c] = p
	}
	spec, err := Clipjob("ghcr.io/paperclipai/clipjob:test", bins)
	if err != nil {
		t.Fatal(err)
	}
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := Paths(img)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	dirs := map[string]bool{}
	for _, p := range paths {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for _, p := range paths {
		if !dirs[p] {
			files = append(files, p)
		}
	}
	if !reflect.DeepEqual(files, want.files) {
		t.Errorf("files:\n make image: %q\n Dockerfile: %q", files, want.files)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != want.user || !reflect.DeepEqual(cf.Config.Entrypoint, want.entrypoint) {
		t.Errorf("make image runs %q as %q; the Dockerfile %q as %q", cf.Config.Entrypoint, cf.Config.User, want.entrypoint, want.user)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s: containerd's import filters out an image without one", cf.OS, cf.Architecture)
	}
}

// TestArchiveIsReproducibleAndLoadable: the same files make the same image
// digest (no timestamps leak in), the archive reads back under its tag
// with each file's content and mode, and its layer is a plain tar stream
// (containerd's import would otherwise spend most of its time in gzip).
func TestArchiveIsReproducibleAndLoadable(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "agent")
	if err := os.WriteFile(src, []byte("agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Tag: "docker.io/local/fake-agent:1", Files: []File{
		{Path: "/usr/local/bin/claude", Source: src},
		{Path: "/bin/sh", Link: "busybox"},
		{Path: "/etc/motd", Data: []byte("hi\n")},
	}, Entrypoint: []string{"/usr/local/bin/claude"}}
	var digests []string
	for i := 0; i < 2; i++ {
		out := filepath.Join(dir, "img.tar")
		if err := WriteArchive(out, spec); err != nil {
			t.Fatal(err)
		}
		tag, _ := name.NewTag(spec.Tag)
		img, err := tarball.ImageFromPath(out, &tag)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
		if blob := archiveMember(t, out, ".tar"); len(blob) < 2 || (blob[0] == 0x1f && blob[1] == 0x8b) {
			t.Errorf("the archive's layer is not a plain tar stream (%d bytes, gzip: %v)", len(blob), len(blob) >= 2 && blob[0] == 0x1f)
		}
		paths, err := Paths(img)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"/bin", "/bin/sh", "/etc", "/etc/motd", "/usr", "/usr/local", "/usr/local/bin", "/usr/local/bin/claude"}
		if !reflect.DeepEqual(paths, want) {
			t.Fatalf("paths %q, want %q", paths, want)
		}
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of the same files: %s and %s", digests[0], digests[1])
	}
}

// archiveMember is the content of the archive's one member whose name
// ends with suffix.
func archiveMember(t *testing.T, archive, suffix string) []byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no member named *%s (%v)", archive, suffix, err)
		}
		if strings.HasSuffix(h.Name, suffix) {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestBadFilesAreRefused: a relative or unclean path, or one listed twice,
// is an error naming it, not a layer that unpacks somewhere else.
func TestBadFilesAreRefused(t *testing.T) {
	for _, files := range [][]File{
		{{Path: "usr/bin/x", Data: []byte("x")}},
		{{Path: "/usr/../etc/passwd", Data: []byte("x")}},
		{{Path: "/x", Data: []byte("a")}, {Path: "/x", Data: []byte("b")}},
		{{Path: "/x", Source: "/nonexistent/clipjob-test"}},
	} {
		if _, err := Build(Spec{Files: files}); err == nil || !strings.Contains(err.Error(), files[0].Path) {
			t.Errorf("%+v: error %v, want one naming %s", files, err, files[0].Path)
		}
	}
}
