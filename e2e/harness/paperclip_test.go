package harness

import (
	"os"
	"path/filepath"
	"testing"
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
