package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// freezer is a proxy in front of a PostgreSQL server's socket that
// freezes one connection the way SIGSTOP freezes a relay: once armed with
// n, the first connection to send the n-th of its writes inside a
// transaction is forwarded up to that write and no further, and its
// connection to the server stays open, quiet, until the test ends. A
// write ends at a message after which pgx waits or writes anew: a Sync, a
// simple Query, a CopyData, a CopyDone or CopyFail. (A write larger than
// the socket's buffer could also be cut inside, which this does not try.)
type freezer struct {
	dir, target string
	ln          net.Listener

	mu      sync.Mutex
	armed   int    // the write to freeze after; 0: none
	what    string // the message the frozen write ended with
	frozen  chan struct{}
	servers []net.Conn
}

// listenBeside opens a unix socket named as PostgreSQL's in a new
// directory, for a proxy in front of the server connString names: it
// returns the directory, the server's socket and the listener.
func listenBeside(t *testing.T, connString, prefix string) (dir, target string, ln net.Listener) {
	t.Helper()
	kv := map[string]string{}
	for _, f := range strings.Fields(connString) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	ln, err = net.Listen("unix", filepath.Join(dir, ".s.PGSQL.5432"))
	if err != nil {
		t.Fatal(err)
	}
	return dir, filepath.Join(kv["host"], ".s.PGSQL."+kv["port"]), ln
}

func newFreezer(t *testing.T, connString string) *freezer {
	t.Helper()
	dir, target, ln := listenBeside(t, connString, "pgfreeze-")
	f := &freezer{dir: dir, target: target, ln: ln}
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, s := range f.servers {
			s.Close()
		}
		f.mu.Unlock()
		os.RemoveAll(dir)
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *freezer) connString() string {
	return fmt.Sprintf("host=%s port=5432 user=clipjob dbname=postgres sslmode=disable", f.dir)
}

// arm freezes the next connection to send its n-th write in a
// transaction; the channel is closed when it is frozen.
func (f *freezer) arm(n int) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed, f.what, f.frozen = n, "", make(chan struct{})
	return f.frozen
}

func (f *freezer) disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = 0
}

func (f *freezer) serve(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("unix", f.target)
	if err != nil {
		return
	}
	f.mu.Lock()
	f.servers = append(f.servers, s)
	f.mu.Unlock()
	// The server's side is never closed before the test ends: a frozen
	// relay's connection stays open.
	go func() { _, _ = io.Copy(c, s) }()
	var pending []byte
	buf := make([]byte, 64<<10)
	started, inTx, writes := false, false, 0
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		pending = append(pending, buf[:n]...)
		for {
			var typ byte
			var size int
			if !started {
				if len(pending) < 8 {
					break
				}
				size = int(binary.BigEndian.Uint32(pending))
				if binary.BigEndian.Uint32(pending[4:]) == 80877102 {
					return // a cancel request: a frozen relay sends none
				}
			} else {
				if len(pending) < 5 {
					break
				}
				typ, size = pending[0], 1+int(binary.BigEndian.Uint32(pending[1:]))
			}
			if len(pending) < size {
				break
			}
			msg := pending[:size]
			if _, err := s.Write(msg); err != nil {
				return
			}
			pending = pending[size:]
			if !started {
				started = true
				continue
			}
			text := ""
			if typ == 'Q' {
				text = strings.ToLower(strings.TrimSpace(string(bytes.TrimRight(msg[5:], "\x00"))))
			}
			switch {
			case typ == 'Q' && strings.HasPrefix(text, "begin"):
				inTx, writes = true, 0
				continue
			case typ == 'Q' && (strings.HasPrefix(text, "commit") || strings.HasPrefix(text, "rollback")):
				inTx = false
				continue
			case !inTx || !strings.ContainsRune("SQdcf", rune(typ)):
				continue
			}
			writes++
			f.mu.Lock()
			freeze := f.armed == writes
			if freeze {
				f.armed, f.what = 0, fmt.Sprintf("%c %.60s", typ, text)
				close(f.frozen)
			}
			f.mu.Unlock()
			if freeze {
				select {} // frozen: nothing more is read or sent
			}
		}
	}
}

// TestARelayFrozenAnywhereInACommitLetsGoOfItsRuns: a relay frozen (a
// paused VM, SIGSTOP, a node cut off with its connections open) after any
// write of its commit's transaction has that transaction ended by the
// server within IdleInTransaction, so that the replica taking its runs
// over can write them. A transaction the server is still executing a
// statement of is not idle, whatever the client: a COPY FROM STDIN whose
// client stopped sending its data waits for it for good, holding the
// rows it locked before.
func TestARelayFrozenAnywhereInACommitLetsGoOfItsRuns(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	fz := newFreezer(t, conn)
	frozen, err := Open(context.Background(), Options{ConnString: fz.connString(), Schema: schema,
		IdleInTransaction: 500 * time.Millisecond, LockTimeout: 200 * time.Millisecond, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()
	other, err := Open(context.Background(), Options{ConnString: conn, Schema: schema, LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	line := func(ts int64, text string) []store.Line {
		return []store.Line{{TS: time.Unix(0, ts), Container: "agent", Line: text}}
	}
	cur := store.Cursor{TS: 1, Count: 1}
	if _, err := frozen.AppendAfter("run-1", "a", store.Cursor{}, cur, line(cur.TS, "first"), time.Now()); err != nil {
		t.Fatal(err)
	}
	want := []string{"first"}
	points := 0
	for n := 1; ; n++ {
		next := store.Cursor{TS: cur.TS + 1, Count: 1}
		hit := fz.arm(n)
		done := make(chan error, 1)
		go func() {
			_, err := frozen.AppendAfter("run-1", "a", cur, next, line(next.TS, fmt.Sprintf("frozen after write %d", n)), time.Now())
			done <- err
		}()
		select {
		case <-hit:
		case err := <-done:
			fz.disarm()
			if err != nil {
				t.Fatalf("an append with no freeze: %v", err)
			}
			if points < 3 {
				t.Fatalf("a commit of %d writes: the freezer did not see the transaction", points)
			}
			want = append(want, fmt.Sprintf("frozen after write %d", n))
			if got := storedLines(t, other, "run-1"); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("stored %q, want %q", got, want)
			}
			t.Logf("frozen after each of the %d writes of a commit, and let go each time", points)
			return
		}
		points++
		fz.mu.Lock()
		what := fz.what
		fz.mu.Unlock()
		<-done // the frozen relay's own append fails at its timeout
		// The replica taking the run over writes from the stored cursor.
		deadline := time.Now().Add(15 * time.Second)
		for {
			_, err := other.AppendAfter("run-1", "a", cur, next, line(next.TS, fmt.Sprintf("taken over after write %d", n)), time.Now())
			if err == nil {
				want = append(want, fmt.Sprintf("taken over after write %d", n))
				break
			}
			var conflict *store.CursorConflict
			if errors.As(err, &conflict) {
				t.Fatalf("frozen after write %d (%s): its transaction committed though it never sent COMMIT: %v", n, what, err)
			}
			if !appendDataError(err) || time.Now().After(deadline) {
				t.Fatalf("frozen after write %d of its commit (%s): the run stayed locked for 15 s, the server never ended the transaction: %v", n, what, err)
			}
		}
		cur = next
	}
}
