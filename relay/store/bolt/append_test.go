package bolt

import (
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// Append is AppendAfter from whatever cursor the stream has: for a test
// that alone writes the stream.
func (s *Store) Append(run, stream string, cur store.Cursor, lines []store.Line, now time.Time) (uint64, error) {
	prev, err := s.Cursor(run, stream)
	if err != nil {
		return 0, err
	}
	return s.AppendAfter(run, stream, prev, cur, lines, now)
}
