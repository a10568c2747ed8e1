package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestServerURLFollowsAPortPaperclipMoved: Paperclip listens on the next
// free port when the one it was given was taken meanwhile, and says so in
// its log; the harness then reaches it there, not at the taken port.
// Another server's move in the same log (an earlier start) is not this
// one's.
func TestServerURLFollowsAPortPaperclipMoved(t *testing.T) {
	p := &Paperclip{Log: filepath.Join(t.TempDir(), "server.log"), port: 27769, URL: "http://127.0.0.1:27769"}
	log := "[08:08:04] WARN: Requested port is busy; using next free port (requestedPort=21000, selectedPort=21001)\n" +
		"[08:08:05] WARN: Requested port is busy; using next free port (requestedPort=27769, selectedPort=27773)\n"
	if err := os.WriteFile(p.Log, []byte("[08:08:03] INFO: starting\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.followPortMove()
	if p.URL != "http://127.0.0.1:27769" {
		t.Fatalf("no move logged yet, the URL changed to %s", p.URL)
	}
	if err := os.WriteFile(p.Log, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	p.followPortMove()
	if p.port != 27773 || p.URL != "http://127.0.0.1:27773" {
		t.Errorf("after the move: port %d, URL %s; want 27773", p.port, p.URL)
	}
}

// TestPostgresListeningReadsThisStartsPort: the next server may start once
// this one's PostgreSQL listens on the port it logged it chose; not
// before (two would choose the same), and not on an earlier start's line.
func TestPostgresListeningReadsThisStartsPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	listening := l.Addr().(*net.TCPAddr).Port
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	notListening := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	chose := func(port int) string {
		return fmt.Sprintf("[10:33:02] \x1b[32mINFO\x1b[39m: \x1b[36mUsing embedded PostgreSQL because no DATABASE_URL set (dataDir=/paperclip/instances/default/db, port=%d)\x1b[39m\n", port)
	}
	earlier := "==== onboard\n" + chose(listening) + "[10:34:00] INFO: shutting down\n"
	for _, c := range []struct {
		name string
		log  string
		from int64
		want bool
	}{
		{"nothing chosen yet", "==== run\n[10:35:00] INFO: starting\n", 0, false},
		{"chosen, listening", chose(listening), 0, true},
		{"chosen, not listening yet", chose(notListening), 0, false},
		{"an earlier start's port is not this one's", earlier + "==== run\n", int64(len(earlier)), false},
		{"this start's, after an earlier one", earlier + "==== run\n" + chose(listening), int64(len(earlier)), true},
		{"its PostgreSQL already running", "[10:35:01] WARN: Embedded PostgreSQL already running; reusing existing process (pid=12, port=54329)\n", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "server.log")
			if err := os.WriteFile(path, []byte(c.log), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := postgresListening(path, c.from); got != c.want {
				t.Errorf("postgresListening = %v, want %v", got, c.want)
			}
		})
	}
}

// TestAServerStartWaitsForAnotherProcesssStart: while another process
// holds the start lock (a server of its own between choosing its
// PostgreSQL's port and binding it), a start here waits; it goes on once
// that lock is let go.
func TestAServerStartWaitsForAnotherProcesssStart(t *testing.T) {
	other, err := os.OpenFile(startingLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// A second open file description: flock treats it as another process.
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	started := make(chan func())
	go func() {
		release, err := startingOne()
		if err != nil {
			t.Error(err)
			close(started)
			return
		}
		started <- release
	}()
	select {
	case <-started:
		t.Fatal("a start went on while another process held the start lock")
	case <-time.After(300 * time.Millisecond):
	}
	other.Close()
	select {
	case release := <-started:
		if release != nil {
			release()
		}
	case <-time.After(time.Minute):
		t.Fatal("the start still waits a minute after the other process let go")
	}
}
