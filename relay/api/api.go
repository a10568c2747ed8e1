package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/relay/result"
	"github.com/paperclipai/clipjob/relay/store"
)

// API serves runs and their logs (docs/relay.md, "The HTTP API"):
// GET /v1/runs, /v1/runs/{run} and /v1/runs/{run}/log as SSE, NDJSON or
// plain text.
type API struct {
	Store store.Backend
	Auth  Authorizer
	// Keepalive between SSE comments and NDJSON heartbeats. Default 15s.
	Keepalive time.Duration
	// Reauthorize is how often a following response checks the caller may
	// still read the run (decisions are cached for 30s). Default 1m.
	Reauthorize time.Duration
	Log         logr.Logger
	// Clock times keepalives and reauthorization. Default the real clock.
	Clock clock.WithTicker
}

// Handler returns the API's routes, after filling a's defaults.
func (a *API) Handler() http.Handler {
	if a.Keepalive <= 0 {
		a.Keepalive = 15 * time.Second
	}
	if a.Reauthorize <= 0 {
		a.Reauthorize = time.Minute
	}
	if a.Clock == nil {
		a.Clock = clock.RealClock{}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runs", a.listRuns)
	mux.HandleFunc("GET /v1/runs/{run}", a.getRun)
	mux.HandleFunc("GET /v1/runs/{run}/log", a.getLog)
	return mux
}

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, apiError{Code: code, Message: fmt.Sprintf(format, args...)})
}

