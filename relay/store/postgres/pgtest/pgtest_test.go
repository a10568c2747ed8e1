package pgtest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Without the server's binaries the tests that need one cannot run: the
// error names what is missing, where it was looked for, and the script
// that installs it.
func TestMissingServerNamesTheInstallScript(t *testing.T) {
	defer func(d string) { debianBinDirs = d }(debianBinDirs)
	debianBinDirs = t.TempDir() + "/*/bin"
	_, err := Start()
	if err == nil {
		t.Fatal("started a server without its binaries")
	}
	for _, want := range []string{"initdb", "postgres", "missing", debianBinDirs, InstallScript} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

// A server starts (as nobody under root), answers, keeps what was
// committed across a crash-like restart, and stops leaving nothing behind.
func TestServerStartsAndStops(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(0); err != nil {
		t.Errorf("started but not answering: %v", err)
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	// As after a crash: what was committed is there once it answers again.
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	c, err = pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		t.Fatalf("after Restart: %v", err)
	}
	var v int
	if err := c.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 42 {
		t.Errorf("after Restart: %d (%v), want the committed 42", v, err)
	}
	c.Close(ctx)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(0); err == nil {
		t.Error("still answering after Stop")
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the server's directory remains after Stop (%v)", err)
	}
}

// StartListening's server answers over TCP at its address, only with the
// password: a wrong one is refused by name. Its socket stays trusted.
func TestServerListensOnTCPWithAPassword(t *testing.T) {
	s, err := StartListening("127.0.0.1", "right horse")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	ctx := context.Background()
	for _, conn := range []string{s.TCPConnString("postgres", "right horse"), s.ConnString("postgres")} {
		c, err := pgx.Connect(ctx, conn)
		if err != nil {
			t.Fatalf("%s: %v", conn, err)
		}
		c.Close(ctx)
	}
	_, err = pgx.Connect(ctx, s.TCPConnString("postgres", "wrong horse"))
	if err == nil || !strings.Contains(err.Error(), "password authentication failed") {
		t.Errorf("a wrong password: %v, want it refused as such", err)
	}
}
