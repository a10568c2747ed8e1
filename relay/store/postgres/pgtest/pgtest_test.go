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
