package redact

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// ValuesFile keeps a Redactor's literal values those of a file, one per
// line, or of every file in a directory: typically a mounted Secret (a
// file per key), which the kubelet replaces in place when it changes. It is polled rather than watched because the
// kubelet swaps a symlink to a new directory, which file watches miss
// unless they follow the swap.
type ValuesFile struct {
	Path     string
	Redactor *Redactor
	// Static values are redacted besides the file's.
	Static []string
	// Interval between reads. Default 30s, within the kubelet's own delay
	// in updating a mounted Secret.
	Interval time.Duration
	// KeepRemoved is how long a value removed from the file is still
	// redacted: during a key rotation the old key often stays valid for a
	// while, and an agent may still print it. Default 24h.
	KeepRemoved time.Duration
	Log         logr.Logger
	// Clock times how long a removed value stays redacted. Default the
	// real clock.
	Clock clock.PassiveClock

	last    []byte
	current []string
	removed map[string]time.Time // value -> when it left the file
}

// Load reads the file and applies its values. The relay refuses to start
// on an error: running without the values it was told to redact would
// store them.
func (v *ValuesFile) Load() error {
	data, err := readValuesFile(v.Path)
	if err != nil {
		return fmt.Errorf("redaction values: %w", err)
	}
	v.apply(data)
	return nil
}

// Start re-reads the file until ctx ends. A file that cannot be read keeps
// the values in force: losing them would store the secrets they name.
func (v *ValuesFile) Start(ctx context.Context) error {
	interval := v.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	failing := false
	wait.UntilWithContext(ctx, func(context.Context) {
		data, err := readValuesFile(v.Path)
		switch {
		case err != nil:
			valuesReloads.WithLabelValues("error").Inc()
			if !failing {
				v.Log.Error(err, "cannot read the redaction values file; the values read before stay in force", "path", v.Path)
			}
			failing = true
		case !bytes.Equal(data, v.last):
			n := v.apply(data)
			valuesReloads.WithLabelValues("applied").Inc()
			v.Log.Info("redaction values reloaded", "path", v.Path, "values", n)
			failing = false
		default:
			failing = false
		}
	}, interval)
	return nil
}

func (v *ValuesFile) apply(data []byte) int {
	if v.Clock == nil {
		v.Clock = clock.RealClock{}
	}
	now := v.Clock.Now()
	keep := v.KeepRemoved
	if keep <= 0 {
		keep = 24 * time.Hour
	}
	file := parseValues(data)
	if v.removed == nil {
		v.removed = map[string]time.Time{}
	}
	for _, old := range v.current {
		if !slices.Contains(file, old) {
			v.removed[old] = now
		}
	}
	values := append(append([]string{}, v.Static...), file...)
	for val, since := range v.removed {
		switch {
		case slices.Contains(file, val), now.Sub(since) > keep:
			delete(v.removed, val)
		default:
			values = append(values, val)
		}
	}
	v.Redactor.SetValues(values)
	v.last, v.current = data, file
	return len(file)
}

// readValuesFile returns the file at path, or the files of the directory
// at path one after the other (skipping the kubelet's "..data" entries).
func readValuesFile(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return os.ReadFile(path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var all []byte
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		file := filepath.Join(path, e.Name())
		if fi, err := os.Stat(file); err == nil && fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		all = append(append(all, data...), '\n')
	}
	return all, nil
}

// parseValues reads one value per non-empty line, trimmed.
func parseValues(data []byte) []string {
	var values []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), len(data)+1)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			values = append(values, s)
		}
	}
	return values
}

var valuesReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "clipjob_relay_redact_values_reloads_total",
	Help: "Reads of --redact-values-file after the start that changed the values (applied) or failed (error: the values before stay in force).",
}, []string{"result"})

// Collectors returns the redaction metrics, for the relay to register.
func Collectors() []prometheus.Collector { return []prometheus.Collector{valuesReloads} }
