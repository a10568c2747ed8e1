// Package storetest opens throwaway stores for tests.
package storetest

import (
	"bytes"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
)

// Open opens a store in a temporary directory, closed when t ends, and
// returns it with its directory.
func Open(t testing.TB) (*bolt.Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := bolt.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

// Lines makes one line per text for container, a millisecond apart.
func Lines(container string, texts ...string) []store.Line {
	t0 := time.Date(2026, 11, 21, 10, 0, 5, 0, time.UTC)
	var out []store.Line
	for i, x := range texts {
		out = append(out, store.Line{TS: t0.Add(time.Duration(i) * time.Millisecond), Container: container, Line: x})
	}
	return out
}

// Append is AppendAfter from whatever cursor the stream has: for a test
// that alone writes the stream.
func Append(s store.Backend, run, stream string, cur store.Cursor, lines []store.Line, now time.Time) (uint64, error) {
	prev, err := s.Cursor(run, stream)
	if err != nil {
		return 0, err
	}
	return s.AppendAfter(run, stream, prev, cur, lines, now)
}

// RawLines is s's Page of lines as stored, each line's JSON copied.
func RawLines(s store.Backend, run string, after uint64, limit int) ([]store.RawLine, error) {
	var out []store.RawLine
	_, _, _, err := s.Page(run, after, limit, func(l store.RawLine) {
		out = append(out, store.RawLine{Seq: l.Seq, JSON: bytes.Clone(l.JSON)})
	})
	return out, err
}
