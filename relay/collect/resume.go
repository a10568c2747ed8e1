package collect

import (
	"bytes"
	"errors"
	"slices"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// A timestamped log line as the API server returns it with
// timestamps=true: an RFC 3339 timestamp with nanoseconds, a space, the
// line.
var errNoTimestamp = errors.New("log line without a timestamp")

// splitTimestamp splits a timestamped line.
func splitTimestamp(line []byte) (time.Time, []byte, error) {
	i := bytes.IndexByte(line, ' ')
	if i <= 0 {
		return time.Time{}, nil, errNoTimestamp
	}
	ts, err := time.Parse(time.RFC3339Nano, string(line[:i]))
	if err != nil {
		return time.Time{}, nil, errNoTimestamp
	}
	return ts, line[i+1:], nil
}

// resume decides, line by line, which lines of a stream started at
// SinceTime are new. One resume serves one stream session.
type resume struct {
	stored store.Cursor // what the session skips: the store's cursor when it started
	seenAt int          // lines seen in this session with timestamp stored.TS
	cur    store.Cursor // the cursor after every accepted line
	newest int64        // the newest timestamp the session has read
	recent []int64      // the timestamps of the last recentLines lines read, a ring
	next   int          // where the ring writes next
}

// recentLines is how many of a session's last timestamps it keeps to tell
// a file the kubelet serves again from a runtime's out-of-order lines. The
// kubelet serves a file again from its start within the same stream when
// it renames a rotated log back because the runtime could not reopen it
// (a container that is exiting, a runtime too busy to answer): its follow
// sees the name come back and reads the file anew. The stream then goes
// back to a line it gave already, or further back than its last
// recentLines lines; a runtime's stdout and stderr lines reach the file
// out of order by far less, and never repeat a timestamp. 8 KiB a stream.
const recentLines = 1024

// servedAgain says whether a line stamped n, read after one stamped
// newer, starts a file the stream gives again.
func (r *resume) servedAgain(n int64) bool {
	if n >= r.newest || len(r.recent) == 0 {
		return false
	}
	oldest := r.recent[0]
	if len(r.recent) == recentLines {
		oldest = r.recent[r.next]
	}
	return n < oldest || slices.Contains(r.recent, n)
}

func (r *resume) remember(n int64) {
	if len(r.recent) < recentLines {
		r.recent = append(r.recent, n)
		return
	}
	r.recent[r.next] = n
	r.next = (r.next + 1) % recentLines
}

func newResume(c store.Cursor) *resume { return &resume{stored: c, cur: c} }

// accept reports whether a line with timestamp ts is new, and advances the
// cursor if it is. The cursor never moves back: a runtime stamps a line
// before it takes the write lock, so stdout and stderr lines can reach the
// file slightly out of order, and a cursor lowered to the older one would
// make a resume store the newer one again.
func (r *resume) accept(ts time.Time) bool {
	n := ts.UnixNano()
	if r.servedAgain(n) {
		// Skip what this session accepted too, as a reconnect from its
		// cursor would. (Counting lines at the cursor's timestamp from
		// the session's start took a line served twice for two lines.)
		r.stored, r.seenAt, r.newest = r.cur, 0, n
	}
	r.newest = max(r.newest, n)
	r.remember(n)
	switch {
	case n < r.stored.TS:
		return false
	case n == r.stored.TS:
		r.seenAt++
		if r.seenAt <= r.stored.Count {
			return false
		}
	}
	switch {
	case n == r.cur.TS:
		r.cur.Count++
	case n > r.cur.TS:
		r.cur = store.Cursor{TS: n, Count: 1}
	}
	return true
}
