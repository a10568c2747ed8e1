package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// LogSource opens a container's log, following, with timestamps, from
// since (zero: from the start). previous asks for the container's previous
// instance, once a restart replaced the one being followed.
type LogSource interface {
	Stream(ctx context.Context, namespace, pod, container string, since time.Time, previous bool) (io.ReadCloser, error)
}

// APILogSource reads logs through the API server's pods/log.
type APILogSource struct{ Client kubernetes.Interface }

// Stream implements LogSource.
func (a APILogSource) Stream(ctx context.Context, ns, pod, container string, since time.Time, previous bool) (io.ReadCloser, error) {
	opts := &corev1.PodLogOptions{Container: container, Follow: !previous, Timestamps: true, Previous: previous}
	if !since.IsZero() {
		opts.SinceTime = &metav1.Time{Time: since}
	}
	return a.Client.CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
}

// StreamRef names one container instance of an agent pod: a restarted
// container (new ID) is a new stream of the same run.
type StreamRef struct {
	Run, Namespace, Pod, PodUID, Container, ContainerID string
}

// Key is the stream's cursor key in the store.
func (r StreamRef) Key() string { return r.PodUID + "/" + r.Container + "/" + r.ContainerID }

// FollowOptions tune followers. Each field's comment gives its default.
type FollowOptions struct {
	// MaxStreamLifetime reconnects a stream proactively, before API
	// servers, proxies or the kubelet cut long requests. Default 30m.
	MaxStreamLifetime time.Duration
	// BackoffMin and BackoffMax bound the wait between failed attempts.
	// Default 200ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// DrainIdle: once the container has terminated, the stream is done
	// after this long without a new line (a kubelet ends the stream itself
	// at EOF; some servers keep it open). Default 3s. DrainMax is how long
	// to wait for a terminated container's stream to send anything at all
	// (a kubelet may scan a large file for SinceTime). Default 30s.
	DrainIdle, DrainMax time.Duration
	// BatchLines and BatchWait bound how long lines wait to be committed.
	// Default 256 lines, 100ms.
	BatchLines int
	BatchWait  time.Duration
}

// DefaultFollowOptions are the values the comments above name.
func DefaultFollowOptions() FollowOptions {
	return FollowOptions{
		MaxStreamLifetime: 30 * time.Minute,
		BackoffMin:        200 * time.Millisecond,
		BackoffMax:        30 * time.Second,
		DrainIdle:         3 * time.Second,
		DrainMax:          30 * time.Second,
		BatchLines:        256,
		BatchWait:         100 * time.Millisecond,
	}
}

// setDefaults fills what is unset from DefaultFollowOptions.
func (o *FollowOptions) setDefaults() {
	d := DefaultFollowOptions()
	def := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&o.MaxStreamLifetime, d.MaxStreamLifetime)
	def(&o.BackoffMin, d.BackoffMin)
	def(&o.BackoffMax, d.BackoffMax)
	def(&o.DrainIdle, d.DrainIdle)
	def(&o.DrainMax, d.DrainMax)
	def(&o.BatchWait, d.BatchWait)
	if o.BatchLines <= 0 {
		o.BatchLines = d.BatchLines
	}
}

// containerState is what the follower needs to know of its container now.
type containerState struct {
	ended    bool // terminated, replaced, or the pod finished
	replaced bool // a restart replaced this instance: read it as "previous"
	gone     bool // the pod no longer exists
}

// errEndedEarly is a stream that ended while its container still runs: a
// server or proxy cut it. Reconnect, with backoff.
var errEndedEarly = errors.New("log stream ended while the container runs")

type follower struct {
	ref    StreamRef
	src    LogSource
	store  *Store
	redact *Redactor
	opts   FollowOptions
	state  func() containerState
	slots  chan struct{} // bounds open streams
	log    logr.Logger
	// committed, when set, runs after each commit (the NDJSON mirror).
	committed func()
}

// run follows until the container's log is drained or ctx ends.
func (f *follower) run(ctx context.Context) {
	backoff := f.opts.BackoffMin
	for ctx.Err() == nil {
		done, err := f.session(ctx)
		if done || ctx.Err() != nil {
			return
		}
		st := f.state()
		if err != nil {
			if st.gone {
				f.log.V(1).Info("pod gone; stream closed", "stream", f.ref.Key(), "err", err.Error())
				return
			}
			reconnects.WithLabelValues("error").Inc()
			f.log.V(1).Info("log stream failed; retrying", "stream", f.ref.Key(), "in", backoff, "err", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, f.opts.BackoffMax)
			continue
		}
		backoff = f.opts.BackoffMin
	}
}

