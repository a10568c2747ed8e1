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
	stored store.Cursor // what the store had when the session started
	seenAt int          // lines seen in this session with timestamp stored.TS
	cur    store.Cursor // the cursor after every accepted line
}

func newResume(c store.Cursor) *resume { return &resume{stored: c, cur: c} }

// accept reports whether a line with timestamp ts is new, and advances the
// cursor if it is. The cursor never moves back: a runtime stamps a line
// before it takes the write lock, so stdout and stderr lines can reach the
// file slightly out of order, and a cursor lowered to the older one would
// make a resume store the newer one again.
func (r *resume) accept(ts time.Time) bool {
	n := ts.UnixNano()
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
