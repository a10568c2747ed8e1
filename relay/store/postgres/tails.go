package postgres

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// A follower that has caught up reads a page for every commit of its
// run, one query per line in a fleet's steady phase, where lines come a
// few a second per run. So each store keeps the last lines committed to
// the runs its readers follow (a tail: started when a reader waits on the
// run, kept while one reads it), from its own commits and from the
// notifications of the others', which carry a small commit's lines.
// Anything else said of a run (its record changed, a commit too large to
// carry, lines out of order, notifications missed while listening again)
// drops its tail.
//
// A tail knows lines, not the run's end: Page serves from it only lines
// after the reader's cursor (a reader with nothing new queries, so a
// keepalive or a wake for nothing reads the end, or lines whose
// notification was lost with the relay that committed them), and only
// once a query made after the tail began found the run not done (the
// end, said while the tail began, could otherwise be hidden by lines
// committed after it: a stale owner's, a stream still draining).

const (
	// tailLines and tailBytes bound one run's tail (its oldest lines go).
	tailLines = 64
	tailBytes = 32 << 10
	// carryBytes bounds the lines' JSON one notification carries for a
	// run; a commit with more says the run's id alone.
	carryBytes = 4 << 10
	// tailIdle: a tail nobody read for this long, and nobody waits on,
	// is dropped at the run's next commit. A reader woken by one commit
	// is not waiting while it reads: the next commit must not drop its
	// tail then.
	tailIdle = 10 * time.Second
)

// tail is a run's last committed lines, of seqs first, first+1, ...
type tail struct {
	first  uint64
	lines  [][]byte // each line's JSON, never changed once here
	bytes  int
	readAt time.Time // its creation, or the last page it served
	// confirmed: a query made after the tail began found the run not
	// done; any later change of the record drops the tail.
	confirmed bool
}

func (t *tail) last() uint64 { return t.first + uint64(len(t.lines)) - 1 }

type tails struct {
	mu   sync.Mutex
	runs map[string]*tail
}

// add records the lines committed to run, of seqs from first, if a
// reader here waits on the run or read its tail lately (else it drops the
// tail: a reader that comes queries, and its wait starts the next tail).
func (ts *tails) add(run string, first uint64, lines [][]byte, waiting bool, now time.Time) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.runs[run]
	followed := waiting || t != nil && now.Sub(t.readAt) < tailIdle
	switch {
	case len(lines) == 0 && followed:
		return // a stream's cursor alone: the run's lines are as they were
	case !followed || first == 0 || t != nil && first <= t.last():
		// Lines again, or before the last: two relays writing the run at
		// once (a takeover) may commit in one order and notify in another.
		delete(ts.runs, run)
		return
	case t == nil || first > t.last()+1:
		if ts.runs == nil {
			ts.runs = map[string]*tail{}
		}
		t = &tail{first: first, readAt: now}
		ts.runs[run] = t
	}
	for _, l := range lines {
		t.lines = append(t.lines, l)
		t.bytes += len(l)
	}
	for len(t.lines) > 1 && (len(t.lines) > tailLines || t.bytes > tailBytes) {
		t.bytes -= len(t.lines[0])
		t.lines[0] = nil
		t.lines, t.first = t.lines[1:], t.first+1
	}
}

func (ts *tails) drop(run string) {
	ts.mu.Lock()
	delete(ts.runs, run)
	ts.mu.Unlock()
}

func (ts *tails) dropAll() {
	ts.mu.Lock()
	clear(ts.runs)
	ts.mu.Unlock()
}

// page returns the lines after the cursor after that run's confirmed
// tail holds, up to limit lines and store.PageBytes (at least one), and
// the last seq it holds; false if it holds no line after the cursor, or
// not the line right after it.
func (ts *tails) page(run string, after uint64, limit int, now time.Time) ([]store.RawLine, uint64, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.runs[run]
	if t == nil || !t.confirmed || after+1 < t.first || after >= t.last() {
		return nil, 0, false
	}
	t.readAt = now
	var out []store.RawLine
	bytes := 0
	for seq := after + 1; seq <= t.last() && len(out) < limit; seq++ {
		l := t.lines[seq-t.first]
		if bytes += len(l); len(out) > 0 && bytes > store.PageBytes {
			break
		}
		out = append(out, store.RawLine{Seq: seq, JSON: l})
	}
	return out, t.last(), true
}

// held returns run's tail, for confirm.
func (ts *tails) held(run string) *tail {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.runs[run]
}

// confirm marks t, held before a query that found run not done, as
// confirmed, if it is still run's tail (not dropped since by a change).
func (ts *tails) confirm(run string, t *tail) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t != nil && ts.runs[run] == t {
		t.confirmed = true
	}
}

// carried is what the next notification says of a run: its lines, of
// seqs from first, or (idOnly) only that it changed.
type carried struct {
	first  uint64
	lines  [][]byte
	bytes  int
	idOnly bool
}

// addLines adds a commit's lines; lines that do not follow the ones
// carried, or too many, leave the run's id alone.
func (c *carried) addLines(first uint64, lines [][]byte) {
	size := 0
	for _, l := range lines {
		size += len(l)
	}
	switch {
	case c.idOnly:
	case c.lines == nil && first > 0 && size <= carryBytes:
		c.first, c.lines, c.bytes = first, append([][]byte(nil), lines...), size
	case c.lines != nil && first == c.first+uint64(len(c.lines)) && c.bytes+size <= carryBytes:
		c.lines, c.bytes = append(c.lines, lines...), c.bytes+size
	default:
		*c = carried{idOnly: true}
	}
}

// In a payload, a run's id is followed by the lines it carries, each on
// its own line: lineMark, the seq, a space, the line's JSON (which holds
// no newline and no control character: JSON escapes them). No run id
// starts with lineMark; a relay that does not know this format takes
// such a line for a run no reader waits on.
const lineMark = '\x01'

// appendRun writes run's entry, and its lines, to a payload.
func appendRun(b []byte, run string, c *carried) []byte {
	b = append(append(b, '\n'), run...)
	for i, l := range c.lines {
		b = append(strconv.AppendUint(append(b, '\n', lineMark), c.first+uint64(i), 10), ' ')
		b = append(b, l...)
	}
	return b
}

// parsePayload reads a payload's entries (after its sender's line): the
// runs it names and what it carries for each (idOnly: no lines, or lines
// out of order).
func parsePayload(entries []string) (runs []string, said map[string]*carried) {
	said = map[string]*carried{}
	var cur *carried
	for _, e := range entries {
		if e == "" || e[0] != lineMark {
			runs = append(runs, e)
			cur = &carried{}
			said[e] = cur
			continue
		}
		if cur == nil || cur.idOnly {
			continue
		}
		seqText, data, ok := strings.Cut(e[1:], " ")
		seq, err := strconv.ParseUint(seqText, 10, 64)
		switch {
		case !ok || err != nil || seq == 0 || len(cur.lines) > 0 && seq != cur.first+uint64(len(cur.lines)):
			*cur = carried{idOnly: true}
		case len(cur.lines) == 0:
			cur.first, cur.lines = seq, [][]byte{[]byte(data)}
		default:
			cur.lines = append(cur.lines, []byte(data))
		}
	}
	for _, c := range said {
		c.idOnly = c.idOnly || len(c.lines) == 0
	}
	return runs, said
}
