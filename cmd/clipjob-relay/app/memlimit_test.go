package app

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/kube"
	"github.com/paperclipai/clipjob/relay"
)

// cgroupFiles makes a cgroup root holding files (path relative to the
// root: content).
func cgroupFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		file := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// The relay's soft memory limit is MemoryLimitPercent of its cgroup's
// memory limit, v2 or v1; none when the cgroup has none, when the limit
// cannot be read, or when $GOMEMLIMIT chose.
func TestMemoryLimitFromTheCgroup(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	t.Setenv("GOMEMLIMIT", "") // restored when the test ends
	const gi = 1 << 30
	unreadable := cgroupFiles(t, nil)
	if err := os.Mkdir(filepath.Join(unreadable, "memory.max"), 0o755); err != nil { // reading a directory fails
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		env   string
		root  string
		want  int64 // the runtime's limit after; math.MaxInt64 is none
		found int64
	}{
		{name: "v2 limit", root: cgroupFiles(t, map[string]string{"memory.max": "1073741824\n"}), want: gi / 100 * MemoryLimitPercent, found: gi},
		{name: "v2 max", root: cgroupFiles(t, map[string]string{"memory.max": "max\n", "memory/memory.limit_in_bytes": "1073741824\n"}), want: math.MaxInt64},
		{name: "v1 limit", root: cgroupFiles(t, map[string]string{"memory/memory.limit_in_bytes": "536870912\n"}), want: gi / 2 / 100 * MemoryLimitPercent, found: gi / 2},
		{name: "v1 unlimited", root: cgroupFiles(t, map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}), want: math.MaxInt64},
		{name: "no cgroup files", root: cgroupFiles(t, nil), want: math.MaxInt64},
		{name: "unreadable", root: unreadable, want: math.MaxInt64},
		{name: "not a number", root: cgroupFiles(t, map[string]string{"memory.max": "lots\n"}), want: math.MaxInt64},
		{name: "GOMEMLIMIT set", env: "96MiB", root: cgroupFiles(t, map[string]string{"memory.max": "1073741824\n"}), want: 96 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Setenv("GOMEMLIMIT", tc.env)
			debug.SetMemoryLimit(math.MaxInt64)
			if tc.env != "" {
				debug.SetMemoryLimit(96 << 20) // as the runtime would have at start
			}
			m := setMemoryLimit(tc.root)
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Errorf("soft memory limit %d; want %d (%+v)", got, tc.want, m)
			}
			if m.cgroup != tc.found || (m.set != 0) != (tc.found != 0) {
				t.Errorf("chose %+v; want the cgroup's limit %d", m, tc.found)
			}
		})
	}
}

// Main sets the limit before the relay starts and logs it.
func TestMainSetsMemoryLimit(t *testing.T) {
	kubeconfig := kube.Kubeconfig(t)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	t.Setenv("GOMEMLIMIT", "")
	defer func(root string) { cgroupRoot = root }(cgroupRoot)
	cgroupRoot = cgroupFiles(t, map[string]string{"memory.max": "1073741824\n"})
	var got int64
	run := func(context.Context, relay.Options) error { got = debug.SetMemoryLimit(-1); return nil }
	var stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--kubeconfig", kubeconfig}, &stderr, run); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	const want = (1 << 30) / 100 * MemoryLimitPercent
	if got != want {
		t.Errorf("soft memory limit %d; want %d", got, want)
	}
	if !strings.Contains(stderr.String(), "soft memory limit set from the cgroup's") || !strings.Contains(stderr.String(), fmt.Sprintf(`"limitBytes":%d`, want)) {
		t.Errorf("the start's log does not say the limit:\n%s", stderr.String())
	}
}
