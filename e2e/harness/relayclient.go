package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/relay/store"
)

// What a test reads from a relay's API, as Paperclip's adapter reads it:
// over TLS signed by the cluster's CA, with a bearer token.

// Get sends GET path to the relay with token (none if empty) and accept.
func (r *Relay) Get(path, token, accept string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, "https://"+r.APIAddr+path, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return r.CA.HTTPClient().Do(req)
}

// Run is the relay's record of run and the HTTP status it answered (0
// when it could not be asked).
func (r *Relay) Run(t testing.TB, token, run string) (*store.Run, int) {
	t.Helper()
	out, code, err := r.RunRecord(token, run)
	if err != nil && code == http.StatusOK {
		t.Fatal(err)
	}
	return out, code
}

// RunRecord is Run outside a test: the error says why there is no record
// (the request failed, or the answer was no record).
func (r *Relay) RunRecord(token, run string) (*store.Run, int, error) {
	resp, err := r.Get("/v1/runs/"+run, token, "")
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, resp.StatusCode, fmt.Errorf("run %s: %d %s", run, resp.StatusCode, b)
	}
	var out store.Run
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, resp.StatusCode, fmt.Errorf("run %s: %w", run, err)
	}
	return &out, resp.StatusCode, nil
}

// WaitRun waits until the relay's record of run satisfies ok.
func (r *Relay) WaitRun(ctx context.Context, t testing.TB, token, run string, ok func(*store.Run) bool) *store.Run {
	t.Helper()
	last, err := r.AwaitRun(ctx, token, run, ok)
	if err != nil {
		t.Fatal(err)
	}
	return last
}

// AwaitRun is WaitRun outside a test.
func (r *Relay) AwaitRun(ctx context.Context, token, run string, ok func(*store.Run) bool) (*store.Run, error) {
	var last *store.Run
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		last, _, _ = r.RunRecord(token, run)
		return last != nil && ok(last), nil
	})
	if err != nil {
		return last, fmt.Errorf("run %s: %w (last: %+v)", run, err, last)
	}
	return last, nil
}

// Lines is the run's stored log, a line each.
func (r *Relay) Lines(t testing.TB, token, run string) []string {
	t.Helper()
	lines, err := r.LogLines(token, run)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// LogLines is Lines outside a test.
func (r *Relay) LogLines(token, run string) ([]string, error) {
	resp, err := r.Get("/v1/runs/"+run+"/log", token, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("log of %s: %d %s", run, resp.StatusCode, b)
	}
	return SplitLines(string(b)), nil
}

// SplitLines is the lines of a log (its last ends with a newline): none
// for an empty one.
func SplitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// ExactlyOnce fails the test unless got is want in order, no line lost
// or twice.
func ExactlyOnce(t testing.TB, got, want []string) {
	t.Helper()
	if n := Tally(got, want); !n.Once() {
		t.Fatal(n)
	}
}

// LineTally is what a store made of the lines written to a run: how many
// of them it lost, stored more than once, or holds though nobody wrote
// them, and where its order first departs from the writer's.
type LineTally struct {
	Want, Got int
	// Lost are written lines stored fewer times than written (each
	// missing copy counts); Duplicated are copies beyond what was
	// written; Foreign are stored lines nobody wrote.
	Lost, Duplicated, Foreign int
	// LostLines and DuplicatedLines are the first few of each, for a
	// failure message.
	LostLines, DuplicatedLines []string
	// Misplaced is the first index at which the stored lines are not the
	// written ones, -1 when they are all in place.
	Misplaced int
	misplaced [2]string
}

// Tally compares the stored lines got with the written lines want.
func Tally(got, want []string) LineTally {
	n := LineTally{Want: len(want), Got: len(got), Misplaced: -1}
	wrote := map[string]int{}
	for _, w := range want {
		wrote[w]++
	}
	stored := map[string]int{}
	for _, g := range got {
		stored[g]++
		if wrote[g] == 0 {
			n.Foreign++
		}
	}
	for _, w := range want {
		switch d := stored[w] - wrote[w]; {
		case d < 0:
			n.Lost++
			stored[w]++ // each missing copy once
			if len(n.LostLines) < 5 {
				n.LostLines = append(n.LostLines, w)
			}
		case d > 0 && wrote[w] > 0:
			n.Duplicated += d
			stored[w] = wrote[w] // counted once
			if len(n.DuplicatedLines) < 5 {
				n.DuplicatedLines = append(n.DuplicatedLines, w)
			}
		}
	}
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) || got[i] != want[i] {
			n.Misplaced = i
			if i < len(got) {
				n.misplaced[0] = got[i]
			}
			if i < len(want) {
				n.misplaced[1] = want[i]
			}
			break
		}
	}
	return n
}

// Once reports whether every written line is stored once, in order, and
// nothing else.
func (n LineTally) Once() bool { return n.Misplaced < 0 }

func (n LineTally) String() string {
	if n.Once() {
		return fmt.Sprintf("%d lines, each stored once, in order", n.Want)
	}
	if n.Lost+n.Duplicated+n.Foreign > 0 {
		return fmt.Sprintf("stored %d lines, want %d; lost %d %.1000q, duplicated %d %.1000q, %d nobody wrote", n.Got, n.Want, n.Lost, n.LostLines,
			n.Duplicated, n.DuplicatedLines, n.Foreign)
	}
	return fmt.Sprintf("line %d is %.300q (%d bytes), want %.300q (%d bytes)", n.Misplaced, n.misplaced[0], len(n.misplaced[0]), n.misplaced[1], len(n.misplaced[1]))
}

// Head is the first five of s, for failure messages.
func Head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

// ClaudeInit is the first line Claude Code's stream-json writes.
const ClaudeInit = `{"type":"system","subtype":"init","session_id":"sess-e2e","model":"claude-sonnet-4-5"}`

// ClaudeResult is its last, the result with text.
func ClaudeResult(text string) string {
	return fmt.Sprintf(`{"type":"result","subtype":"success","is_error":false,"result":%q,"session_id":"sess-e2e","total_cost_usd":0.42,"usage":{"input_tokens":10,"output_tokens":20}}`, text)
}
