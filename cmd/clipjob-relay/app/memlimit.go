package app

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// MemoryLimitPercent is the share of its container's memory limit the
// relay gives the Go runtime as its soft memory limit, unless
// $GOMEMLIMIT is set. Near the limit the runtime collects more often and
// returns idle memory to the system sooner, instead of letting the heap
// grow to its GOGC goal past the container's limit and be killed. The rest
// is left for what the runtime does not count: the store's mapped pages
// and the page cache charged to the container.
const MemoryLimitPercent = 90

// cgroupRoot is where the relay reads its cgroup's memory limit (a
// container sees its own cgroup there); tests point it elsewhere.
var cgroupRoot = "/sys/fs/cgroup"

// memoryLimit is what setMemoryLimit chose.
type memoryLimit struct {
	set    int64  // the soft limit set, 0 if none was
	cgroup int64  // the cgroup's memory limit, 0 if none was read
	from   string // where it came from, or why there is none
}

// unlimited is the least a cgroup v1 memory limit reads when there is
// none (it reads 9223372036854771712, the largest page count in bytes).
const unlimited = 1 << 62

// setMemoryLimit sets the Go runtime's soft memory limit to
// MemoryLimitPercent of the cgroup memory limit under root (cgroup v2's
// memory.max, else cgroup v1's memory/memory.limit_in_bytes), unless
// $GOMEMLIMIT is set (the runtime has applied it, "off" included). No
// limit, an unreadable file or one it cannot parse leaves the runtime
// without a limit; the relay starts all the same.
func setMemoryLimit(root string) memoryLimit {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		return memoryLimit{from: "$GOMEMLIMIT=" + env}
	}
	limit, file, err := cgroupMemoryLimit(root)
	switch {
	case err != nil:
		return memoryLimit{from: err.Error()}
	case limit == 0:
		return memoryLimit{from: file + ": no limit"}
	}
	soft := limit / 100 * MemoryLimitPercent
	debug.SetMemoryLimit(soft)
	return memoryLimit{set: soft, cgroup: limit, from: file}
}

// cgroupMemoryLimit reads the memory limit under root and the file it
// read; 0 means none.
func cgroupMemoryLimit(root string) (int64, string, error) {
	var err error
	for _, name := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		file := filepath.Join(root, name)
		var b []byte
		if b, err = os.ReadFile(file); errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return 0, file, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, file, nil
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			return 0, file, fmt.Errorf("%s: not a memory limit: %q", file, s)
		}
		if v >= unlimited {
			return 0, file, nil
		}
		return v, file, nil
	}
	return 0, "", fmt.Errorf("no cgroup memory limit under %s: %w", root, err)
}

// log says at start what the relay's soft memory limit is.
func (m memoryLimit) log(log logr.Logger) {
	limit := debug.SetMemoryLimit(-1)
	switch {
	case m.set > 0:
		log.Info("soft memory limit set from the cgroup's", "limitBytes", m.set, "cgroupLimitBytes", m.cgroup, "percent", MemoryLimitPercent, "file", m.from)
	case limit != math.MaxInt64:
		log.Info("soft memory limit", "limitBytes", limit, "from", m.from)
	default:
		log.Info("no soft memory limit", "reason", m.from)
	}
}
