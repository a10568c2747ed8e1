package ociimage

import (
	"fmt"
	"os"
	"path/filepath"
)

// The Paperclip image: the Paperclip server as an operator's image has it,
// with clipjob's adapter installed and registered, and the fake agent in
// place of the agents' CLIs. Agent Jobs inherit the server's image, so the
// same image is the agents' (docs/paperclip.md).
const (
	// PaperclipUser is who the server runs as: Paperclip's own image runs
	// as its node user, uid and gid 1000, the uid clipjob gives agent pods.
	PaperclipUser = "1000:1000"
	// PaperclipHome is HOME and PAPERCLIP_HOME, as in Paperclip's image:
	// the shared volume's mount point.
	PaperclipHome = "/paperclip"
	// PaperclipApp holds the npm install of paperclipai.
	PaperclipApp = "/app"
	// PaperclipServerMain is what the image runs, as Paperclip's image runs
	// its server's dist/index.js.
	PaperclipServerMain = PaperclipApp + "/node_modules/@paperclipai/server/dist/index.js"
	// PaperclipAdapters is the npm --prefix clipjob's adapter is installed
	// into, as the adapter's README installs it.
	PaperclipAdapters = "/opt/paperclip-adapters"
	// ClipjobAdapter is the adapter's package directory there.
	ClipjobAdapter = PaperclipAdapters + "/node_modules/@clipjob/paperclip-adapter"
	// PaperclipEntrypoint registers the adapter, then runs the command.
	PaperclipEntrypoint = "/usr/local/bin/paperclip-entrypoint"
	// RegisterCommand is the adapter's bin that writes its records into
	// Paperclip's home (adapters/paperclip/src/register.ts).
	RegisterCommand = "clipjob-paperclip-register"
	// FirstRunCommand is the adapter's bin that makes a company and an
	// agent and prints its first run's log (adapters/paperclip/src/firstrun.ts):
	// the operator's one command after applying Paperclip's manifest.
	FirstRunCommand = "clipjob-paperclip-first-run"
)

// paperclipEntrypoint is the image's entrypoint script.
const paperclipEntrypoint = `#!/bin/sh
# Paperclip loads external adapters at start from records in its home, the
# volume mounted at /paperclip, where nothing of the image's build is:
# register clipjob's adapter there at every start, then run the server.
set -e
` + RegisterCommand + `
exec "$@"
`

// PaperclipEnv is the image's environment: Paperclip's own image's, and a
// PATH with the agents' CLIs and Node.js.
var PaperclipEnv = []string{
	"PATH=/usr/local/bin:/usr/bin:/bin",
	"NODE_ENV=production",
	"HOME=" + PaperclipHome,
	"PAPERCLIP_HOME=" + PaperclipHome,
	"PAPERCLIP_INSTANCE_ID=default",
	"PAPERCLIP_CONFIG=" + PaperclipHome + "/instances/default/config.json",
	"HOST=0.0.0.0",
	"PORT=3100",
	"SERVE_UI=true",
	"PAPERCLIP_DEPLOYMENT_MODE=authenticated",
	"PAPERCLIP_DEPLOYMENT_EXPOSURE=private",
}

// PaperclipInputs are the host files the image is made of.
type PaperclipInputs struct {
	// Node is the Node.js 24 binary.
	Node string
	// Server is the directory paperclipai was npm-installed in (its
	// package.json and node_modules), hack/paperclip/install.sh's server/.
	Server string
	// Adapters is the npm --prefix the adapter's tarball was installed in.
	Adapters string
	// FakeAgent is a static build of e2e/images/fakeagent; Busybox a
	// static busybox.
	FakeAgent, Busybox string
	// CACerts is the CA bundle for the server's HTTPS calls ("" for none).
	CACerts string
}

// Paperclip is the Paperclip image's spec. missing names shared libraries
// some program of the install needs and this machine lacks (see
// SharedLibraries): the server does not run those programs.
func Paperclip(tag string, in PaperclipInputs) (s Spec, missing []string, err error) {
	for _, need := range []struct{ path, what string }{
		{in.Node, "the Node.js binary"},
		{filepath.Join(in.Server, "node_modules", "@paperclipai", "server", "dist", "index.js"), "the Paperclip server (npm install paperclipai; hack/paperclip/install.sh)"},
		{filepath.Join(in.Server, "node_modules", "paperclipai", "dist", "index.js"), "the paperclipai CLI"},
		{filepath.Join(in.Adapters, "node_modules", "@clipjob", "paperclip-adapter", "dist", "src", "register.js"), "clipjob's adapter with its register command (npm install --prefix DIR the adapter's tarball)"},
		{in.FakeAgent, "the fake agent"},
	} {
		if _, err := os.Stat(need.path); err != nil {
			return Spec{}, nil, fmt.Errorf("the Paperclip image needs %s: %w", need.what, err)
		}
	}
	s = Spec{Tag: tag, User: PaperclipUser, Env: PaperclipEnv, WorkingDir: PaperclipApp,
		Entrypoint: []string{PaperclipEntrypoint}, Cmd: []string{"node", PaperclipServerMain}}
	s.Files = []File{
		{Path: "/usr/local/bin/node", Source: in.Node, Mode: 0o755},
		{Path: "/usr/local/bin/paperclipai", Link: PaperclipApp + "/node_modules/paperclipai/dist/index.js"},
		{Path: "/usr/local/bin/" + RegisterCommand, Link: ClipjobAdapter + "/dist/src/register.js"},
		{Path: "/usr/local/bin/" + FirstRunCommand, Link: ClipjobAdapter + "/dist/src/firstrun.js"},
		{Path: PaperclipEntrypoint, Data: []byte(paperclipEntrypoint), Mode: 0o755},
		// Scripts' #!/usr/bin/env node.
		{Path: "/usr/bin/env", Link: "/bin/busybox"},
		// PostgreSQL's initdb looks its user up; Paperclip's image names
		// uid 1000 node, with its home on the volume.
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000:node:" + PaperclipHome + ":/bin/sh\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnode:x:1000:\n")},
		// Names in /etc/hosts (a pod's hostAliases) before DNS, as a
		// Debian-based image has it: without the file, glibc asks DNS
		// first and stops at its "no such name".
		{Path: "/etc/nsswitch.conf", Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
		{Path: PaperclipHome, Dir: true, Mode: 0o775, UID: 1000, GID: 1000},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
	}
	if in.CACerts != "" {
		s.Files = append(s.Files, File{Path: "/etc/ssl/certs/ca-certificates.crt", Source: in.CACerts, Mode: 0o644})
	}
	agent, err := FakeAgentFiles(in.FakeAgent, in.Busybox)
	if err != nil {
		return Spec{}, nil, err
	}
	s.Files = append(s.Files, agent...)
	for _, t := range []struct{ host, at string }{{in.Server, PaperclipApp}, {in.Adapters, PaperclipAdapters}} {
		tree, err := Tree(t.host, t.at)
		if err != nil {
			return Spec{}, nil, err
		}
		// The install's own directory is the image's; its mode is npm's.
		s.Files = append(s.Files, tree[1:]...)
	}
	libs, missing, err := SharedLibraries(s.Files)
	if err != nil {
		return Spec{}, nil, err
	}
	s.Files = append(s.Files, libs...)
	return s, missing, nil
}
