package app

import (
	"os"
	"runtime/debug"
	"strconv"
)

// MemoryLimitPercent is the share of its container's memory limit the
// relay gives the Go runtime as its soft memory limit, unless
// $GOMEMLIMIT is set. Near the limit the runtime collects more often and
// returns idle memory to the system sooner, instead of letting the heap
// grow to its GOGC goal past the container's limit and be killed. The rest
// is left for what the runtime does not count: the store's mapped pages
// and the page cache charged to the container.
const MemoryLimitPercent = 90

// MemoryLimitEnv holds the container's memory limit in bytes: the chart
// sets it from the downward API (resourceFieldRef limits.memory), so
// Kubernetes, not the relay, reads the limit. Where the container has
// none, Kubernetes gives the node's allocatable memory.
const MemoryLimitEnv = "CLIPJOB_RELAY_MEMORY_LIMIT"

// setMemoryLimit sets the Go runtime's soft memory limit to
// MemoryLimitPercent of $CLIPJOB_RELAY_MEMORY_LIMIT, unless $GOMEMLIMIT
// is set (the runtime has applied it, "off" included), and returns what
// to log once the relay has a logger. A value it cannot parse leaves the
// runtime without a limit; the relay starts all the same.
func setMemoryLimit() (msg string, keysAndValues []any) {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		return "soft memory limit", []any{"limitBytes", debug.SetMemoryLimit(-1), "from", "$GOMEMLIMIT=" + env}
	}
	env := os.Getenv(MemoryLimitEnv)
	limit, err := strconv.ParseInt(env, 10, 64)
	if err != nil || limit <= 0 {
		return "no soft memory limit", []any{"reason", "$" + MemoryLimitEnv + " holds no memory limit: " + strconv.Quote(env)}
	}
	soft := limit / 100 * MemoryLimitPercent
	debug.SetMemoryLimit(soft)
	return "soft memory limit set from the container's", []any{"limitBytes", soft, "containerLimitBytes", limit, "percent", MemoryLimitPercent}
}
