package redact

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paperclipai/clipjob/internal/testing/poll"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestValuesFileReloads: a rotated Secret's new value is redacted from
// then on; a file that disappears keeps the values in force, since
// dropping them would store the secrets they name.
func TestValuesFileReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "values")
	write := func(s string) {
		t.Helper()
		// As the kubelet does: a new file renamed over the old.
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("old-secret-1\n\n  padded-secret  \n")
	r, err := New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 28, 18, 0, 0, 0, time.UTC))
	v := &ValuesFile{Path: path, Redactor: r, Static: []string{"static-secret"}, Interval: 5 * time.Millisecond, Clock: clk, Log: logr.Discard()}
	if err := v.Load(); err != nil {
		t.Fatal(err)
	}
	redacted := func(line string) bool { return r.Redact(line) == Redacted }
	for _, s := range []string{"old-secret-1", "padded-secret", "static-secret"} {
		if !redacted(s) {
			t.Errorf("%q not redacted after Load", s)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Start(ctx) }()
	defer func() { cancel(); <-done }()

	write("new-secret-2\n")
	poll.WaitFor(t, func() bool { return redacted("new-secret-2") }, "the rotated value was never redacted")
	if !redacted("old-secret-1") {
		t.Error("a value rotated out is no longer redacted at once; the old key may still be valid and printed")
	}
	if !redacted("static-secret") {
		t.Error("a reload dropped the values given on the command line")
	}

	// Within a day (KeepRemoved's default) a removed value stays redacted
	// through the next change; after it, it is dropped at the next.
	clk.SetTime(clk.Now().Add(23 * time.Hour))
	write("new-secret-2\nthird-secret-3\n")
	poll.WaitFor(t, func() bool { return redacted("third-secret-3") }, "a value added later was never redacted")
	if !redacted("old-secret-1") {
		t.Error("a value rotated out 23 hours ago is no longer redacted")
	}
	clk.SetTime(clk.Now().Add(2 * time.Hour))
	write("new-secret-2\nthird-secret-3\nfourth-secret-4\n")
	poll.WaitFor(t, func() bool { return redacted("fourth-secret-4") }, "a value added later was never redacted")
	if redacted("old-secret-1") {
		t.Error("a value removed long ago is still redacted")
	}

	failed := func() float64 { return testutil.ToFloat64(valuesReloads.WithLabelValues("error")) }
	before := failed()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, func() bool { return failed() >= before+3 }, "the reloader never tried to read the missing file")
	if !redacted("new-secret-2") {
		t.Error("an unreadable file dropped the values in force")
	}
	if err := v.Load(); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestValuesFileLoadNamesTheProblem(t *testing.T) {
	r, _ := New(nil, nil)
	err := (&ValuesFile{Path: filepath.Join(t.TempDir(), "none"), Redactor: r}).Load()
	if err == nil || !strings.Contains(err.Error(), "redaction values") || !strings.Contains(err.Error(), "none") {
		t.Errorf("Load: %v", err)
	}
}

// A mounted Secret is a directory: a file per key, each a symlink into the
// kubelet's ..data directory. Every key's value is redacted.
func TestValuesFileReadsAMountedSecret(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_11_23")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"ANTHROPIC_API_KEY": "sk-ant-secret-value", "OPENAI_API_KEY": "openai-secret-value\n"} {
		if err := os.WriteFile(filepath.Join(data, k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	r, _ := New(nil, nil)
	if err := (&ValuesFile{Path: dir, Redactor: r}).Load(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"sk-ant-secret-value", "openai-secret-value"} {
		if got := r.Redact("key=" + s); got != "key="+Redacted {
			t.Errorf("%q: %q", s, got)
		}
	}
}
