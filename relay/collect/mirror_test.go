package collect

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

func mirrorFixture(t *testing.T) (*store.Store, *Mirror) {
	s, _ := storetest.Open(t)
	_, _ = s.UpdateRun("run-1", func(r *store.Run) {
		r.Namespace, r.Agent, r.Company, r.MainContainer = "ns", "agent-a", "acme", "agent"
	})
	return s, &Mirror{Dir: t.TempDir(), Store: s}
}

func readMirror(t *testing.T, m *Mirror) string {
	t.Helper()
	r, _ := m.Store.Run("run-1")
	b, err := os.ReadFile(m.Path(r))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMirrorWritesTheAgentsLinesInTheAdapterLayout(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = s.Append("run-1", "init", store.Cursor{TS: 1, Count: 1}, storetest.Lines("setup", "cloning"), time.Now())
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", `{"type":"system"}`, `{"type":"result"}`), time.Now())
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Run("run-1")
	if want := "run-logs/acme/agent-a/run-1.pod.ndjson"; !strings.HasSuffix(m.Path(r), want) {
		t.Errorf("path %s, want …/%s", m.Path(r), want)
	}
	if got := readMirror(t, m); got != "{\"type\":\"system\"}\n{\"type\":\"result\"}\n" {
		t.Errorf("mirror %q: want only the agent container's lines", got)
	}
	// Later lines are appended, nothing twice.
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 3, Count: 1}, storetest.Lines("agent", `{"type":"late"}`), time.Now())
	_ = m.Sync("run-1")
	_ = m.Sync("run-1")
	if got := readMirror(t, m); strings.Count(got, "\n") != 3 || !strings.HasSuffix(got, "{\"type\":\"late\"}\n") {
		t.Errorf("mirror after append: %q", got)
	}
}

// TestMirrorRecoversFromACrashMidWrite: bytes written after the last
// recorded state (a crash between the write and the record) are cut and
// written again once, so the file holds every line exactly once.
func TestMirrorRecoversFromACrashMidWrite(t *testing.T) {
	s, m := mirrorFixture(t)
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 1, Count: 1}, storetest.Lines("agent", "one", "two"), time.Now())
	_ = m.Sync("run-1")
	_, _ = s.Append("run-1", "agent", store.Cursor{TS: 2, Count: 1}, storetest.Lines("agent", "three"), time.Now())
	r, _ := s.Run("run-1")
	f, _ := os.OpenFile(m.Path(r), os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString("three\nfo") // written, then the relay died before recording it
	f.Close()
	if err := m.Sync("run-1"); err != nil {
		t.Fatal(err)
	}
	if got := readMirror(t, m); got != "one\ntwo\nthree\n" {
		t.Errorf("mirror after crash recovery %q", got)
	}
}
