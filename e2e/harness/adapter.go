package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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
	dir, err := nodeBin()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func nodeBin() (string, error) {
	dir, err := PaperclipInstall()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "node", "bin"), nil
}

// WithNode is the test process's environment with NodeBin first on PATH.
func WithNode(t testing.TB) []string {
	t.Helper()
	env, err := NodeEnviron()
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// NodeEnviron is WithNode outside a test.
func NodeEnviron() ([]string, error) {
	bin, err := nodeBin()
	if err != nil {
		return nil, err
	}
	return append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH")), nil
}

// BuildAdapter is EnsureAdapterBuilt for a test.
func BuildAdapter(t testing.TB) {
	t.Helper()
	if err := EnsureAdapterBuilt(); err != nil {
		t.Fatal(err)
	}
}

// EnsureAdapterBuilt builds the adapter once per test binary, on
// Paperclip's Node: npm ci when its node_modules is missing (make test
// installs them from the lockfile), then npm run build unless dist/ is
// newer than every source. The tiers run side by side and read dist/
// while their tests run, so the build holds a lock across processes, and
// a fresh dist/ is not written again under a running test's feet.
func EnsureAdapterBuilt() error {
	adapterBuild.Do(func() {
		adapterBuild.err = func() error {
			if _, err := exec.LookPath("npm"); err != nil {
				return fmt.Errorf("npm is not on PATH: the Paperclip adapter's end-to-end tests need npm (README, Quick start)")
			}
			environ, err := NodeEnviron()
			if err != nil {
				return err
			}
			unlock, err := lockFile(filepath.Join(os.TempDir(), "clipjob-adapter-build.lock"))
			if err != nil {
				return err
			}
			defer unlock()
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
				if err := npm("ci", "--no-audit", "--no-fund"); err != nil {
					return err
				}
			}
			if fresh, err := adapterBuildFresh(); err != nil || fresh {
				return err
			}
			start := time.Now()
			if err := npm("run", "build"); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "e2e: built the Paperclip adapter in %s\n", time.Since(start).Round(time.Millisecond))
			return nil
		}()
	})
	return adapterBuild.err
}

// adapterBuildFresh reports whether dist/ was built after every source,
// test, setting and lockfile of the adapter last changed.
func adapterBuildFresh() (bool, error) {
	built, err := newest(filepath.Join(AdapterDir(), "dist"))
	if err != nil || built.IsZero() {
		return false, nil
	}
	for _, src := range []string{"src", "test", "opencode", "tsconfig.json", "package.json", "package-lock.json"} {
		changed, err := newest(filepath.Join(AdapterDir(), src))
		if err != nil {
			return false, err
		}
		if changed.After(built) {
			return false, nil
		}
	}
	return true, nil
}

// newest is the latest modification time of a file or of any file below
// a directory (zero when there is none).
func newest(path string) (time.Time, error) {
	var latest time.Time
	err := filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().After(latest) {
			latest = info.ModTime()
		}
		return nil
	})
	return latest, err
}

// lockFile takes an exclusive lock on path, across processes, until
// the returned function releases it.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
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
	spec, err := in.PaperclipServerSpec(r, agent, run)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// PaperclipServerSpec is PaperclipServer outside a test (a TestMain that
// starts a server beside its first tests).
func (in *Install) PaperclipServerSpec(r *Relay, agent, run string) (AdapterSpec, error) {
	if err := EnsureAdapterBuilt(); err != nil {
		return AdapterSpec{}, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.paperclip == nil {
		spec, err := in.paperclipServer(r)
		if err != nil {
			return AdapterSpec{}, err
		}
		in.paperclip = &spec
	}
	spec := *in.paperclip
	spec.AgentID, spec.RunID, spec.Prompt = agent, run, "Fix the failing test, {{agent.id}}."
	return spec, nil
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
