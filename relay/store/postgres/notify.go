package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every commit that changes a run sends its id on the schema's channel
// (pg_notify in the same transaction: sent if and only if it commits), and
// each Store listens there on a connection of its own, so Changed wakes
// for what another relay committed, not only for this one's writes.

// notifySQL is the statement a changing transaction adds: $1 the channel,
// $2 the run.
const notifySQL = `SELECT pg_notify($1, $2)`

// startListening connects and LISTENs, then keeps listening in the
// background until Close, reconnecting when the connection is lost.
func (s *Store) startListening(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := s.listenConn(ctx, cfg)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(context.Background())
	s.stopListening, s.listening = cancel, make(chan struct{})
	go s.listen(lctx, cfg, conn)
	return nil
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
	defer close(s.listening)
	const backoffMin, backoffMax = 100 * time.Millisecond, 5 * time.Second
	backoff := backoffMin
	for {
		for conn != nil {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				conn.Close(context.Background())
				conn = nil
				break
			}
			s.changes.Notify(n.Payload)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
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
