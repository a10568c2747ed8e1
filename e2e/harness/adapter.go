package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay"
)

// The Paperclip adapter (adapters/paperclip) as a Paperclip server runs
// it: built on Paperclip's Node.js, with a kubeconfig of a ServiceAccount
// holding exactly the Role its README documents, and a token of that
// account for the relay's audience.

// AdapterDir is the adapter's npm package.
func AdapterDir() string { return filepath.Join(Root(), "adapters", "paperclip") }

var adapterBuild struct {
	sync.Once
	err error
}

// NodeBin is the directory of the Node.js Paperclip runs on (24, from
// hack/paperclip/install.sh): the adapter is built and run on it, as in a
// Paperclip server.
func NodeBin(t testing.TB) string {
	t.Helper()
	dir, err := PaperclipInstall()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "node", "bin")
}

// WithNode is the test process's environment with NodeBin first on PATH.
func WithNode(t testing.TB) []string {
	return append(os.Environ(), "PATH="+NodeBin(t)+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// BuildAdapter builds the adapter once per test binary: npm ci when its
// node_modules is missing (make test installs them from the lockfile),
// then npm run build, on Paperclip's Node.
func BuildAdapter(t testing.TB) {
	t.Helper()
	environ := WithNode(t)
	adapterBuild.Do(func() {
		if _, err := exec.LookPath("npm"); err != nil {
			adapterBuild.err = fmt.Errorf("npm is not on PATH: the Paperclip adapter's end-to-end tests need npm (README, Quick start)")
			return
		}
		npm := func(args ...string) error {
			cmd := exec.Command("npm", args...)
			cmd.Dir = AdapterDir()
			cmd.Env = environ
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("npm %s in adapters/paperclip: %w\n%s", strings.Join(args, " "), err, out)
			}
			return nil
		}
		if _, err := os.Stat(filepath.Join(AdapterDir(), "node_modules")); errors.Is(err, os.ErrNotExist) {
			if adapterBuild.err = npm("ci", "--no-audit", "--no-fund"); adapterBuild.err != nil {
				return
			}
		}
		start := time.Now()
		if adapterBuild.err = npm("run", "build"); adapterBuild.err == nil {
			t.Logf("built the Paperclip adapter in %s", time.Since(start).Round(time.Millisecond))
		}
	})
	if adapterBuild.err != nil {
		t.Fatal(adapterBuild.err)
	}
}

// AdapterSpec is the adapter test driver's (test/e2e-run.mjs) spec.
type AdapterSpec struct {
	Kubeconfig     string `json:"kubeconfig"`
	Namespace      string `json:"namespace"`
	RelayURL       string `json:"relayUrl"`
	RelayTokenFile string `json:"relayTokenFile"`
	RelayCAFile    string `json:"relayCaFile"`
	AgentID        string `json:"agentId"`
	RunID          string `json:"runId"`
	TaskID         string `json:"taskId,omitempty"`
	Prompt         string `json:"prompt"`
	// CancelOnStdinEnd: the run is cancelled when the test says so, after
	// what it waits for, never on a clock.
	CancelOnStdinEnd bool `json:"cancelOnStdinEnd,omitempty"`
	// Mode "testEnvironment" runs the adapter's checks instead of a run.
	Mode   string         `json:"mode,omitempty"`
	Config map[string]any `json:"config,omitempty"`
}

// PaperclipServer builds the adapter and sets up what a Paperclip server
// in the install's namespace holds (once per install): the README's RBAC
// for its ServiceAccount, a kubeconfig with that account's token, a token
// of the same account for the relay's audience, and the CA that signed
// relay r's certificate. It returns a spec for agent and run with those
// filled in.
func (in *Install) PaperclipServer(t testing.TB, r *Relay, agent, run string) AdapterSpec {
	t.Helper()
	BuildAdapter(t)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.paperclip == nil {
		spec, err := in.paperclipServer(r)
		if err != nil {
			t.Fatal(err)
		}
		in.paperclip = &spec
	}
	spec := *in.paperclip
	spec.AgentID, spec.RunID, spec.Prompt = agent, run, "Fix the failing test, {{agent.id}}."
	return spec
}

func (in *Install) paperclipServer(r *Relay) (AdapterSpec, error) {
	ctx := context.Background()
	name, err := ApplyPaperclipServerRBAC(ctx, in.CS(), in.Namespace)
	if err != nil {
		return AdapterSpec{}, err
	}
	dir := filepath.Join(in.Dir(), "paperclip-server")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := ServiceAccountKubeconfig(ctx, in.c, in.Namespace, name, kubeconfig); err != nil {
		return AdapterSpec{}, err
	}
	token, err := ServiceAccountToken(ctx, in.c, in.Namespace, name, nil, relay.DefaultTokenAudience)
	if err != nil {
		return AdapterSpec{}, err
	}
	tokenFile, caFile := filepath.Join(dir, "relay-token"), filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return AdapterSpec{}, err
	}
	if err := os.WriteFile(caFile, in.c.CA.CertPEM, 0o644); err != nil {
		return AdapterSpec{}, err
	}
	return AdapterSpec{Kubeconfig: kubeconfig, Namespace: in.Namespace, RelayURL: "https://" + r.APIAddr,
		RelayTokenFile: tokenFile, RelayCAFile: caFile}, nil
}
