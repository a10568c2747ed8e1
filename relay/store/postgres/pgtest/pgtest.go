// Package pgtest starts throwaway PostgreSQL servers for tests, from the
// server binaries of Debian's postgresql package: initdb into a temporary
// directory, then postgres listening on a unix socket there (and, from
// StartListening, on TCP at one address, with a password). As root
// (PostgreSQL refuses to run as root) both run as the user nobody, owner
// of that directory. Missing binaries fail the test with what to install,
// never skip it.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstallScript installs the server binaries (make test runs it first).
const InstallScript = "hack/postgres-packages.sh"

// debianBinDirs is where Debian's postgresql-N packages put the server.
var debianBinDirs = "/usr/lib/postgresql/*/bin"

// BinDir returns the newest directory under debianBinDirs holding initdb
// and postgres, or an error naming what is missing and how to install it.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob(debianBinDirs)
	version := func(dir string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if executable(filepath.Join(d, "initdb")) && executable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL's server binaries initdb and postgres are missing (looked in %s, where Debian's postgresql package installs them): run %s, which installs them (make test does)",
		debianBinDirs, InstallScript)
}

func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Server is a running throwaway PostgreSQL server. Its superuser is
// "clipjob", trusted on the socket.
type Server struct {
	dir  string // socket directory; the cluster is in dir/data
	port int
	bin  string
	// host, when set, is the address the server also listens on over TCP,
	// where the superuser must give password.
	host, password string
	cred           *syscall.Credential // nil: as this process's user
	// The running postgres; exited is closed when it ends, after waitErr
	// is set.
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// Start initializes a cluster in a new temporary directory and starts a
// server on it, returning once it accepts connections.
func Start() (*Server, error) {
	return start(&Server{port: 5432})
}

// StartListening is Start with the server listening on TCP too, at host
// on a free port, where the superuser must give password (the socket
// stays trusted). Pods need it: a pod's network namespace has neither the
// machine's loopback nor its unix sockets, so a server on the machine is
// reachable from pods only at an address of the machine their network
// routes to (a node's own address), and a password is what a relay's
// connection string carries.
func StartListening(host, password string) (*Server, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("no free port at %s: %w", host, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return start(&Server{port: port, host: host, password: password})
}

func start(s *Server) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parentDir(), "clipjob-pg-")
	if err != nil {
		return nil, err
	}
	s.dir, s.bin = dir, bin
	if err := s.init(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.launch(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// parentDir is where the server's directory goes: the temporary
// directory, unless the server's socket path would be too long for a unix
// socket (107 bytes) or, under root, the user nobody could not reach it;
// then /tmp.
func parentDir() string {
	tmp := os.TempDir()
	if len(tmp) > 64 {
		return "/tmp"
	}
	if os.Geteuid() == 0 {
		for d := tmp; ; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err != nil || st.Mode().Perm()&0o001 == 0 {
				return "/tmp"
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return tmp
}

func (s *Server) env() []string {
	return []string{"PATH=" + s.bin + ":/usr/bin:/bin", "LC_ALL=C", "TZ=UTC", "HOME=" + s.dir}
}

// init makes the directory the server user's and a cluster in it.
func (s *Server) init() error {
	if os.Geteuid() == 0 {
		var err error
		if s.cred, err = nobody(); err != nil {
			return err
		}
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	args := []string{"-D", filepath.Join(s.dir, "data"), "-U", "clipjob", "-E", "UTF8", "--locale=C", "--no-sync"}
	if s.host == "" {
		args = append(args, "-A", "trust")
	} else {
		args = append(args, "--auth-local=trust", "--auth-host=scram-sha-256")
		pwfile := filepath.Join(s.dir, "password")
		if err := os.WriteFile(pwfile, []byte(s.password+"\n"), 0o600); err != nil {
			return err
		}
		defer os.Remove(pwfile)
		if s.cred != nil {
			if err := os.Chown(pwfile, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return err
			}
		}
		args = append(args, "--pwfile", pwfile)
	}
	initdb := exec.Command(filepath.Join(s.bin, "initdb"), args...)
	initdb.Env, initdb.Dir = s.env(), s.dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, out)
	}
	if s.host == "" {
		return nil
	}
	// Over TCP, from anywhere, only with the password.
	hba, err := os.OpenFile(filepath.Join(s.dir, "data", "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = hba.WriteString("host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n")
	if cerr := hba.Close(); err == nil {
		err = cerr
	}
	return err
}

// launch starts postgres on the cluster and waits until it answers.
func (s *Server) launch() error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// No fsync: a commit is in the kernel's cache when it is answered,
	// which a crash of the server (Restart) keeps and only a crash of the
	// machine would not. Unix socket only unless StartListening asked for
	// an address: no port to collide on.
	s.cmd = exec.Command(filepath.Join(s.bin, "postgres"), "-D", filepath.Join(s.dir, "data"), "-k", s.dir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses="+s.host, "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB", "-c", "max_connections=200")
	s.cmd.Env, s.cmd.Dir, s.cmd.Stdout, s.cmd.Stderr = s.env(), s.dir, logf, logf
	// The server dies with the test binary (SIGQUIT: immediate shutdown).
	// The signal is tied to the thread that started it, so that thread
	// is kept, locked, for as long as the server runs.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT}
	cmd, exited := s.cmd, make(chan struct{})
	s.exited = exited
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(exited)
			return
		}
		started <- nil
		s.waitErr = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	return s.waitReady(time.Minute)
}

// Restart stops the server as a crash would (immediate shutdown: every
// session cut, no checkpoint) and starts it again on the same cluster,
// returning once it accepts connections again, after recovery.
func (s *Server) Restart() error {
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	<-s.exited
	return s.launch()
}

// nobody is the unprivileged user the server runs as under root.
func nobody() (*syscall.Credential, error) {
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root and there is no user nobody to run it as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("postgres exited (%v): %s", s.waitErr, s.Log())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within %s (%v): %s", timeout, err, s.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Log is the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	return string(b)
}

// ConnString reaches database db as the superuser.
func (s *Server) ConnString(db string) string {
	return fmt.Sprintf("host=%s port=%d user=clipjob dbname=%s sslmode=disable", s.dir, s.port, db)
}

// TCPConnString reaches database db over TCP as the superuser, giving
// password (the server's, from StartListening, or another to be refused).
// Empty when the server listens on its socket only.
func (s *Server) TCPConnString(db, password string) string {
	if s.host == "" {
		return ""
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword("clipjob", password),
		Host: net.JoinHostPort(s.host, strconv.Itoa(s.port)), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Stop shuts the server down (fast: open sessions are ended) and removes
// its directory.
func (s *Server) Stop() error {
	defer os.RemoveAll(s.dir)
	if s.cmd == nil {
		return nil
	}
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
		return nil
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("postgres did not stop within a minute of SIGINT; killed")
	}
}

// The server the tests of one binary share (see Main and Schema).
var shared struct {
	once sync.Once
	srv  *Server
	err  error
	n    atomic.Int64
}

// Main runs a package's tests, then stops the server they shared: call it
// from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	os.Exit(code)
}

// Shared returns the server the package's tests share, started by the
// first test that asks; a test calling it fails if it cannot start.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() { shared.srv, shared.err = Start() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv
}

var unsafe = regexp.MustCompile(`[^a-z0-9_]+`)

// Schema returns a connection string to the shared server and the name of
// a schema no other test uses (it does not exist yet).
func Schema(t testing.TB) (connString, schema string) {
	t.Helper()
	srv := Shared(t)
	parts := strings.Split(t.Name(), "/")
	name := unsafe.ReplaceAllString(strings.ToLower(parts[len(parts)-1]), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	return srv.ConnString("postgres"), fmt.Sprintf("t%d_%s", shared.n.Add(1), name)
}
