// Package poll waits on conditions in tests, with a bound far above any
// stall of a loaded machine, reached only when the condition never comes.
package poll

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Eventually polls ok until it holds, for a minute at most.
func Eventually(ok func() bool) bool {
	return wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return ok(), nil }) == nil
}

// WaitFor fails t with msg unless ok comes to hold.
func WaitFor(t testing.TB, ok func() bool, msg string) {
	t.Helper()
	if !Eventually(ok) {
		t.Fatal(msg)
	}
}
