package harness

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// AdapterPackageDirs are the package directories of clipjob's adapter
// its README registers with Paperclip, by the type each registers: the
// package itself (claude_k8s) and its opencode/ directory.
var AdapterPackageDirs = map[string]string{"claude_k8s": "", "opencode_k8s": "opencode"}

// ServerOptions say how StartPaperclipServer starts a host-run server.
type ServerOptions struct {
	// VolumeDir, when set, is the agents' volume: the server's home goes
	// on it at /paperclip (HomeOnVolume), as Paperclip's image keeps it, so
	// the runs' directories are where the server keeps them.
	VolumeDir string
	// Prepare, when set, is called once the server's files are placed and
	// before it starts: to place more of them (in p.Files(), then p.Own)
	// and add to p.Env.
	Prepare func(p *Paperclip) error
}

// StartPaperclipServer starts a Paperclip server on this machine with
// clipjob's adapter installed as the adapter's README tells operators:
// the README's CLIPJOB_* settings in its environment pointing at spec's
// API server and relay, the packed tarball installed with npm by the
// server's user, and both package directories registered with
// Paperclip's adapter manager. The real-node tier and make bench start
// their servers with it. On an error the server is stopped and its
// directory kept.
func StartPaperclipServer(ctx context.Context, spec AdapterSpec, o ServerOptions) (_ *Paperclip, err error) {
	pc, err := NewPaperclip()
	if err != nil {
		return nil, err
	}
	if o.VolumeDir != "" {
		if err := pc.HomeOnVolume(o.VolumeDir); err != nil {
			pc.Close(false)
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			pc.Close(true) // stopped and unmounted; its logs kept
			err = fmt.Errorf("%w (the server's directory is kept: %s)", err, pc.Dir)
		}
	}()
	// What the server reads, as an operator would place it.
	files := map[string]string{"kubeconfig": spec.Kubeconfig, "relay-token": spec.RelayTokenFile, "relay-ca.crt": spec.RelayCAFile}
	for name, from := range files {
		data, err := os.ReadFile(from)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(pc.Files(), name), data, 0o600); err != nil {
			return nil, err
		}
	}
	pkg, err := packAdapter(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pc.Own(pc.Files()); err != nil {
		return nil, err
	}
	pc.Env = map[string]string{
		"CLIPJOB_KUBECONFIG":       filepath.Join(pc.Files(), "kubeconfig"),
		"CLIPJOB_NAMESPACE":        spec.Namespace,
		"CLIPJOB_RELAY_URL":        spec.RelayURL,
		"CLIPJOB_RELAY_TOKEN_FILE": filepath.Join(pc.Files(), "relay-token"),
		"CLIPJOB_RELAY_CA_FILE":    filepath.Join(pc.Files(), "relay-ca.crt"),
	}
	if o.Prepare != nil {
		if err := o.Prepare(pc); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if err := pc.Start(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "e2e: the Paperclip server is up in %s at %s (log %s)\n", time.Since(start).Round(time.Second), pc.URL, pc.Log)
	// The README's install: npm install of the packed tarball by the
	// server's user, then the adapter manager for each directory.
	prefix := filepath.Join(pc.Files(), "adapter")
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return nil, err
	}
	if err := pc.Own(prefix); err != nil {
		return nil, err
	}
	if err := installAdapter(ctx, pc, prefix, pkg); err != nil {
		return nil, err
	}
	for typ, sub := range AdapterPackageDirs {
		dir := filepath.Join(prefix, "node_modules", "@clipjob", "paperclip-adapter", sub)
		if err := pc.InstallAdapter(ctx, dir, typ); err != nil {
			return nil, fmt.Errorf("installing the adapter %s as the README says: %w", typ, err)
		}
	}
	return pc, nil
}

// adapterInstalls are this process's installs of the adapter's tarball,
// by its digest: the first server's is the README's (`npm install` by the
// server's user), and later servers of the process get a copy of it, the
// same files: npm's resolution and extraction cost each server 6-8 s of
// CPU, and a tier starts four.
var adapterInstalls struct {
	sync.Mutex
	dirs map[string]string
}

