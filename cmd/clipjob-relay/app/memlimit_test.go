package app

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/kube"
	"github.com/paperclipai/clipjob/relay"
)

// The relay's soft memory limit is MemoryLimitPercent of the container's
// memory limit the chart passes it; none when it has none it can parse,
// or when $GOMEMLIMIT chose.
func TestMemoryLimitFromTheContainer(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	t.Setenv("GOMEMLIMIT", "") // restored when the test ends
	t.Setenv(MemoryLimitEnv, "")
	const gi = 1 << 30
	for _, tc := range []struct {
		name, env, limit string
		want             int64 // the runtime's limit after; math.MaxInt64 is none
	}{
		{name: "limit", limit: "1073741824", want: gi / 100 * MemoryLimitPercent},
		{name: "none", limit: "", want: math.MaxInt64},
		{name: "not a number", limit: "1Gi", want: math.MaxInt64},
		{name: "zero", limit: "0", want: math.MaxInt64},
		{name: "GOMEMLIMIT set", env: "96MiB", limit: "1073741824", want: 96 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Setenv("GOMEMLIMIT", tc.env)
			os.Setenv(MemoryLimitEnv, tc.limit)
			debug.SetMemoryLimit(math.MaxInt64)
			if tc.env != "" {
				debug.SetMemoryLimit(96 << 20) // as the runtime would have at start
			}
			msg, kv := setMemoryLimit()
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Errorf("soft memory limit %d; want %d (%s %v)", got, tc.want, msg, kv)
			}
		})
	}
}

// Main sets the limit before the relay starts and logs it.
func TestMainSetsMemoryLimit(t *testing.T) {
	kubeconfig := kube.Kubeconfig(t)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv(MemoryLimitEnv, "1073741824")
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
	if !strings.Contains(stderr.String(), "soft memory limit set from the container's") || !strings.Contains(stderr.String(), fmt.Sprintf(`"limitBytes":%d`, want)) {
		t.Errorf("the start's log does not say the limit:\n%s", stderr.String())
	}
}
