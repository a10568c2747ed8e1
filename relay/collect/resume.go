package collect

import (
	"errors"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// A timestamped log line as the API server returns it with
// timestamps=true: an RFC 3339 timestamp with nanoseconds, a space, the
// line.
var errNoTimestamp = errors.New("log line without a timestamp")

// splitTimestamp splits a timestamped line.
func splitTimestamp(line string) (time.Time, string, error) {
	i := strings.IndexByte(line, ' ')
	if i <= 0 {
		return time.Time{}, "", errNoTimestamp
	}
	ts, err := time.Parse(time.RFC3339Nano, line[:i])
	if err != nil {
		return time.Time{}, "", errNoTimestamp
	}
	return ts, line[i+1:], nil
}

// resume decides, line by line, which lines of a stream session are new.
// One resume serves one stream session.
//
// A resumed stream starts at the second of the cursor (SinceTime), so it
// skips what the cursor says is stored: lines stamped before it, and the
// first Count stamped at it. Within the session the kubelet may serve a
// file again from its start: it renames a rotated log back when the
// runtime could not reopen it (a container exiting, a runtime too busy to
// answer), and its follow reads the name anew. Timestamps alone cannot
// tell such a file from a runtime's out-of-order lines (stdout and stderr
// race for the file, by milliseconds; a flood's file spans milliseconds),
// so the session remembers the lines it knows stored, by timestamp and a
// hash of their text, and skips a line it remembers, with the lines that
// follow it in the same order, whatever their timestamps. A line it does
// not remember is stored, unless it is more than replayGap older than the
// newest: a file served again from further back than the session
// remembers, whose lines up to the cursor are skipped as a reconnect
// would skip them.
//
// One file served again is not told by the lines: one whose lines are all
// stamped as the last lines read (at the end of a flood, the newest file
// holding the result alone). Its first line comes again right after
// itself, with its timestamp and text, as a line written twice in one
// write does (CRI-O stamps a read of the output with one time). The
// session then ends, and the next reads the log again from the cursor: a
// stream opened anew serves the file once, so the count at the cursor
// tells the two apart. An agent can write lines twice at will, so mayEnd
// bounds those reads (follower.mayReadAgain): past it the line is stored.
type resume struct {
	stored store.Cursor // the store's cursor when the session started
	seenAt int          // lines read at stored.TS, outside a file served again
	cur    store.Cursor // the cursor after every accepted line
	newest int64        // the newest timestamp read
	// recent are the lines the session knows stored (accepted, or skipped
	// at stored.TS) in the order read: those stamped within replayGap of
	// newest, at most recentLines of them.
	recent []lineKey
	// replaying: the kubelet serves a file again. next is the index in
	// recent of the line it serves next, or -1 while it serves lines older
	// than recent holds.
	replaying bool
	next      int
	// mayEnd, asked at a line the session cannot tell, says whether to end
	// there (lineUnsure) rather than store it, as one written twice (nil:
	// end).
	mayEnd func() bool
	// held: the last line accepted, heldKey, is stamped before the newest
	// read and remembered by none, and its batch has not committed it.
	// Such a line is written out of order, or it is the first line of a
	// file served again that the session read joined to another (see
	// accept), and only the next line tells: a line the session remembers,
	// stamped as late or later, means the file was served again from the
	// line before it. heldCur and heldSeenAt are cur and seenAt before it.
	// The batch clears held once it commits the line (keepHeld).
	held       bool
	heldKey    lineKey
	heldCur    store.Cursor
	heldSeenAt int
}

// lineKey is a line as the session remembers it.
type lineKey struct {
	ts  int64
	sum uint64 // the text's hash
}

// replayGap: a line this much older than the newest read starts a file
// served again (lines older than the session remembers); a runtime's
// stdout and stderr lines reach the file out of order by far less.
const replayGap = int64(time.Second)

// recentLines bounds what a session remembers: 1 MiB of keys, 2 MiB with
// the room recent grows into. Only a flood holds that many lines within
// replayGap (a quiet stream remembers a few): the kubelet rotates a
// flood's file at 40,000 lines and more, within a second. A file served
// again that holds more lines than this within replayGap of its last
// stores the lines before those twice (docs/security.md).
const recentLines = 1 << 16

var lineSeed = maphash.MakeSeed()

func newResume(c store.Cursor) *resume { return &resume{stored: c, cur: c} }

// verdict is what a session makes of a line.
type verdict int

const (
	lineStored verdict = iota // stored already: skip it
	lineNew                   // store it
	// lineUnsure: the session cannot tell whether the line is stored; it
	// ends, and the next reads the log again from the cursor.
	lineUnsure
	// lineHeldServedAgain: stored already, and so is the line before it,
	// still held (resume.held): drop that line from the batch.
	lineHeldServedAgain
)

// accept judges a line stamped ts with text, and advances the cursor past
// a new one. The cursor never moves back: a runtime stamps a line
// before it takes the write lock, so stdout and stderr lines can reach the
// file slightly out of order, and a cursor lowered to the older one would
// make a resume store the newer one again.
//
// A file's first line can come joined to the head of another's last line:
// the runtime switches files between two reads of the output, not two
// lines, so a rotated file can end with a partial record, and the kubelet
// joins it to the next line it reads, stamped as the head. A follow left
// behind on a rotated file (a flood) reads such a head, then the newest
// file, and the session remembers the joined line. When the kubelet serves
// that file again, its first line comes alone, its own stamp and text,
// remembered by no line: stamped before the newest read, as a line written
// out of order. So a line stamped before the newest and remembered by none
// is held (resume.held) until the next: when that one is remembered and
// stamped no earlier, the file was served again from the held line, which
// the batch drops (lineHeldServedAgain). A line written out of order comes
// at the end of the file, after the lines the file would serve again, so
// the file's first line, served again after it, is stamped earlier.
func (r *resume) accept(ts time.Time, text string) verdict {
	k := lineKey{ts: ts.UnixNano(), sum: maphash.String(lineSeed, text)}
	held := r.held
	r.held = false
	cur, seenAt := r.cur, r.seenAt
	newest := r.newest
	r.newest = max(r.newest, k.ts)
	switch {
	case r.replaying && r.servedAgain(k):
		return lineStored
	case k.ts < r.stored.TS:
		return lineStored
	case newest-k.ts > replayGap:
		r.replaying, r.next = true, -1
		return lineStored
	}
	if k.ts <= newest { // a line newer than every line read is read once
		i, alike := r.remembered(k)
		if i >= 0 {
			if held && r.heldKey.ts <= k.ts && i < len(r.recent)-1 && r.recent[len(r.recent)-1] == r.heldKey {
				// The held line is the first line of this file served
				// again: forget it, as if it had not been read.
				r.recent = r.recent[:len(r.recent)-1]
				r.cur, r.seenAt = r.heldCur, r.heldSeenAt
				r.readAgain(i)
				return lineHeldServedAgain
			}
			r.readAgain(i)
			return lineStored
		}
		// The first of the last lines read, all stamped as k and stored
		// by this session at the cursor: a file served again, or a line
		// written twice in one write. A stream opened at the cursor reads
		// that timestamp once, counting what is stored at it.
		if alike < len(r.recent) && r.recent[alike] == k && k.ts == r.cur.TS && k.ts > r.stored.TS && (r.mayEnd == nil || r.mayEnd()) {
			return lineUnsure
		}
	}
	if k.ts == r.stored.TS {
		r.seenAt++
		if r.seenAt <= r.stored.Count {
			r.remember(k)
			return lineStored
		}
	}
	switch {
	case k.ts == r.cur.TS:
		r.cur.Count++
	case k.ts > r.cur.TS:
		r.cur = store.Cursor{TS: k.ts, Count: 1}
	}
	r.remember(k)
	if k.ts < newest {
		r.held, r.heldKey, r.heldCur, r.heldSeenAt = true, k, cur, seenAt
	}
	return lineNew
}

// keepHeld: the held line is committed (or the session ends with it), so
// it is stored whatever comes next.
func (r *resume) keepHeld() { r.held = false }

// servedAgain says whether k is a line of the file served again the
// session has read, and follows the file; false ends the file: k is new.
func (r *resume) servedAgain(k lineKey) bool {
	if r.next < 0 {
		// Older than what the session remembers: stored, unless newer
		// than every line stored. A line stamped before the oldest
		// remembered is not looked for (a flood's file served again from
		// further back would search the whole memory for each line).
		if len(r.recent) == 0 || k.ts < r.recent[0].ts {
			r.replaying = k.ts <= r.cur.TS
			return r.replaying
		}
		if i := slices.Index(r.recent, k); i >= 0 {
			r.readAgain(i)
			return true
		}
		r.replaying = k.ts <= r.cur.TS
		return r.replaying
	}
	switch {
	case r.next < len(r.recent) && r.recent[r.next] == k:
		r.readAgain(r.next)
		return true
	case k.ts < r.stored.TS:
		return true // stored before the session, and never remembered
	}
	r.replaying = false
	return false
}

// readAgain: the file served again gave recent[i]; it ends once it
// reached the line the session read last.
func (r *resume) readAgain(i int) {
	r.next = i + 1
	r.replaying = r.next < len(r.recent)
}

// remembered is the index of the first line of recent that k repeats, or
// -1, and where the lines stamped as k at the end of recent start. Those
// are left out: one write stamped alike (CRI-O stamps a read of the
// container's output with one time) can hold the same text twice, and a
// line served again is known by the lines after it that the stream went
// back from.
func (r *resume) remembered(k lineKey) (int, int) {
	end := len(r.recent)
	for end > 0 && r.recent[end-1].ts == k.ts {
		end--
	}
	return slices.Index(r.recent[:end], k), end
}

// remember adds k to recent, forgetting what is too old or too many. A
// quiet stream remembers a few lines; recent never holds more than
// recentLines. Forgetting slides recent along its array, so once full it
// is copied to the front of a new one with as much room again: a line
// costs a copy of a key, not of the memory.
func (r *resume) remember(k lineKey) {
	if len(r.recent) == cap(r.recent) {
		r.recent = append(make([]lineKey, 0, min(max(2*len(r.recent), 8), 2*recentLines)), r.recent...)
	}
	r.recent = append(r.recent, k)
	drop := max(len(r.recent)-recentLines, 0)
	for drop < len(r.recent) && r.newest-r.recent[drop].ts > replayGap {
		drop++
	}
	r.recent = r.recent[drop:]
}
