package collect

import (
	"bytes"
	"errors"
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
}

// replayGap: a line this much older than the newest the stream has given
// means the kubelet is serving a file again from its start. It does so
// when it renames a rotated log back because the runtime could not reopen
// it (a container that exits as its log is rotated, a runtime too busy to
// answer): its follow sees the name come back and reads the file anew. A
// runtime's stdout and stderr lines reach the file out of order by far
// less than this. A file served again whose lines all lie within the gap
// (a flood's rotated file spans milliseconds), or that starts at the
// cursor, is not told apart: its lines are stored twice
// (docs/security.md). Telling those apart needs the lines' content, not
// only their timestamps; a rule on timestamps alone that tried dropped
// lines never stored (a runtime's out-of-order lines).
const replayGap = int64(time.Second)

func newResume(c store.Cursor) *resume { return &resume{stored: c, cur: c} }

// accept reports whether a line with timestamp ts is new, and advances the
// cursor if it is. The cursor never moves back: a runtime stamps a line
// before it takes the write lock, so stdout and stderr lines can reach the
// file slightly out of order, and a cursor lowered to the older one would
// make a resume store the newer one again.
func (r *resume) accept(ts time.Time) bool {
	n := ts.UnixNano()
	if r.newest-n > replayGap {
		// Served again: skip what this session has accepted too, as a
		// reconnect from its cursor would. (Counting lines at the
		// cursor's timestamp from the session's start took a line served
		// twice for two lines, and stored it twice.)
		r.stored, r.seenAt, r.newest = r.cur, 0, n
	}
	r.newest = max(r.newest, n)
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
