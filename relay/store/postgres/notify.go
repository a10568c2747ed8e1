package postgres

import (
	"context"
	"crypto/rand"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Each Store tells the others, through the schema's notification channel,
// which runs it changed, and listens there itself, so Changed wakes for
// what another relay committed, not only for this one's writes.
//
// The notifications are sent after the commits, coalesced, by one sender
// per Store: a NOTIFY inside each commit would serialize every commit on
// the server's notification lock. A relay that dies between a commit and
// its notification leaves the others' readers to their next keepalive.

// payloadBytes bounds one notification's payload (the server's limit is
// 8000 bytes); run ids are separated by newlines, which no run id holds.
// Its first line names the sender, "!" and a random id (no run id starts
// with "!"): the server hands a Store its own notifications too, and
// their readers, woken at the commit, must not read again for nothing.
const payloadBytes = 7000

// outbox is the runs changed since the last notification sent.
type outbox struct {
	mu      sync.Mutex
	self    string // the payloads' first line
	pending map[string]bool
	wake    chan struct{} // one token: something is pending
}

// changed wakes this store's readers of run at once, and the other
// relays' at the next notification.
func (s *Store) changed(run string) {
	s.changes.Notify(run)
	s.out.mu.Lock()
	s.out.pending[run] = true
	s.out.mu.Unlock()
	select {
	case s.out.wake <- struct{}{}:
	default:
	}
}

// take empties the outbox into payloads.
func (o *outbox) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	var b strings.Builder
	for run := range o.pending {
		if b.Len() > 0 && b.Len()+1+len(run) > payloadBytes {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() == 0 {
			b.WriteString(o.self)
		}
		b.WriteByte('\n')
		b.WriteString(run)
		delete(o.pending, run)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// putBack returns payloads that were not sent to the outbox.
func (o *outbox) putBack(payloads []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range payloads {
		for _, run := range strings.Split(p, "\n")[1:] {
			o.pending[run] = true
		}
	}
}

// startNotifying connects and LISTENs (Open fails if it cannot), then
// listens and sends in the background until Close.
func (s *Store) startNotifying(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := s.listenConn(ctx, cfg)
	if err != nil {
		return err
	}
	s.out = outbox{self: "!" + rand.Text(), pending: map[string]bool{}, wake: make(chan struct{}, 1)}
	nctx, cancel := context.WithCancel(context.Background())
	s.stopNotifying = cancel
	s.notifying.Add(2)
	go func() { defer s.notifying.Done(); s.listen(nctx, cfg, conn) }()
	go func() { defer s.notifying.Done(); s.send(nctx) }()
	return nil
}

const backoffMin, backoffMax = 100 * time.Millisecond, 5 * time.Second

// listenQuiet: a listening connection that heard nothing for this long
// is asked for one round trip, within as long again, or listened on anew.
const listenQuiet = 5 * time.Second

// send notifies the runs changed, one NOTIFY statement at a time: what
// is changed while one is sent goes in the next.
func (s *Store) send(ctx context.Context) {
	backoff := backoffMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.out.wake:
		}
		payloads := s.out.take()
		if len(payloads) == 0 {
			continue
		}
		// Bounded by Timeout, and ended by Close: a send waiting on a
		// connection gone silent held Close for the whole Timeout.
		sctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		_, err := s.pool.Exec(sctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, s.schema, payloads)
		cancel()
		if err == nil {
			backoff = backoffMin
			continue
		}
		s.out.putBack(payloads)
		select {
		case <-ctx.Done():
			return
		case <-s.opts.Clock.After(backoff):
		}
		backoff = min(backoff*2, backoffMax)
		select {
		case s.out.wake <- struct{}{}:
		default:
		}
	}
}

func (s *Store) listenConn(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// listen hands each notification to Changed's waiters. While it is not
// connected, notifications are lost: once listening again, it wakes every
// waiter, and each re-reads what it follows.
func (s *Store) listen(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn) {
	backoff := backoffMin
	for {
		for conn != nil {
			// Timed as the store's statements are (Timeout), by real
			// time: it bounds a wait on the network.
			wctx, cancel := context.WithTimeout(ctx, listenQuiet)
			n, err := conn.WaitForNotification(wctx)
			quiet := err != nil && ctx.Err() == nil && wctx.Err() != nil
			cancel()
			if quiet {
				// Nothing heard for listenQuiet: a connection whose path
				// went silent (packets dropped, nothing closed) would wait
				// for good, and no keepalive notices it for many minutes.
				// One round trip says whether it still answers.
				pctx, cancel := context.WithTimeout(ctx, listenQuiet)
				err = conn.Ping(pctx)
				cancel()
				if err == nil {
					continue
				}
			}
			if err != nil {
				conn.Close(context.Background())
				conn = nil
				break
			}
			if runs := strings.Split(n.Payload, "\n"); runs[0] != s.out.self {
				s.changes.Notify(runs...) // a sender's line wakes no reader
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.opts.Clock.After(backoff):
		}
		var err error
		if conn, err = s.listenConn(ctx, cfg); err != nil {
			backoff = min(backoff*2, backoffMax)
			continue
		}
		backoff = backoffMin
		s.changes.NotifyAll()
	}
}