// user authenticates the request, answering 401 itself on failure.
func (a *API) user(w http.ResponseWriter, r *http.Request) *authnv1.UserInfo {
	u, err := a.Auth.Authenticate(r)
	switch {
	case errors.Is(err, errUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="clipjob-relay"`)
		fail(w, http.StatusUnauthorized, "%v", err)
		return nil
	case err != nil:
		fail(w, http.StatusServiceUnavailable, "checking the token: %v", err)
		return nil
	}
	return u
}

// run loads a run the caller may read, answering 401/404 itself. A run
// the caller may not read is answered like one that does not exist: a 403
// would tell anyone with a token which run ids exist.
func (a *API) run(w http.ResponseWriter, r *http.Request) (*store.Run, *authnv1.UserInfo) {
	u := a.user(w, r)
	if u == nil {
		return nil, nil
	}
	id, job := r.PathValue("run"), r.URL.Query().Get("job")
	var run *store.Run
	var err error
	if keyable(id) && keyable(job) {
		run, err = store.RunOfJob(a.Store, id, job)
	}
	if err != nil {
		fail(w, http.StatusInternalServerError, "reading run %s: %v", id, err)
		return nil, nil
	}
	ok := false
	if run != nil {
		if ok, err = a.Auth.Allowed(r.Context(), u, run.Namespace); err != nil {
			fail(w, http.StatusServiceUnavailable, "checking access: %v", err)
			return nil, nil
		}
	}
	if !ok {
		fail(w, http.StatusNotFound, "run %q: not found, or %s may not read logs in its namespace (needs get pods/log)", id, u.Username)
		return nil, nil
	}
	return run, u
}

// keyable says whether a run id or filter value could match a stored
// run: labels and phases are valid UTF-8 without NUL, and PostgreSQL
// refuses other bytes in a query, where bbolt matches nothing.
func keyable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func (a *API) listRuns(w http.ResponseWriter, r *http.Request) {
	u := a.user(w, r)
	if u == nil {
		return
	}
	q := r.URL.Query()
	limit, err := limitParam(q.Get("limit"))
	if err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	f := store.Filter{Agent: q.Get("agent"), Company: q.Get("company"), Phase: q.Get("phase")}
	var runs []store.Summary
	if keyable(f.Agent) && keyable(f.Company) && keyable(f.Phase) {
		runs, err = a.Store.RunsWhere(f)
	}
	if err != nil {
		fail(w, http.StatusInternalServerError, "listing runs: %v", err)
		return
	}
	allowed := map[string]bool{}
	out := []store.Run{}
	for _, run := range runs {
		ok, seen := allowed[run.Namespace]
		if !seen {
			ok, err = a.Auth.Allowed(r.Context(), u, run.Namespace)
			if err != nil {
				fail(w, http.StatusServiceUnavailable, "checking access: %v", err)
				return
			}
			allowed[run.Namespace] = ok
		}
		if !ok {
			continue
		}
		if len(out) == limit {
			writeJSON(w, http.StatusOK, map[string]any{"runs": out, "truncated": true})
			return
		}
		// The index keeps summaries: the record is read whole for the
		// runs returned only (at most limit).
		rec, err := a.Store.Run(run.ID)
		if err != nil {
			fail(w, http.StatusInternalServerError, "reading run %s: %v", run.ID, err)
			return
		}
		if rec != nil { // deleted by retention since the listing
			out = append(out, *rec)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"runs": out})
}

// DefaultListLimit bounds GET /v1/runs unless the caller asks for more:
// a client wants one agent's runs, or the newest few, not megabytes.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
)

func limitParam(v string) (int, error) {
	if v == "" {
		return DefaultListLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxListLimit {
		return 0, fmt.Errorf("limit %q: want a number of runs from 1 to %d", v, MaxListLimit)
	}
	return n, nil
}

func (a *API) getRun(w http.ResponseWriter, r *http.Request) {
	if run, _ := a.run(w, r); run != nil {
		writeJSON(w, http.StatusOK, run)
	}
}

// event is one item of a log response.
type event struct {
	Type string `json:"type"` // line, end
	*store.Line
	*End
}

// End closes a log: how the run ended and what it produced.
type End struct {
	Phase    string         `json:"phase"`
	ExitCode *int32         `json:"exitCode,omitempty"`
	Reason   string         `json:"reason,omitempty"`
	LastSeq  uint64         `json:"lastSeq"`
	Result   *result.Result `json:"result,omitempty"`
}

func (a *API) getLog(w http.ResponseWriter, r *http.Request) {
	run, user := a.run(w, r)
	if run == nil {
		return
	}
	after, err := cursorParam(r)
	if err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	accept := r.Header.Get("Accept")
	sse := strings.Contains(accept, "text/event-stream")
	if !sse && !strings.Contains(accept, "application/x-ndjson") {
		a.plainLog(w, run.ID, after)
		return
	}
	if sse && run.Done && after >= run.LastSeq && r.Header.Get("Last-Event-ID") != "" {
		w.WriteHeader(http.StatusNoContent) // an EventSource reconnecting after the end: stop
		return
	}
	ew := newEventWriter(w, sse)
	// A follower may stay for hours: access revoked meanwhile ends it.
	checked := a.Clock.Now()
	allowed := func(ctx context.Context) bool {
		if a.Clock.Since(checked) < a.Reauthorize {
			return true
		}
		checked = a.Clock.Now()
		ok, err := a.Auth.Allowed(ctx, user, run.Namespace)
		return err == nil && ok
	}
	a.streamLog(r.Context(), ew, run.ID, after, r.URL.Query().Get("follow") != "false", allowed)
}

// streamLog writes the run's lines after the cursor, then its end once the
// run is done; following, it waits for more, with keepalives meanwhile. It
// returns when the run ended, the client left or a write failed.
func (a *API) streamLog(ctx context.Context, ew *eventWriter, run string, after uint64, follow bool, allowed func(context.Context) bool) {
	// A page per wake-up: with hundreds of clients following busy runs,
	// pages of 1,000 lines held hundreds of megabytes at once.
	const page = 200
	for {
		if !allowed(ctx) {
			return
		}
		changed := a.Store.Changed(run) // before reading: no change is missed
		lines := 0
		var bad error // a stored line that is not an event: the stream ends there
		lastSeq, done, found, err := a.Store.Page(run, after, page, func(l store.RawLine) {
			if bad == nil {
				if bad = ew.writeLine(l); bad == nil {
					after, lines = l.Seq, lines+1
				}
			}
		})
		if err != nil || ew.flush() != nil || bad != nil || !found {
			return
		}
		if after < lastSeq && lines > 0 {
			continue // a page ended (by lines or bytes) before the log did
		}
		if done && after >= lastSeq {
			cur, err := a.Store.Run(run)
			if err != nil || cur == nil {
				return
			}
			_ = ew.writeEnd(&End{Phase: cur.Phase, ExitCode: cur.ExitCode, Reason: cur.Reason, LastSeq: cur.LastSeq, Result: cur.Result})
			ew.flush()
			return
		}
		if !follow {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-a.Clock.After(a.Keepalive):
			if ew.keepalive() != nil {
				return
			}
		}
	}
}

// eventWriter writes log events as SSE or NDJSON, flushing when asked.
// Lines gather in buf, written at the flush: a page, not a line, a write.
type eventWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	sse     bool
	buf     *[]byte // from pages while lines gather: an idle follower holds none
}

var pages = sync.Pool{New: func() any { return new([]byte) }}

// newEventWriter sends the headers of an event stream.
func newEventWriter(w http.ResponseWriter, sse bool) *eventWriter {
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	return &eventWriter{w: w, flusher: flusher, sse: sse}
}

// writeEnd writes the log's end event.
func (ew *eventWriter) writeEnd(end *End) error {
	data, _ := json.Marshal(event{Type: "end", End: end})
	var err error
	if ew.sse {
		// The end carries the last sequence as its id, so an EventSource
		// that reconnects gets 204 and stops, even for an empty log.
		_, err = fmt.Fprintf(ew.w, "id: %d\nevent: end\ndata: %s\n\n", end.LastSeq, data)
	} else {
		_, err = fmt.Fprintf(ew.w, "%s\n", data)
	}
	return err
}

// writeLine writes a stored line as its event without decoding it: the
// event is the stored Line's JSON with "type":"line" first, byte for byte
// the JSON of event{Type: "line", Line: …} (TestRawLineEventIsTheEvent).
func (ew *eventWriter) writeLine(l store.RawLine) error {
	if len(l.JSON) < 2 || l.JSON[0] != '{' {
		return fmt.Errorf("stored line %d is not a JSON object", l.Seq)
	}
	if ew.buf == nil {
		ew.buf = pages.Get().(*[]byte)
	}
	b := *ew.buf
	if ew.sse {
		b = append(strconv.AppendUint(append(b, "id: "...), l.Seq, 10), "\nevent: line\ndata: "...)
	}
	b = append(append(b, `{"type":"line",`...), l.JSON[1:]...)
	if ew.sse {
		b = append(b, '\n')
	}
	*ew.buf = append(b, '\n')
	return nil
}

func (ew *eventWriter) keepalive() error {
	var err error
	if ew.sse {
		_, err = fmt.Fprint(ew.w, ": keepalive\n\n")
	} else {
		_, err = fmt.Fprint(ew.w, "{\"type\":\"keepalive\"}\n")
	}
	if err == nil {
		ew.flush()
	}
	return err
}

// flush writes the lines gathered and flushes.
func (ew *eventWriter) flush() error {
	var err error
	if ew.buf != nil {
		_, err = ew.w.Write(*ew.buf)
		*ew.buf = (*ew.buf)[:0]
		pages.Put(ew.buf)
		ew.buf = nil
	}
	if err == nil && ew.flusher != nil {
		ew.flusher.Flush()
	}
	return err
}

func (a *API) plainLog(w http.ResponseWriter, run string, after uint64) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_ = store.EachLine(a.Store, run, after, func(l store.Line) (bool, error) {
		_, err := fmt.Fprintln(w, l.Line)
		return err == nil, nil // the client left
	})
}

// cursorParam is where a log read starts: Last-Event-ID (an EventSource
// reconnecting) wins over ?after=.
func cursorParam(r *http.Request) (uint64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("after")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("after %q: want a sequence number", v)
	}
	return n, nil
}
