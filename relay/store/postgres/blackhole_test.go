package postgres

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// blackHole is a proxy in front of a PostgreSQL server's socket that can
// stop forwarding on the connections open through it without closing
// them, as a network path that drops packets (a firewall's or NAT's state
// lost, a load balancer failing over) does: both ends wait for bytes that
// never come. Connections opened after that are forwarded.
type blackHole struct {
	dir, target string
	mu          sync.Mutex
	conns       []*holeConn
}

type holeConn struct {
	mu     sync.Mutex
	stuck  bool
	client net.Conn
	server net.Conn
}

func newBlackHole(t *testing.T, connString string) *blackHole {
	t.Helper()
	dir, target, ln := listenBeside(t, connString, "pghole-")
	h := &blackHole{dir: dir, target: target}
	t.Cleanup(func() {
		ln.Close()
		h.closeAll()
		os.RemoveAll(dir)
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", h.target)
			if err != nil {
				c.Close()
				continue
			}
			hc := &holeConn{client: c, server: s}
			h.mu.Lock()
			h.conns = append(h.conns, hc)
			h.mu.Unlock()
			go hc.pipe(s, c)
			go hc.pipe(c, s)
		}
	}()
	return h
}

// pipe copies from src to dst until either fails, dropping what it reads
// once the connection is stuck.
func (c *holeConn) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		c.mu.Lock()
		stuck := c.stuck
		c.mu.Unlock()
		if stuck {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// swallow stops forwarding on every connection open now.
func (h *blackHole) swallow() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.mu.Lock()
		c.stuck = true
		c.mu.Unlock()
	}
}

// closeAll closes every connection open through the hole: a store's
// Close would wait on each silent one for pgxpool's 15 s.
func (h *blackHole) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.client.Close()
		c.server.Close()
	}
}

func (h *blackHole) connString() string {
	return fmt.Sprintf("host=%s port=5432 user=clipjob dbname=postgres sslmode=disable", h.dir)
}

