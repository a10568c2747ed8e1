package bolt

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
)

// What a reader touched of the store's mapping stays in the relay's
// resident memory until the store releases it: after a client read 30 MB
// of lines, that much was resident; released, next to none, and the
// lines read the same.
func TestStoreReleasesTheMappedPagesItRead(t *testing.T) {
	s, dir := openTestStore(t)
	text := strings.Repeat("x", 300)
	for batch := range 100 {
		ls := make([]store.Line, 1000)
		for i := range ls {
			ls[i] = store.Line{TS: at(batch*1000 + i), Container: "agent", Line: text}
		}
		if _, err := s.Append("run-1", "st", store.Cursor{TS: int64(batch + 1), Count: 1}, ls, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	file := dir + "/relay.db"
	s.stopReleasing() // this test releases them itself
	s.releasing.Wait()
	readAll := func() {
		t.Helper()
		var after, last uint64
		for {
			if _, _, _, err := s.Page("run-1", after, 0, func(l store.RawLine) { last = l.Seq }); err != nil {
				t.Fatal(err)
			}
			if last == after {
				break
			}
			after = last
		}
		if after != 100000 {
			t.Fatalf("read %d lines, want 100000", after)
		}
	}
	readAll()
	touched := mappedKiB(t, file)
	if touched < 20<<10 {
		t.Fatalf("%d KiB of the store resident after reading it all: the test reads too little", touched)
	}
	if err := s.releaseMapped(); err != nil {
		t.Fatal(err)
	}
	left := mappedKiB(t, file)
	t.Logf("resident of the store: %d KiB after reading it, %d KiB after the release", touched, left)
	if left > touched/20 {
		t.Errorf("%d KiB of the store resident after the release, %d before; want next to none", left, touched)
	}
	readAll()
}

// mappedKiB is the resident part of this process's mappings of file
// (/proc/self/smaps).
func mappedKiB(t *testing.T, file string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip("no /proc/self/smaps:", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	total, in := 0, false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			in = fields[len(fields)-1] == file
		case in && len(fields) == 3 && fields[0] == "Rss:":
			kib, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatal(fmt.Errorf("smaps: %w", err))
			}
			total += kib
		}
	}
	return total
}
