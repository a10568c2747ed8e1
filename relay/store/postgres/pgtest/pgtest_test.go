package pgtest

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
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

// A server starts (as nobody under root), answers, and stops leaving
// nothing behind.
func TestServerStartsAndStops(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(0); err != nil {
		t.Errorf("started but not answering: %v", err)
	}
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
