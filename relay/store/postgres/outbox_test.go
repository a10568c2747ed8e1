package postgres

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Runs changed while a notification is sent go out in the next one, every
// one once, in payloads the server accepts; what could not be sent is
// sent later.
func TestOutboxCoalescesRunsIntoPayloads(t *testing.T) {
	o := outbox{self: "!me", pending: map[string]bool{}}
	want := map[string]bool{}
	for i := range 1000 {
		run := fmt.Sprintf("run-%04d@0b7e7c2a-1f5d-4c1e-9a3e-6d2f8b9c0a11", i)
		o.pending[run], want[run] = true, true
	}
	payloads := o.take()
	if len(payloads) < 2 {
		t.Fatalf("%d payloads for %d runs", len(payloads), len(want))
	}
	got := map[string]int{}
	for _, p := range payloads {
		if len(p) > payloadBytes {
			t.Errorf("a payload of %d bytes, over %d", len(p), payloadBytes)
		}
		lines := strings.Split(p, "\n")
		if lines[0] != "!me" {
			t.Errorf("a payload from %q, want from !me", lines[0])
		}
		for _, run := range lines[1:] {
			got[run]++
		}
	}
	for run := range want {
		if got[run] != 1 {
			t.Fatalf("run %s in %d payloads", run, got[run])
		}
	}
	if len(got) != len(want) || len(o.take()) != 0 {
		t.Errorf("%d runs sent, want %d; and the outbox is not empty", len(got), len(want))
	}
	o.putBack(payloads[:1])
	sorted := func(p string) string {
		runs := strings.Split(p, "\n")[1:]
		slices.Sort(runs)
		return strings.Join(runs, ",")
	}
	if again := o.take(); len(again) != 1 || sorted(again[0]) != sorted(payloads[0]) {
		t.Errorf("put back one payload, took back %d that differ", len(again))
	}
}
