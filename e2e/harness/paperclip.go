package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// The real Paperclip server (the npm package paperclipai, pinned by
// hack/paperclip/) on this machine, with its embedded PostgreSQL, as an
// operator runs it: `paperclipai onboard --yes` the first time, then
// `paperclipai run`, in local_trusted mode on loopback.
//
// Its embedded PostgreSQL refuses to run as root, so when the tests run as
// root the server runs as nobody (a user every machine has; PostgreSQL's
// initdb needs one with a passwd entry). The install lives in the
// invoking user's cache, which nobody may not traverse: it is bind-mounted
// into the server's own directory, and unmounted when the server is done.

// PaperclipUID is the user the server runs as when the tests run as root.
const PaperclipUID = 65534

var paperclipInstall struct {
	sync.Once
	dir string
	err error
}

// PaperclipInstall installs (once per test binary) the pinned Paperclip
// server and the Node.js it needs with hack/paperclip/install.sh, and
// returns that directory (node/bin/node, server/node_modules/...).
func PaperclipInstall() (string, error) {
	paperclipInstall.Do(func() {
		cmd := exec.Command("bash", filepath.Join(Root(), "hack", "paperclip", "install.sh"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			paperclipInstall.err = fmt.Errorf("hack/paperclip/install.sh: %w\n%s", err, stderr.String())
			return
		}
		paperclipInstall.dir = strings.TrimSpace(string(out))
	})
	return paperclipInstall.dir, paperclipInstall.err
}

// Paperclip is one Paperclip server instance.
type Paperclip struct {
	// URL is its API's base, http://127.0.0.1:PORT.
	URL string
	// Dir holds everything of this instance: install (the bind mount),
	// home (PAPERCLIP_HOME), files (what the server reads: kubeconfig,
	// tokens), the server's log.
	Dir string
	// Home is PAPERCLIP_HOME.
	Home string
	// Log is the server's output.
	Log string
	// Env is the server's environment beyond what the harness sets (the
	// CLIPJOB_* settings of the adapter).
	Env map[string]string

	port    int
	install string // the install, as the server sees it
	uid     int    // -1: the invoking user
	gid     int    // the server's group when it runs as uid; 0: uid's own
	mounted bool
	// onVolume: the home is the agents' volume, bind-mounted at VolumePath.
	onVolume bool
	cmd      *exec.Cmd
	done     chan error
}

// VolumePath is where Paperclip's image keeps its home
// (HOME=PAPERCLIP_HOME=/paperclip) and agent pods mount the shared volume.
const VolumePath = "/paperclip"

// HomeOnVolume keeps p's home where Paperclip's image keeps it: on the
// agents' shared volume, at the path the pods see it. volumeDir (the
// directory behind the real node's PersistentVolume) is bind-mounted at
// VolumePath until p is closed. The image's server and its agents are one
// uid (1000); here the server runs as its own user in the volume's group
// (SharedGID) with umask 002, so that what it makes for a run (its
// workspace, its home) the run can write. Call before Start; one such
// server per machine (the real-node tier's lock).
func (p *Paperclip) HomeOnVolume(volumeDir string) error {
	if p.uid < 0 {
		return errors.New("the Paperclip server's home on the agents' volume needs root (a bind mount at " + VolumePath + ")")
	}
	if entries, err := os.ReadDir(VolumePath); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s exists and is not empty: the suite mounts the agents' volume there for the Paperclip server, and will not hide what is there", VolumePath)
	}
	if err := os.MkdirAll(VolumePath, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount(volumeDir, VolumePath, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting the agents' volume %s at %s for the Paperclip server: %w", volumeDir, VolumePath, err)
	}
	p.onVolume, p.Home, p.gid = true, VolumePath, SharedGID
	// For reapStalePaperclips, should this test binary die.
	return os.WriteFile(filepath.Join(p.Dir, "on-volume"), nil, 0o644)
}

// NewPaperclip prepares an instance in a new directory: nothing runs yet.
// Files the server must read go in p.Files() (chowned by p.Own).
func NewPaperclip() (*Paperclip, error) {
	install, err := PaperclipInstall()
	if err != nil {
		return nil, err
	}
	reapStalePaperclips()
	dir, err := os.MkdirTemp("", "clipjob-paperclip-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	p := &Paperclip{Dir: dir, Home: filepath.Join(dir, "home"), Log: filepath.Join(dir, "server.log"), uid: -1, install: install, Env: map[string]string{}}
	for _, d := range []string{p.Home, p.Files()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if os.Geteuid() == 0 {
		p.uid = PaperclipUID
		p.install = filepath.Join(dir, "install")
		if err := os.MkdirAll(p.install, 0o755); err != nil {
			return nil, err
		}
		if err := syscall.Mount(install, p.install, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return nil, fmt.Errorf("bind-mounting the Paperclip install %s where the server's user can reach it: %w", install, err)
		}
		p.mounted = true
		// Read-only: an rm -rf of a kept directory whose mount is still
		// there must not empty the cache through it.
		if err := syscall.Mount("", p.install, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
			p.Close(false)
			return nil, fmt.Errorf("making the bind mount of the Paperclip install read-only: %w", err)
		}
		for _, d := range []string{p.Home, p.Files()} {
			if err := p.Own(d); err != nil {
				return nil, err
			}
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p.port = port
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", port)
	return p, nil
}

// reapStalePaperclips stops what a test binary that died (a timeout, a
// kill) left of its servers: the embedded PostgreSQL outlives the server
// (a grandchild, not reached by the parent-death signal), and the install
// stays mounted. Their directories stay, with their logs.
func reapStalePaperclips() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "clipjob-paperclip-*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err != nil || pid <= 1 || syscall.Kill(pid, 0) == nil {
			continue // its test binary is alive
		}
		stale := &Paperclip{Dir: dir, Home: filepath.Join(dir, "home"), install: filepath.Join(dir, "install")}
		if _, err := os.Stat(filepath.Join(dir, "on-volume")); err == nil {
			// Its home was the agents' volume, still mounted at VolumePath.
			stale.Home = VolumePath
			stale.stopPostgres()
			if syscall.Unmount(VolumePath, syscall.MNT_DETACH) == nil {
				_ = os.Remove(VolumePath)
			}
		}
		stale.stopPostgres()
		if err := syscall.Unmount(stale.install, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			continue
		}
		_ = os.Remove(filepath.Join(dir, "owner.pid"))
	}
}

// Files is the directory for what the server reads (kubeconfig, tokens,
// the adapter's package).
func (p *Paperclip) Files() string { return filepath.Join(p.Dir, "files") }

// Own gives path (and, for a directory, all below it) to the server's user.
func (p *Paperclip) Own(path string) error {
	if p.uid < 0 {
		return nil
	}
	return filepath.Walk(path, func(f string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(f, p.uid, p.uid)
	})
}

// Node is the Node.js the server runs on, as the server's user sees it.
func (p *Paperclip) Node() string { return filepath.Join(p.install, "node", "bin", "node") }

// Command is name (a program on the server's PATH: node, npm) with args,
// run in dir as the server's user with the server's environment.
func (p *Paperclip) Command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	if name == "npm" || name == "node" {
		// npm is the machine's, run by the server's Node (no engine warnings).
		if name == "npm" {
			npm, err := exec.LookPath("npm")
			if err == nil {
				if real, err := filepath.EvalSymlinks(npm); err == nil {
					npm = real
				}
			}
			cmd = exec.CommandContext(ctx, p.Node(), append([]string{npm}, args...)...)
		} else {
			cmd = exec.CommandContext(ctx, p.Node(), args...)
		}
	}
	cmd.Dir = dir
	cmd.Env = p.environ()
	if p.uid >= 0 {
		cred := &syscall.Credential{Uid: uint32(p.uid), Gid: uint32(p.uid)}
		if p.gid > 0 {
			cred.Gid, cred.Groups = uint32(p.gid), []uint32{uint32(p.gid)}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd
}

// environ is the server's environment: a clean one (nothing of the test
// process leaks in), the adapter's settings, and what keeps a test server
// quiet (no telemetry, update checks, backups or UI).
func (p *Paperclip) environ() []string {
	env := map[string]string{
		"HOME":                         p.Home,
		"PAPERCLIP_HOME":               p.Home,
		"PATH":                         filepath.Join(p.install, "node", "bin") + ":/usr/local/bin:/usr/bin:/bin",
		"PORT":                         strconv.Itoa(p.port),
		"PAPERCLIP_TELEMETRY_DISABLED": "1",
		"DO_NOT_TRACK":                 "1",
		"PAPERCLIP_UPDATE_CHECK":       "0",
		"PAPERCLIP_DB_BACKUP_ENABLED":  "false",
		"SERVE_UI":                     "false",
		"npm_config_update_notifier":   "false",
		"npm_config_fund":              "false",
		"npm_config_audit":             "false",
		"npm_config_cache":             filepath.Join(p.Home, ".npm"),
	}
	for _, k := range []string{"https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "npm_config_registry", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env[k] = v
		}
	}
	// The machine's npm settings (the registry, its CA), which a server's
	// user would have too.
	if home, err := os.UserHomeDir(); err == nil {
		if _, err := os.Stat(filepath.Join(home, ".npmrc")); err == nil {
			if data, err := os.ReadFile(filepath.Join(home, ".npmrc")); err == nil {
				rc := filepath.Join(p.Home, ".npmrc")
				if _, err := os.Stat(rc); errors.Is(err, os.ErrNotExist) {
					_ = os.WriteFile(rc, data, 0o644)
					_ = p.Own(rc)
				}
			}
		}
	}
	for k, v := range p.Env {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// Start runs the server: `paperclipai onboard --yes --no-install-service`
// the first time (it writes the instance's config and then serves),
// `paperclipai run` after that. It returns once /api/health says ok.
func (p *Paperclip) Start(ctx context.Context) error {
	if p.running() {
		return errors.New("the Paperclip server is already running")
	}
	// Each server picks its embedded PostgreSQL's port as it starts (the
	// first free one from 54329) and binds it seconds later: two starting
	// at once could pick the same. The next may start once this one's
	// PostgreSQL listens, not when the whole server is ready (its
	// migrations, half a minute under load, need no lock).
	release, err := startingOne()
	if err != nil {
		return err
	}
	locked := true
	unlock := func() {
		if locked {
			locked = false
			release()
		}
	}
	defer unlock()
	logStart := fileSize(p.Log)
	bin := filepath.Join(p.install, "server", "node_modules", ".bin", "paperclipai")
	args := []string{"run", "-d", p.Home}
	if _, err := os.Stat(filepath.Join(p.Home, "instances", "default", "config.json")); errors.Is(err, os.ErrNotExist) {
		args = []string{"onboard", "--yes", "--no-install-service", "-d", p.Home}
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "==== %s paperclipai %s\n", time.Now().Format(time.RFC3339), strings.Join(args, " "))
	cmd := p.Command(context.Background(), p.Home, bin, args...)
	if p.onVolume {
		// What it makes on the volume stays writable by the volume's group.
		cmd = p.Command(context.Background(), p.Home, "/bin/sh", append([]string{"-c", `umask 002 && exec "$0" "$@"`, bin}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	attr := cmd.SysProcAttr
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	// Its own process group, so that a kill reaches the embedded
	// PostgreSQL too; and it dies with the test binary.
	attr.Setpgid, attr.Pdeathsig = true, syscall.SIGKILL
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p.cmd, p.done = cmd, make(chan error, 1)
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	// The first start initializes PostgreSQL and applies every migration.
	deadline := time.Now().Add(4 * time.Minute)
	for {
		p.followPortMove()
		if locked && postgresListening(p.Log, logStart) {
			unlock()
		}
		var health struct{ Status string }
		err := p.Do(ctx, http.MethodGet, "/api/health", nil, &health)
		if err == nil && health.Status == "ok" {
			return nil
		}
		if !p.running() {
			return fmt.Errorf("the Paperclip server exited (%v) before it was ready; see %s", p.exitErr(), p.Log)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.Kill()
			return fmt.Errorf("the Paperclip server was not ready in 4 minutes (last: %v, status %q); see %s", err, health.Status, p.Log)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// portMoved is what Paperclip logs when the port it was given (PORT) is
// taken by the time it listens: it listens on the next free one instead.
var portMoved = regexp.MustCompile(`Requested port is busy; using next free port \(requestedPort=(\d+), selectedPort=(\d+)\)`)

// followPortMove adopts the port Paperclip chose when the one it was
// given was taken meanwhile (another process on the machine can take a
// port freePort found free), so its URL is where it listens.
func (p *Paperclip) followPortMove() {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return
	}
	for _, m := range portMoved.FindAllSubmatch(data, -1) {
		requested, _ := strconv.Atoi(string(m[1]))
		selected, _ := strconv.Atoi(string(m[2]))
		if requested == p.port && selected > 0 {
			p.port = selected
			p.URL = fmt.Sprintf("http://127.0.0.1:%d", selected)
		}
	}
}

// startingOne lets one server on this machine at a time be between
// choosing its PostgreSQL's port and listening on it: a mutex for this
// process's servers, a file lock for other processes' (another suite, a
// bench, a test binary left running by a killed `go test`). It returns
// the release.
func startingOne() (func(), error) {
	startingInProcess.Lock()
	f, err := os.OpenFile(startingLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		startingInProcess.Unlock()
		return nil, fmt.Errorf("locking %s: %w", startingLock, err)
	}
	return func() {
		f.Close() // and with it the lock
		startingInProcess.Unlock()
	}, nil
}

var (
	startingInProcess sync.Mutex
	startingLock      = filepath.Join(os.TempDir(), "clipjob-paperclip-start.lock")
)

// postgresPort is what Paperclip logs when it has chosen the port of the
// embedded PostgreSQL it is about to start; postgresReused, when it found
// its PostgreSQL already running.
var (
	postgresPort   = regexp.MustCompile(`Using embedded PostgreSQL because no DATABASE_URL set \(dataDir=.*, port=(\d+)\)`)
	postgresReused = regexp.MustCompile(`Embedded PostgreSQL (already running; reusing|appears to already be reachable)`)
)

// postgresListening says whether the server whose log is at path, from
// byte from on (this start's lines), has its PostgreSQL listening on the
// port it chose, so that another server will not choose that port.
func postgresListening(path string, from int64) bool {
	data, err := os.ReadFile(path)
	if err != nil || int64(len(data)) < from {
		return false
	}
	data = data[from:]
	if postgresReused.Match(data) {
		return true
	}
	m := postgresPort.FindSubmatch(data)
	if m == nil {
		return false
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+string(m[1]), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func (p *Paperclip) running() bool { return alive(p.cmd, p.done) }

func (p *Paperclip) exitErr() error {
	err := <-p.done
	p.done <- err
	return err
}

// Stop ends the server as its service manager would: SIGTERM, and its
// graceful shutdown (which marks in-flight runs interrupted and stops
// PostgreSQL); SIGKILL to the group after a minute.
func (p *Paperclip) Stop() { p.signal(syscall.SIGTERM, time.Minute) }

// Kill ends the server and its PostgreSQL at once, as a crash.
func (p *Paperclip) Kill() { p.signal(syscall.SIGKILL, 10*time.Second) }

func (p *Paperclip) signal(sig syscall.Signal, grace time.Duration) {
	if !p.running() {
		return
	}
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	} else {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.done <- nil
	p.stopPostgres()
}

// stopPostgres stops the instance's PostgreSQL if it still runs (a kill
// of the server leaves it: it is not in the server's process group).
func (p *Paperclip) stopPostgres() {
	pidFile := filepath.Join(p.Home, "instances", "default", "db", "postmaster.pid")
	if data, err := os.ReadFile(pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0])); err == nil && pid > 1 {
			if syscall.Kill(pid, 0) == nil {
				_ = syscall.Kill(pid, syscall.SIGQUIT)
				for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}
}

// Close stops the server and removes its directory, unless keep (a failed
// test's logs).
func (p *Paperclip) Close(keep bool) {
	p.Stop()
	if p.onVolume {
		if err := syscall.Unmount(VolumePath, syscall.MNT_DETACH); err == nil {
			p.onVolume = false
			_ = os.Remove(VolumePath)
		}
	}
	if p.mounted {
		if err := syscall.Unmount(p.install, syscall.MNT_DETACH); err == nil {
			p.mounted = false
		}
	}
	if !keep && !p.mounted {
		_ = os.RemoveAll(p.Dir)
	}
}

// APIError is an answer of Paperclip's API other than 2xx.
type APIError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("Paperclip %s %s: %d %s", e.Method, e.Path, e.Status, strings.TrimSpace(e.Body))
}

// Do calls Paperclip's API as the local board (local_trusted needs no
// token from loopback), body as JSON, and decodes the answer into out.
func (p *Paperclip) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, p.URL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Body: string(data)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("Paperclip %s %s: decoding %q: %w", method, path, truncate(string(data), 300), err)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func freePort() (int, error) {
	ports, err := cluster.FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}
