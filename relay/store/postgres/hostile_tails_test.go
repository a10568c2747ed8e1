package postgres

// Tests that try to make a follower served from the tails (tails.go) read
// a line twice, miss one, read one out of order, read one not stored, or
// wait on a finished run for good.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// hostileFollower follows a run as api.streamLog does (Changed before
// Page, a page of 200, continue while a page ended before the log, end
// when done && after >= lastSeq, else wait for a change or a keepalive).
type hostileFollower struct {
	mu    sync.Mutex
	seqs  []uint64
	jsons []string
	ended bool
	err   error
}

func (f *hostileFollower) state() (n int, ended bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seqs), f.ended, f.err
}

// hostileFollow starts a follower from after; retry: an error is a
// client that reconnects from its last id, rather than the end.
func hostileFollow(ctx context.Context, s *Store, run string, after uint64, keepalive time.Duration, retry bool) *hostileFollower {
	f := &hostileFollower{}
	go func() {
		for ctx.Err() == nil {
			changed := s.Changed(run)
			lines := 0
			lastSeq, done, found, err := s.Page(run, after, 200, func(l store.RawLine) {
				f.mu.Lock()
				f.seqs = append(f.seqs, l.Seq)
				f.jsons = append(f.jsons, string(l.JSON))
				f.mu.Unlock()
				after, lines = l.Seq, lines+1
			})
			if err != nil && retry {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if err != nil || !found {
				f.mu.Lock()
				f.err = fmt.Errorf("page after %d: found %v, %v", after, found, err)
				f.mu.Unlock()
				return
			}
			if after < lastSeq && lines > 0 {
				continue
			}
			if done && after >= lastSeq {
				f.mu.Lock()
				f.ended = true
				f.mu.Unlock()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-time.After(keepalive):
			}
		}
	}()
	return f
}

func hostileWaitFor(t *testing.T, what string, d time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// hostileWriter appends to one stream of a run, a line at a time.
type hostileWriter struct {
	s      *Store
	run    string
	stream string
	cur    store.Cursor
}

func (w *hostileWriter) append(t *testing.T, texts ...string) uint64 {
	t.Helper()
	next := store.Cursor{TS: w.cur.TS + 1, Count: 1}
	var lines []store.Line
	for _, text := range texts {
		lines = append(lines, store.Line{TS: time.Unix(0, next.TS), Container: "agent", Line: text})
	}
	last, err := w.s.AppendAfter(w.run, w.stream, w.cur, next, lines, time.Now())
	if err != nil {
		t.Errorf("append to %s/%s: %v", w.run, w.stream, err)
		return 0
	}
	w.cur = next
	return last
}

// hostileBarrier returns once to has heard every notification from sent
// so far (one sender's notifications arrive in order).
func hostileBarrier(t *testing.T, from, to *Store) {
	t.Helper()
	run := fmt.Sprint("barrier-", time.Now().UnixNano())
	ch := to.Changed(run)
	if _, err := from.UpdateRun(run, func(*store.Run) {}); err != nil {
		t.Fatal(err)
	}
	waitWoken(t, ch, "the barrier")
}

// killNotifier stops s's sender and listener as a SIGKILL right after a
// commit would: what s commits from now on is never notified.
func killNotifier(s *Store) {
	s.stopNotifying()
	s.notifying.Wait()
}

// TestAFollowerReadsWhatALostNotificationSaid: replica b commits and is
// killed before its NOTIFY goes out. A follower of the run on replica a,
// caught up and served from a's tail, reads what b committed at its next
// keepalive (a page with nothing new in the tail queries), not at the
// run's next change, which may never come: the run's end, or its lines.
func TestAFollowerReadsWhatALostNotificationSaid(t *testing.T) {
	for _, c := range []struct {
		lost   string
		commit func(t *testing.T, b *Store, w *hostileWriter)
		read   func(f *hostileFollower) bool
	}{
		{"the run's end", func(t *testing.T, b *Store, _ *hostileWriter) {
			if _, err := b.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" }); err != nil {
				t.Fatal(err)
			}
		}, func(f *hostileFollower) bool { _, ended, _ := f.state(); return ended }},
		{"a line", func(t *testing.T, _ *Store, w *hostileWriter) { w.append(t, "third") },
			func(f *hostileFollower) bool { n, _, _ := f.state(); return n == 3 }},
	} {
		t.Run(c.lost, func(t *testing.T) {
			a, b := openPair(t)
			w := &hostileWriter{s: b, run: "run-1", stream: "agent"}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w.append(t, "first")
			// Keepalives are 300 ms here (15 s in the API).
			f := hostileFollow(ctx, a, "run-1", 0, 300*time.Millisecond, false)
			caughtUp := func(n int) {
				t.Helper()
				if !hostileWaitFor(t, "caught up", time.Minute, func() bool { got, _, _ := f.state(); return got == n && a.changes.Waiting("run-1") }) {
					t.Fatalf("the follower did not read line %d", n)
				}
			}
			caughtUp(1)
			w.append(t, "second") // carried to a's tail
			caughtUp(2)
			killNotifier(b)
			c.commit(t, b, w)
			if !hostileWaitFor(t, c.lost, time.Minute, func() bool { return c.read(f) }) {
				t.Fatalf("%s is stored, but the follower on another replica did not read it in a minute of keepalives: its pages were served from the tail", c.lost)
			}
		})
	}
}

// TestALineAfterTheEndDoesNotHideTheEnd: a line is committed after the
// run's end (a stale owner's, a stream still draining after the pod was
// seen deleted). The follower, woken by the end, asks Changed again; before
// its Page, the late line's notification arrives and starts a's tail at
// that line. The tail, begun after no query found the run running, serves
// nothing: the follower's pages query, read the run done, and it ends.
func TestALineAfterTheEndDoesNotHideTheEnd(t *testing.T) {
	a, b := openPair(t)
	spy, err := pgx.Connect(context.Background(), a.opts.ConnString)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close(context.Background())
	if _, err := spy.Exec(context.Background(), "LISTEN "+pgx.Identifier{a.schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for {
			sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			n, err := spy.WaitForNotification(sctx)
			scancel()
			if err != nil {
				return
			}
			t.Logf("heard %q", n.Payload)
		}
	}()
	w := &hostileWriter{s: b, run: "run-1", stream: "agent"}
	w.append(t, "first")
	hostileBarrier(t, b, a) // a heard line 1
	ch := a.Changed("run-1")
	if _, _, _, err := a.Page("run-1", 0, 200, func(store.RawLine) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" }); err != nil {
		t.Fatal(err)
	}
	waitWoken(t, ch, "the end")
	ch = a.Changed("run-1") // the follower, woken, asks before its page
	w.append(t, "late")
	waitWoken(t, ch, "the late line")
	{
		_, tl, ok := a.tails.page("run-1", 1, 10, time.Now())
		t.Logf("a's tail after the late line's notification: holds line 2: %v (last %d)", ok, tl)
	}
	var got []uint64
	last, done, _, err := a.Page("run-1", 1, 200, func(l store.RawLine) { got = append(got, l.Seq) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page after 1: lines %v, last %d, done %v", got, last, done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := hostileFollow(ctx, a, "run-1", 1+uint64(len(got)), 300*time.Millisecond, false)
	if !hostileWaitFor(t, "the end", time.Minute, func() bool { _, ended, _ := f.state(); return ended }) {
		t.Fatalf("the run is done (a line appended after its end), but its follower read it running in a minute of keepalives (first page: %v, done %v)", got, done)
	}
}

// TestEveryFollowerEndsWhileLateLinesRaceTheEnd: the same, without
// arranging the interleaving: runs end while a second stream on another
// replica goes on appending a few lines after the end; followers on three
// replicas must all end (every line read once, in order, as stored).
func TestEveryFollowerEndsWhileLateLinesRaceTheEnd(t *testing.T) {
	a, b := openPair(t)
	c, err := Open(context.Background(), a.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const runs = 40
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type fl struct {
		run string
		s   string
		f   *hostileFollower
	}
	var followers []fl
	var wg sync.WaitGroup
	for i := range runs {
		run := fmt.Sprint("run-", i)
		if _, err := b.UpdateRun(run, func(r *store.Run) { r.Phase = "Running" }); err != nil {
			t.Fatal(err)
		}
		for name, s := range map[string]*Store{"a": a, "b": b, "c": c} {
			followers = append(followers, fl{run, name, hostileFollow(ctx, s, run, 0, 2*time.Second, false)})
		}
		wg.Go(func() {
			w1 := &hostileWriter{s: a, run: run, stream: "one"}
			w2 := &hostileWriter{s: c, run: run, stream: "two"}
			for n := range 10 {
				w1.append(t, fmt.Sprint("one ", n))
				w2.append(t, fmt.Sprint("two ", n))
			}
			var late sync.WaitGroup
			late.Go(func() {
				for n := range 5 {
					w2.append(t, fmt.Sprint("two late ", n))
				}
			})
			if _, err := b.UpdateRun(run, func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" }); err != nil {
				t.Error(err)
			}
			late.Wait()
		})
	}
	wg.Wait()
	hostileWaitFor(t, "every follower ended", 2*time.Minute, func() bool {
		for _, x := range followers {
			if _, ended, err := x.f.state(); !ended && err == nil {
				return false
			}
		}
		return true
	})
	stuck := 0
	for _, x := range followers {
		n, ended, err := x.f.state()
		if err != nil {
			t.Errorf("%s on %s: %v", x.run, x.s, err)
		}
		x.f.mu.Lock()
		for i, seq := range x.f.seqs {
			if seq != uint64(i+1) {
				t.Errorf("%s on %s: line %d read as the %dth", x.run, x.s, seq, i+1)
				break
			}
		}
		x.f.mu.Unlock()
		if !ended {
			stuck++
			r, _ := a.Run(x.run)
			t.Errorf("%s on %s: not ended after 2 minutes; read %d lines, the run: done %v, last %d", x.run, x.s, n, r.Done, r.LastSeq)
		}
	}
	t.Logf("%d of %d followers stuck", stuck, len(followers))
}

// TestForgedNotificationsReachNoFollower: another role, LISTENing on the relays'
// channel, learns the replicas' sender ids and notifies payloads that
// name them, malformed entries, lines out of order, huge seqs and a
// payload at the server's limit. The follower on the reader replica reads
// only stored lines, once, in order, and keeps being served.
func TestForgedNotificationsReachNoFollower(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	a, err := Open(context.Background(), Options{ConnString: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(context.Background(), Options{ConnString: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	admin, err := pgx.Connect(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	num, _, _ := strings.Cut(schema, "_")
	role := num + "_hostile"
	if _, err := admin.Exec(context.Background(), `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	intruder, err := pgx.Connect(context.Background(), strings.Replace(conn, "user=clipjob", "user="+role, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		intruder.Close(context.Background())
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	}()
	if _, err := intruder.Exec(context.Background(), "LISTEN "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	w := &hostileWriter{s: b, run: "run-1", stream: "agent"}
	w.append(t, "first")
	// The intruder hears b's sender id.
	nctx, ncancel := context.WithTimeout(context.Background(), time.Minute)
	n, err := intruder.WaitForNotification(nctx)
	ncancel()
	if err != nil {
		t.Fatal(err)
	}
	bSelf, _, _ := strings.Cut(n.Payload, "\n")
	t.Logf("heard b's payload %q", n.Payload)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := hostileFollow(ctx, a, "run-1", 0, time.Second, false)
	if !hostileWaitFor(t, "line 1", time.Minute, func() bool { n, _, _ := f.state(); return n == 1 && a.changes.Waiting("run-1") }) {
		t.Fatal("no line 1")
	}
	forgedLine := func(seq int) string {
		return fmt.Sprintf("\x01%d {\"seq\":%d,\"ts\":\"2026-01-01T00:00:00Z\",\"container\":\"agent\",\"line\":\"forged\"}", seq, seq)
	}
	huge := bSelf + "\nrun-1"
	for seq := 2; len(huge) < 7900; seq++ {
		huge += "\n" + forgedLine(seq)
	}
	payloads := []string{
		bSelf + "\nrun-1\n" + forgedLine(2),
		a.out.self + "\nrun-1\n" + forgedLine(2), // a's own id: ignored, no wake
		"\nrun-1\n" + forgedLine(2),
		"run-1\n" + forgedLine(2),
		bSelf + "\n" + forgedLine(2) + "\nrun-1\n" + forgedLine(2) + "\n" + forgedLine(3),
		bSelf + "\nrun-1\n\x01\n\x01x y\n\x01-1 {}\n\x010 {}\n\x0118446744073709551615 {}\n\x0118446744073709551616 {}",
		bSelf + "\nrun-1\n" + forgedLine(3) + "\n" + forgedLine(2),
		huge,
		"",
		bSelf,
	}
	for _, p := range payloads {
		if _, err := intruder.Exec(context.Background(), `SELECT pg_notify($1, $2)`, schema, p); err != nil {
			t.Logf("notify %q...: %v", p[:min(len(p), 40)], err)
		}
	}
	// b, trusted, goes on; what the follower reads must be what is stored.
	for n := range 5 {
		w.append(t, fmt.Sprint("genuine ", n))
		time.Sleep(50 * time.Millisecond)
		if _, err := intruder.Exec(context.Background(), `SELECT pg_notify($1, $2)`, schema, bSelf+"\nrun-1\n"+forgedLine(int(w.cur.TS)+1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.UpdateRun("run-1", func(r *store.Run) { r.Done = true }); err != nil {
		t.Fatal(err)
	}
	if !hostileWaitFor(t, "the end", time.Minute, func() bool { _, ended, _ := f.state(); return ended }) {
		t.Fatal("the follower did not end")
	}
	var want []string
	a.tails.dropAll()
	if _, _, _, err := a.Page("run-1", 0, 200, func(l store.RawLine) { want = append(want, string(l.JSON)) }); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fmt.Sprint(f.jsons) != fmt.Sprint(want) {
		t.Fatalf("the follower read %q; stored %q", f.jsons, want)
	}
}

// TestFollowersOnThreeReplicasReadEveryLineOnceThroughAListenerGoneSilent: two writers
// on two replicas append to one run at once, short lines, lines over the
// 4 KiB carried, cursor-only appends; a third replica's connections go
// silent mid-stream (its listener reconnects); followers on all three
// read every line once, in order, as stored, and see the end.
func TestFollowersOnThreeReplicasReadEveryLineOnceThroughAListenerGoneSilent(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	hole := newBlackHole(t, conn)
	opts := Options{ConnString: conn, Schema: schema}
	a, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := Open(context.Background(), Options{ConnString: hole.connString(), Schema: schema, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := b.UpdateRun("run-1", func(r *store.Run) { r.Phase = "Running" }); err != nil {
		t.Fatal(err)
	}
	fs := map[string]*hostileFollower{}
	for name, s := range map[string]*Store{"a": a, "b": b, "c": c} {
		fs[name] = hostileFollow(ctx, s, "run-1", 0, 2*time.Second, true)
	}
	long := strings.Repeat("x", 5000)
	var wg sync.WaitGroup
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			w := &hostileWriter{s: s, run: "run-1", stream: fmt.Sprint("stream-", i)}
			for n := range 300 {
				switch {
				case n%37 == 0:
					w.append(t, fmt.Sprint(i, " long ", n, long))
				case n%23 == 0:
					w.append(t) // the cursor alone
				case n%11 == 0:
					w.append(t, fmt.Sprint(i, " a ", n), fmt.Sprint(i, " b ", n), fmt.Sprint(i, " c ", n))
				default:
					w.append(t, fmt.Sprint(i, " line ", n))
				}
				if n == 150 && i == 0 {
					hole.swallow()
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if _, err := a.UpdateRun("run-1", func(r *store.Run) { r.Done, r.Phase = true, "Succeeded" }); err != nil {
		t.Fatal(err)
	}
	hostileWaitFor(t, "every follower ended", 2*time.Minute, func() bool {
		for _, f := range fs {
			if _, ended, _ := f.state(); !ended {
				return false
			}
		}
		return true
	})
	var want []string
	a.tails.dropAll()
	for after := uint64(0); ; {
		n := 0
		if _, _, _, err := a.Page("run-1", after, 1000, func(l store.RawLine) { want = append(want, string(l.JSON)); after, n = l.Seq, n+1 }); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	for name, f := range fs {
		n, ended, err := f.state()
		f.mu.Lock()
		same := fmt.Sprint(f.jsons) == fmt.Sprint(want)
		f.mu.Unlock()
		if !ended || err != nil || !same {
			t.Errorf("follower on %s: %d lines (%d stored), as stored %v, ended %v, %v", name, n, len(want), same, ended, err)
		}
	}
}

// TestCountersStayExactWhileUpdateRunRacesAppends: a run first created by
// an append (phase Unknown), then described by UpdateRun over and over
// while two streams append: the counters in the columns are every line's,
// and the record read overlays them.
func TestCountersStayExactWhileUpdateRunRacesAppends(t *testing.T) {
	a, b := openPair(t)
	var wg sync.WaitGroup
	var bytes int64
	var mu sync.Mutex
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			w := &hostileWriter{s: s, run: "run-1", stream: fmt.Sprint("s", i)}
			for n := range 200 {
				text := fmt.Sprint(i, " ", n, strings.Repeat("y", n))
				w.append(t, text)
				mu.Lock()
				bytes += int64(len(text))
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for n := range 100 {
			if _, err := b.UpdateRun("run-1", func(r *store.Run) { r.Phase, r.Pod = "Running", fmt.Sprint("pod-", n) }); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	r, err := a.Run("run-1")
	if err != nil {
		t.Fatal(err)
	}
	sums, err := a.RunsWhere(store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if r.LastSeq != 400 || r.Bytes != bytes || r.Phase != "Running" || len(sums) != 1 || sums[0].LastSeq != 400 || sums[0].Bytes != bytes {
		t.Fatalf("run: last %d bytes %d (want 400, %d) phase %q; summaries %+v", r.LastSeq, r.Bytes, bytes, r.Phase, sums)
	}
}
