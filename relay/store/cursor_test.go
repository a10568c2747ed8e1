package store

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestSinceTimeRoundsDown(t *testing.T) {
	c := Cursor{TS: at(999).UnixNano()}
	if got := c.SinceTime(); !got.Equal(t0) {
		t.Errorf("SinceTime %v, want %v", got, t0)
	}
	if !(Cursor{}).SinceTime().IsZero() {
		t.Error("an empty cursor starts from the beginning")
	}
}
