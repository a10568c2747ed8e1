package ociimage

import (
	"archive/tar"
	"debug/elf"
	"encoding/binary"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one file of an image's layer.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// readLayer reads every entry of a one-layer image, by absolute path.
func readLayer(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out["/"+strings.TrimSuffix(h.Name, "/")] = entry{h, data}
	}
}

// staticELF writes the smallest ELF file debug/elf reads, with no
// interpreter: a static busybox for FakeAgentFiles' check.
func staticELF(t *testing.T, p string) {
	t.Helper()
	h := make([]byte, 64)
	copy(h, elf.ELFMAG)
	h[4], h[5], h[6] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	binary.LittleEndian.PutUint16(h[16:], uint16(elf.ET_EXEC))
	binary.LittleEndian.PutUint16(h[18:], uint16(elf.EM_X86_64))
	binary.LittleEndian.PutUint32(h[20:], uint32(elf.EV_CURRENT))
	binary.LittleEndian.PutUint16(h[52:], 64) // header size
	binary.LittleEndian.PutUint16(h[54:], 56) // program header size
	binary.LittleEndian.PutUint16(h[58:], 64) // section header size
	if err := os.WriteFile(p, h, 0o755); err != nil {
		t.Fatal(err)
	}
}

// dynamicProgram is a program of this machine that its dynamic loader
// runs, standing in for Node.js: what it needs must come into the image.
func dynamicProgram(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/bin/ls", "/usr/bin/ls", "/bin/sh", "/usr/bin/env"} {
		if f, err := elf.Open(p); err == nil {
			dynamic := f.Section(".interp") != nil
			f.Close()
			if dynamic {
				return p
			}
		}
	}
	t.Fatal("no dynamically linked program (/bin/ls, /bin/sh, /usr/bin/env) on this machine to stand in for Node.js")
	return ""
}

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPaperclipImage: the archive `make paperclip-image` writes runs
// Paperclip's server as Paperclip's image does (user, home, env), starts
// through an entrypoint that registers clipjob's adapter before the server,
// and holds every file that needs: Node.js and the libraries it loads, the
// install with its links, the adapter's register command, the fake agent
// under the agents' names, the shell scripts need.
func TestPaperclipImage(t *testing.T) {
	dir := t.TempDir()
	server, adapters := filepath.Join(dir, "server"), filepath.Join(dir, "adapters")
	writeTree(t, server, map[string]string{
		"package.json": `{"dependencies": {"paperclipai": "2026.916.1"}}`,
		"node_modules/@paperclipai/server/dist/index.js": "// the server",
		"node_modules/paperclipai/dist/index.js":         "#!/usr/bin/env node\n// the CLI",
	})
	// npm's links: relative, and one absolute into the install.
	if err := os.Symlink("paperclipai/dist/index.js", filepath.Join(server, "node_modules", ".bin-paperclipai")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(server, "node_modules", "paperclipai"), filepath.Join(server, "node_modules", "cli")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, adapters, map[string]string{
		"package.json": `{"dependencies": {"@clipjob/paperclip-adapter": "file:clipjob-paperclip-adapter-0.1.0.tgz"}}`,
		"node_modules/@clipjob/paperclip-adapter/package.json":          `{"name": "@clipjob/paperclip-adapter", "main": "./dist/src/index.js"}`,
		"node_modules/@clipjob/paperclip-adapter/dist/src/index.js":     "// the adapter",
		"node_modules/@clipjob/paperclip-adapter/dist/src/register.js":  "#!/usr/bin/env node\n// registers",
		"node_modules/@clipjob/paperclip-adapter/dist/src/firstrun.js":  "#!/usr/bin/env node\n// a first run",
		"node_modules/@clipjob/paperclip-adapter/opencode/package.json": `{"main": "./index.js"}`,
	})
	busybox, agent := filepath.Join(dir, "busybox"), filepath.Join(dir, "fakeagent")
	staticELF(t, busybox)
	if err := os.WriteFile(agent, []byte("agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	node := dynamicProgram(t)
	spec, _, err := Paperclip("docker.io/local/paperclip-clipjob:test", PaperclipInputs{Node: node, Server: server, Adapters: adapters, FakeAgent: agent, Busybox: busybox})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "paperclip.tar")
	if err := WriteArchive(archive, spec); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(spec.Tag)
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "1000:1000" || !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/paperclip-entrypoint"}) ||
		!slices.Equal(c.Cmd, []string{"node", "/app/node_modules/@paperclipai/server/dist/index.js"}) || c.WorkingDir != "/app" {
		t.Errorf("runs %q %q in %q as %q; want the entrypoint, then node and the server's dist/index.js, in /app, as 1000:1000", c.Entrypoint, c.Cmd, c.WorkingDir, c.User)
	}
	for _, want := range []string{"HOME=/paperclip", "PAPERCLIP_HOME=/paperclip", "PAPERCLIP_CONFIG=/paperclip/instances/default/config.json", "PATH=/usr/local/bin:/usr/bin:/bin"} {
		if !slices.Contains(c.Env, want) {
			t.Errorf("env %q lacks %s (Paperclip's image has it)", c.Env, want)
		}
	}

	files := readLayer(t, img)
	regular := func(p string, exec bool) entry {
		t.Helper()
		e, ok := files[p]
		if !ok || e.hdr.Typeflag != tar.TypeReg {
			t.Errorf("%s: not a regular file in the image", p)
			return entry{hdr: &tar.Header{}}
		}
		if exec && e.hdr.Mode&0o111 == 0 {
			t.Errorf("%s: mode %o, want it executable", p, e.hdr.Mode)
		}
		return e
	}
	// The entrypoint registers clipjob's adapter, then runs the server.
	script := string(regular("/usr/local/bin/paperclip-entrypoint", true).data)
	reg, run := strings.Index(script, "\nclipjob-paperclip-register\n"), strings.Index(script, `exec "$@"`)
	if !strings.HasPrefix(script, "#!/bin/sh\n") || reg < 0 || run < reg || !strings.Contains(script, "set -e") {
		t.Errorf("entrypoint:\n%s\nwant a shell script that runs clipjob-paperclip-register (stopping on its failure), then execs its arguments", script)
	}
	// Every link leads to a file of the image: the register command to the
	// adapter's, the agents' CLIs to the fake agent, npm's links into /app.
	resolve := func(p string) string {
		for i := 0; i < 40; i++ {
			e, ok := files[p]
			if !ok || e.hdr.Typeflag != tar.TypeSymlink {
				return p
			}
			target := e.hdr.Linkname
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(p), target)
			}
			p = target
		}
		return p
	}
	for p, e := range files {
		if e.hdr.Typeflag == tar.TypeSymlink {
			if _, ok := files[resolve(p)]; !ok {
				t.Errorf("link %s -> %s leads to %s, which the image does not hold", p, e.hdr.Linkname, resolve(p))
			}
		}
	}
	for link, want := range map[string]string{
		"/usr/local/bin/clipjob-paperclip-register":  "/opt/paperclip-adapters/node_modules/@clipjob/paperclip-adapter/dist/src/register.js",
		"/usr/local/bin/clipjob-paperclip-first-run": "/opt/paperclip-adapters/node_modules/@clipjob/paperclip-adapter/dist/src/firstrun.js",
		"/usr/local/bin/paperclipai":                 "/app/node_modules/paperclipai/dist/index.js",
		"/usr/local/bin/claude":                      "/usr/local/bin/fakeagent",
		"/usr/local/bin/opencode":                    "/usr/local/bin/fakeagent",
		"/usr/bin/env":                               "/bin/busybox",
		"/bin/sh":                                    "/bin/busybox",
		"/app/node_modules/cli":                      "/app/node_modules/paperclipai",
	} {
		if got := resolve(link); got != want {
			t.Errorf("%s leads to %s, want %s", link, got, want)
		}
	}
	regular("/opt/paperclip-adapters/node_modules/@clipjob/paperclip-adapter/dist/src/register.js", true)
	regular("/opt/paperclip-adapters/node_modules/@clipjob/paperclip-adapter/dist/src/firstrun.js", true)
	regular("/opt/paperclip-adapters/node_modules/@clipjob/paperclip-adapter/opencode/package.json", false)
	regular("/app/node_modules/@paperclipai/server/dist/index.js", false)
	regular("/usr/local/bin/node", true)
	// What the dynamic loader needs to start Node.js, from this machine.
	f, err := elf.Open(node)
	if err != nil {
		t.Fatal(err)
	}
	interp, _ := io.ReadAll(f.Section(".interp").Open())
	f.Close()
	if p := resolve(strings.TrimRight(string(interp), "\x00")); files[p].hdr == nil {
		t.Errorf("the dynamic loader %s is not in the image", interp)
	}
	var libc bool
	for p := range files {
		libc = libc || strings.HasPrefix(path.Base(p), "libc.so")
	}
	if !libc {
		t.Error("no C library in the image: Node.js would not start")
	}
	// The server's user, its home, and a /tmp anyone may write.
	if !strings.Contains(string(regular("/etc/passwd", false).data), ":1000:1000:node:/paperclip:") {
		t.Errorf("/etc/passwd names no uid 1000 with home /paperclip (PostgreSQL's initdb looks its user up):\n%s", files["/etc/passwd"].data)
	}
	if !strings.Contains(string(regular("/etc/nsswitch.conf", false).data), "hosts: files dns") {
		t.Errorf("/etc/nsswitch.conf does not look names up in /etc/hosts first (a pod's hostAliases):\n%s", files["/etc/nsswitch.conf"].data)
	}
	if h := files["/paperclip"].hdr; h == nil || h.Typeflag != tar.TypeDir || h.Uid != 1000 || h.Gid != 1000 {
		t.Errorf("/paperclip: %+v; want a directory of uid and gid 1000", h)
	}
	if h := files["/tmp"].hdr; h == nil || h.Mode != 0o1777 {
		t.Errorf("/tmp: %+v; want mode 1777", h)
	}
}

// TestPaperclipImageNamesWhatIsMissing: an input missing is an error naming
// it and how to make it, not an image that fails at start.
func TestPaperclipImageNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	server := filepath.Join(dir, "server")
	writeTree(t, server, map[string]string{
		"node_modules/@paperclipai/server/dist/index.js": "",
		"node_modules/paperclipai/dist/index.js":         "",
	})
	_, _, err := Paperclip("docker.io/local/p:1", PaperclipInputs{Node: dynamicProgram(t), Server: server, Adapters: filepath.Join(dir, "none")})
	if err == nil || !strings.Contains(err.Error(), "clipjob's adapter with its register command") {
		t.Errorf("error %v; want one naming clipjob's adapter", err)
	}
}
