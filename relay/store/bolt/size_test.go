package bolt

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// The store holds lines at close to their size: appends fill pages
// whole (sequence keys only grow). With bbolt's default half-full pages
// the file was over twice the stored JSON.
func TestStoreSizeStaysNearItsLines(t *testing.T) {
	s, dir := openTestStore(t)
	text := strings.Repeat("x", 300)
	var stored int64
	for run := range 4 {
		for batch := range 50 {
			ls := make([]store.Line, 100)
			for i := range ls {
				ls[i] = store.Line{TS: at(batch*100 + i), Container: "agent", Line: text}
			}
			if _, err := s.Append(fmt.Sprintf("run-%d", run), "st", store.Cursor{TS: int64(batch + 1), Count: 1}, ls, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, _, _, _ = s.Page("run-0", 0, 0, func(r store.RawLine) {
		stored += int64(len(r.JSON)) + 8 // the value and its key
	})
	stored *= 4
	s.Close()
	st, err := os.Stat(filepath.Join(dir, "relay.db"))
	if err != nil {
		t.Fatal(err)
	}
	if ratio := float64(st.Size()) / float64(stored); ratio > 1.5 {
		t.Errorf("the store file is %.1fx the %d bytes of lines it holds", ratio, stored)
	}
}
