package store

import "time"

// Cursor is how far one container instance's log is stored: the timestamp
// of the last stored line and how many stored lines carry exactly that
// timestamp. Timestamps are not unique (a burst shares one), so the count
// is what makes a resume exact.
type Cursor struct {
	// TS is the last stored line's timestamp in Unix nanoseconds.
	TS int64 `json:"ts"`
	// Count is how many stored lines have timestamp TS.
	Count int `json:"count"`
}

// SinceTime is where a resumed stream must start: the API takes whole
// seconds, so the second of the last stored line, rounded down.
func (c Cursor) SinceTime() time.Time {
	if c.TS == 0 {
		return time.Time{}
	}
	return time.Unix(0, c.TS).Truncate(time.Second)
}
