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
// 8000 bytes); its entries are separated by newlines, which no run id and
// no line's JSON holds: each run changed, with the lines it carries (see
// tails.go). Its first line names the sender, "!" and a random id (no run
// id starts with "!"): the server hands a Store its own notifications
// too, and their readers, woken at the commit, must not read again for
// nothing.
const payloadBytes = 7000

// outbox is what the next notification says: the runs changed since the
// last one sent, and the lines committed to them.
type outbox struct {
	mu      sync.Mutex
	self    string // the payloads' first line
	pending map[string]*carried
	wake    chan struct{} // one token: something is pending
}

// changed says that run changed, other than by lines alone: this store's
// readers of run wake at once and query, and the other relays' at the
// next notification.
func (s *Store) changed(run string) {
	s.tails.drop(run)
	s.changes.Notify(run)
	s.out.put(run, func(c *carried) { *c = carried{idOnly: true} })
}

// committed says that lines, of seqs from first, were committed to run
// (nil: more than are carried).
func (s *Store) committed(run string, first uint64, lines [][]byte) {
	if lines == nil {
		s.changed(run)
		return
	}
	s.tails.add(run, first, lines, s.changes.Waiting(run), s.opts.Clock.Now())
	s.changes.Notify(run)
	s.out.put(run, func(c *carried) { c.addLines(first, lines) })
}

// put changes what the next notification says of run, and wakes the
// sender.
func (o *outbox) put(run string, change func(*carried)) {
	o.mu.Lock()
	c := o.pending[run]
	if c == nil {
		c = &carried{}
		o.pending[run] = c
	}
	change(c)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take empties the outbox into payloads.
func (o *outbox) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	b := []byte(o.self)
	for run, c := range o.pending {
		entry := appendRun(nil, run, c)
		if len(o.self)+len(entry) > payloadBytes {
			entry = appendRun(nil, run, &carried{idOnly: true})
		}
		if len(b) > len(o.self) && len(b)+len(entry) > payloadBytes {
			out = append(out, string(b))
			b = []byte(o.self)
		}
		b = append(b, entry...)
		delete(o.pending, run)
	}
	if len(b) > len(o.self) {
		out = append(out, string(b))
	}
	return out
}

// putBack returns payloads that were not sent to the outbox, their runs'
// lines left out: by the time they are sent others may have followed.
func (o *outbox) putBack(payloads []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range payloads {
		runs, _ := parsePayload(strings.Split(p, "\n")[1:])
		for _, run := range runs {
			o.pending[run] = &carried{idOnly: true}
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
	s.out = outbox{self: "!" + rand.Text(), pending: map[string]*carried{}, wake: make(chan struct{}, 1)}
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
	senders := senders{}
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
			if entries := strings.Split(n.Payload, "\n"); entries[0] != s.out.self {
				runs, said := parsePayload(entries[1:])
				carries := false
				for _, c := range said {
					carries = carries || !c.idOnly
				}
				trusted := carries && senders.trusted(ctx, conn, n.PID, s.opts.Clock.Now())
				for run, c := range said {
					if c.idOnly || !trusted {
						s.tails.drop(run)
					} else {
						s.tails.add(run, c.first, c.lines, s.changes.Waiting(run), s.opts.Clock.Now())
					}
				}
				s.changes.Notify(runs...)
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
		s.tails.dropAll() // what was said meanwhile is lost
		s.changes.NotifyAll()
	}
}

// PostgreSQL lets any role connected to the database NOTIFY on any
// channel, and the lines a notification carries are served to followers
// as stored: they are taken only from a backend of the relays' own role
// (which could store lines anyway). Another role's notification still
// wakes readers, who then query.
//
// senders are the backends seen to be the relays' role's, each trusted
// for senderTrust from its check (a backend's pid is reused only once it
// has ended, and a relay's connections live for an hour).
type senders map[uint32]time.Time

const senderTrust = 10 * time.Second

// trusted says whether backend pid is the relays' role's, asking on conn
// (the listening connection, idle between notifications) once per
// senderTrust.
func (ss senders) trusted(ctx context.Context, conn *pgx.Conn, pid uint32, now time.Time) bool {
	if until, ok := ss[pid]; ok && now.Before(until) {
		return true
	}
	qctx, cancel := context.WithTimeout(ctx, listenQuiet)
	defer cancel()
	var ok bool
	if err := conn.QueryRow(qctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND usename = current_user)`, int32(pid)).Scan(&ok); err != nil || !ok {
		delete(ss, pid)
		return false
	}
	if len(ss) > 1000 {
		clear(ss) // pids of connections long closed
	}
	ss[pid] = now.Add(senderTrust)
	return true
}