type readResult struct {
	line []byte
	err  error
}

// session is one stream: it returns done when the log is drained, or
// (false, err) to reconnect.
func (f *follower) session(ctx context.Context) (bool, error) {
	select {
	case f.slots <- struct{}{}:
	default:
		streamLimitWaits.Inc()
		select {
		case f.slots <- struct{}{}:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	defer func() { <-f.slots }()

	cur, err := f.store.Cursor(f.ref.Run, f.ref.Key())
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithTimeout(ctx, f.opts.MaxStreamLifetime)
	defer cancel()
	rc, err := f.src.Stream(sctx, f.ref.Namespace, f.ref.Pod, f.ref.Container, cur.SinceTime(), f.state().replaced)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	streamsOpen.Inc()
	defer streamsOpen.Dec()

	lines := make(chan readResult, 64)
	stop := make(chan struct{})
	defer close(stop) // before rc.Close (defers run last-first): the reader exits
	go func() {
		defer close(lines)
		send := func(r readResult) bool {
			select {
			case lines <- r:
				return true
			case <-stop:
				return false
			}
		}
		br := bufio.NewReaderSize(rc, 64<<10)
		for {
			b, err := br.ReadBytes('\n')
			// A fragment before an error is a line cut in the middle: it is
			// dropped, and the resume reads it whole (its timestamp has not
			// been counted).
			if err == nil && !send(readResult{line: b}) {
				return
			}
			if err != nil {
				send(readResult{err: err})
				return
			}
		}
	}()

	res := newResume(cur)
	var batch []Line
	started := time.Now()
	var lastLine time.Time // zero until the stream sends anything
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		now := time.Now()
		if _, err := f.store.Append(f.ref.Run, f.ref.Key(), res.cur, batch, now); err != nil {
			return err
		}
		var bytes int
		for _, l := range batch {
			bytes += len(l.Line)
			storeLag.Observe(now.Sub(l.TS).Seconds())
		}
		linesStored.Add(float64(len(batch)))
		bytesStored.Add(float64(bytes))
		batch = batch[:0]
		// Time spent committing is not idle time: lines may have queued
		// up behind a slow fsync.
		lastLine = time.Now()
		if f.committed != nil {
			f.committed()
		}
		return nil
	}
	tick := time.NewTicker(f.opts.BatchWait)
	defer tick.Stop()
	for {
		select {
		case r, ok := <-lines:
			if !ok {
				return false, flush()
			}
			if r.err != nil {
				if err := flush(); err != nil {
					return false, err
				}
				if errors.Is(r.err, io.EOF) {
					if f.state().ended {
						return true, nil // the server ended the stream of a finished container
					}
					if sctx.Err() != nil && ctx.Err() == nil {
						reconnects.WithLabelValues("lifetime").Inc()
						return false, nil
					}
					reconnects.WithLabelValues("eof").Inc()
					return false, errEndedEarly
				}
				if sctx.Err() != nil && ctx.Err() == nil {
					reconnects.WithLabelValues("lifetime").Inc()
					return false, nil
				}
				return false, r.err
			}
			lastLine = time.Now()
			ts, msg, err := splitTimestamp(trimNewline(r.line))
			if err != nil {
				f.log.V(1).Info("skipping a line without timestamp", "stream", f.ref.Key())
				continue
			}
			if !res.accept(ts) {
				continue
			}
			batch = append(batch, Line{TS: ts, Container: f.ref.Container, Line: string(f.redact.Redact(msg))})
			if len(batch) >= f.opts.BatchLines {
				if err := flush(); err != nil {
					return false, err
				}
			}
		case <-tick.C:
			if err := flush(); err != nil {
				return false, err
			}
			if st := f.state(); (st.ended || st.gone) && len(lines) == 0 {
				quiet := !lastLine.IsZero() && time.Since(lastLine) >= f.opts.DrainIdle
				silent := lastLine.IsZero() && time.Since(started) >= f.opts.DrainMax
				if quiet || silent {
					return true, nil
				}
			}
		}
	}
}

func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}