// installAdapter installs tarball pkg into prefix as the server's user.
func installAdapter(ctx context.Context, pc *Paperclip, prefix, pkg string) error {
	data, err := os.ReadFile(pkg)
	if err != nil {
		return err
	}
	digest := fmt.Sprintf("%x", sha256.Sum256(data))
	adapterInstalls.Lock()
	defer adapterInstalls.Unlock()
	if from, ok := adapterInstalls.dirs[digest]; ok {
		if out, err := exec.CommandContext(ctx, "cp", "-a", from+"/.", prefix+"/").CombinedOutput(); err != nil {
			return fmt.Errorf("copying this process's install of the adapter from %s: %w\n%s", from, err, out)
		}
		return pc.Own(prefix)
	}
	install := pc.Command(ctx, prefix, "npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", pkg)
	if out, err := install.CombinedOutput(); err != nil {
		return fmt.Errorf("npm install %s (the README's install, as the server's user): %w\n%s", pkg, err, out)
	} else if strings.Contains(string(out), "EBADENGINE") {
		return fmt.Errorf("npm install %s warned of an engine mismatch on Paperclip's Node:\n%s", pkg, out)
	}
	// Kept apart from the server's directory, which goes with the server.
	keep := filepath.Join(os.TempDir(), fmt.Sprintf("clipjob-adapter-install-%d-%s", os.Getpid(), digest[:12]))
	removeStaleAdapterInstalls()
	if err := os.RemoveAll(keep); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", prefix, keep).CombinedOutput(); err != nil {
		return fmt.Errorf("keeping the adapter's install for this process's other servers: %w\n%s", err, out)
	}
	if adapterInstalls.dirs == nil {
		adapterInstalls.dirs = map[string]string{}
	}
	adapterInstalls.dirs[digest] = keep
	return nil
}

// removeStaleAdapterInstalls removes the kept installs of processes that
// have ended.
func removeStaleAdapterInstalls() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "clipjob-adapter-install-*"))
	for _, dir := range dirs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(dir), "clipjob-adapter-install-%d-", &pid); err != nil || pid <= 1 {
			continue
		}
		if syscall.Kill(pid, 0) != nil {
			_ = os.RemoveAll(dir)
		}
	}
}

// InstallAdapter registers the adapter package in directory dir (a path
// the server's user can read) with Paperclip's adapter manager, as an
// operator does with a local path, and checks it registered type typ.
func (p *Paperclip) InstallAdapter(ctx context.Context, dir, typ string) error {
	var installed map[string]any
	if err := p.Do(ctx, http.MethodPost, "/api/adapters/install", map[string]any{"packageName": dir, "isLocalPath": true}, &installed); err != nil {
		return err
	}
	if installed["type"] != typ {
		return fmt.Errorf("installing %s registered type %v, want %s", dir, installed["type"], typ)
	}
	return nil
}

// packAdapter is `npm pack` of the adapter (its prepack builds it), in the
// server's files, readable by the server's user.
func packAdapter(ctx context.Context, pc *Paperclip) (string, error) {
	// As the invoking user, with their npm cache: the checkout is theirs.
	// Built first (BuildAdapter), packed without the prepack build: the
	// integration tier runs the same dist/ meanwhile.
	if err := EnsureAdapterBuilt(); err != nil {
		return "", err
	}
	environ, err := NodeEnviron()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "npm", "pack", "--ignore-scripts", "--json", "--pack-destination", pc.Files())
	cmd.Dir = AdapterDir()
	cmd.Env = environ
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("npm pack in adapters/paperclip: %w\n%s", err, stderr.String())
	}
	var packed []struct{ Filename string }
	if err := json.Unmarshal(out, &packed); err != nil || len(packed) != 1 {
		return "", fmt.Errorf("npm pack --json answered %q (%v)", out, err)
	}
	return filepath.Join(pc.Files(), packed[0].Filename), nil
}

// RealNodeProfiles is the config (for InstallCluster) that puts the
// profiles the adapter's types use on the real node (the fake agent's
// image runs there, not on kwok), asking it for little.
func RealNodeProfiles() string {
	sel, tol := cluster.RealNodePlacement()
	var placement strings.Builder
	for k, v := range sel {
		fmt.Fprintf(&placement, "    nodeSelector: {%q: %q}\n", k, v)
	}
	fmt.Fprintf(&placement, "    tolerations: [{key: %q, operator: %s, effect: %s}]\n", tol[0].Key, tol[0].Operator, tol[0].Effect)
	return "profiles:\n  claude_local:\n" + placement.String() + "  opencode_local:\n" + placement.String() +
		fmt.Sprintf("defaults:\n  resources:\n    requests: {cpu: %s, memory: %s}\n", realNodeAgentCPU, realNodeAgentMemory)
}

// What the tiers' agent pods ask of the real node. The fake agent needs
// little; the config's default (a CPU and 2 GiB per run) lets a two-core
// node hold one agent pod at a time beside the chart's pods, and the
// tier's parallel tests then wait on the scheduler, not on clipjob.
const realNodeAgentCPU, realNodeAgentMemory = "10m", "32Mi"

// RealNodeAgentDefaults are the config's defaults (the chart's
// config.defaults) giving agent pods RealNodeProfiles' small requests.
func RealNodeAgentDefaults() map[string]any {
	return map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": realNodeAgentCPU, "memory": realNodeAgentMemory}}}
}