// TestAListenerWhoseConnectionWentSilentListensAgain: a relay's
// connection listening for the other relays' commits stops carrying
// anything, without being closed (a network path that drops packets,
// which no TCP keepalive notices for many minutes, and a unix socket
// never). Its readers (SSE clients following runs another replica
// collects) must not wait for good, or for their keepalive re-read, on
// notifications that cannot come: the relay notices the connection is
// silent and listens again on a new one, waking every reader.
func TestAListenerWhoseConnectionWentSilentListensAgain(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	hole := newBlackHole(t, conn)
	reader, err := Open(context.Background(), Options{ConnString: hole.connString(), Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	writer, err := Open(context.Background(), Options{ConnString: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(time.Minute): // far above any stall of a loaded machine
			return false
		}
	}
	cur := store.Cursor{}
	appendLine := func(text string) {
		t.Helper()
		next := store.Cursor{TS: cur.TS + 1, Count: 1}
		if _, err := writer.AppendAfter("run-1", "a", cur, next, []store.Line{{TS: time.Unix(0, next.TS), Container: "agent", Line: text}}, time.Now()); err != nil {
			t.Fatal(err)
		}
		cur = next
	}
	ch := reader.Changed("run-1")
	appendLine("before")
	if !woken(ch) {
		t.Fatal("the reader was not told of a commit before the connection went silent")
	}
	hole.swallow()
	ch = reader.Changed("run-1")
	appendLine("after")
	if !woken(ch) {
		t.Fatal("a minute after its listening connection went silent, the relay's readers were not told of another relay's commit, nor woken to read again")
	}
	// And it goes on hearing of commits on the connection it listens on now.
	ch = reader.Changed("run-1")
	appendLine("later")
	if !woken(ch) {
		t.Fatal("the relay listening again was not told of a later commit")
	}
}

// TestACommitOnASilentConnectionGivesUp: the pool's connections go silent
// without closing while new connections get through. A commit waiting on
// one gives up after CommitTimeout, not the store's Timeout (30 s by
// default: with both flights on silent connections a replica's runs went
// uncollected that long), and the follower's next append, from the stored
// cursor, commits on a new connection; the pool's idle connections, gone
// silent with it, hold no reader.
func TestACommitOnASilentConnectionGivesUp(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	hole := newBlackHole(t, conn)
	s, err := Open(context.Background(), Options{ConnString: hole.connString(), Schema: schema, Timeout: 10 * time.Minute, CommitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer hole.closeAll() // before Close
	line := func(ts int64, text string) []store.Line {
		return []store.Line{{TS: time.Unix(0, ts), Container: "agent", Line: text}}
	}
	first := store.Cursor{TS: 1, Count: 1}
	if _, err := s.AppendAfter("run-1", "a", store.Cursor{}, first, line(1, "before"), time.Now()); err != nil {
		t.Fatal(err)
	}
	// Idle connections in the pool, which go silent with the rest.
	leaveIdle(t, s, 3)
	hole.swallow()
	second := store.Cursor{TS: 2, Count: 1}
	done := make(chan error, 1)
	go func() {
		_, err := s.AppendAfter("run-1", "a", first, second, line(2, "after"), time.Now())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a commit on a connection that carries nothing succeeded")
		}
		t.Logf("the commit on the silent connection gave up: %v", err)
	case <-time.After(2 * time.Minute): // CommitTimeout is 1 s; Timeout 10 minutes
		t.Fatal("two minutes after the pool's connections went silent, a commit on one still waits: it waits out the store's Timeout, not CommitTimeout")
	}
	// The next readers do not wait on the idle connections that went
	// silent: the pool closed them when the commit gave up.
	var stored store.Cursor
	read := make(chan error, 1)
	go func() {
		var err error
		for range 3 {
			if stored, err = s.Cursor("run-1", "a"); err != nil {
				break
			}
		}
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("two minutes after the commit gave up, reads of the stored cursor still wait: on the pool's idle connections that went silent")
	}
	if _, err := s.AppendAfter("run-1", "a", stored, store.Cursor{TS: 3, Count: 1}, line(3, "again"), time.Now()); err != nil {
		t.Fatalf("the append from the stored cursor %+v, on a new connection: %v", stored, err)
	}
}

// leaveIdle opens n connections in s's pool and leaves them idle there.
func leaveIdle(t *testing.T, s *Store, n int) {
	t.Helper()
	var held []*pgxpool.Conn
	for range n {
		c, err := s.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
}

// TestAReadOnASilentIdleConnectionGivesUpSoon: the pool's idle
// connections go silent without closing, while new connections get
// through. A read (the mirror's after each commit, on a follower's way)
// is not held for the store's Timeout by each: the pool's round trip on
// an idle connection before handing it out gives up after idlePingTimeout
// and the read goes on a new connection.
func TestAReadOnASilentIdleConnectionGivesUpSoon(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	hole := newBlackHole(t, conn)
	s, err := Open(context.Background(), Options{ConnString: hole.connString(), Schema: schema, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer hole.closeAll() // before Close
	if _, err := s.AppendAfter("run-1", "a", store.Cursor{}, store.Cursor{TS: 1, Count: 1},
		[]store.Line{{TS: time.Unix(0, 1), Container: "agent", Line: "before"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	leaveIdle(t, s, 3)
	hole.swallow()
	// The pool checks only connections idle a second or more: the others
	// were just used, by a caller that would have seen them fail.
	time.Sleep(1100 * time.Millisecond)
	read := make(chan error, 1)
	go func() {
		got, err := s.Cursor("run-1", "a")
		if err == nil && got != (store.Cursor{TS: 1, Count: 1}) {
			err = fmt.Errorf("read cursor %+v, want the stored {1 1}", got)
		}
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute): // 17 s here (see idlePingTimeout); Timeout 10 minutes
		t.Fatal("two minutes after the pool's idle connections went silent, a read still waits on one: the pool's check before use is not bounded")
	}
}
