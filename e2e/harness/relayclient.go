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
	resp, err := r.Get("/v1/runs/"+run, token, "")
	if err != nil {
		return nil, 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode
	}
	var out store.Run
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return &out, resp.StatusCode
}

// WaitRun waits until the relay's record of run satisfies ok.
func (r *Relay) WaitRun(ctx context.Context, t testing.TB, token, run string, ok func(*store.Run) bool) *store.Run {
	t.Helper()
	var last *store.Run
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		last, _ = r.Run(t, token, run)
		return last != nil && ok(last), nil
	})
	if err != nil {
		t.Fatalf("run %s: %v (last: %+v)", run, err, last)
	}
	return last
}

// Lines is the run's stored log, a line each.
func (r *Relay) Lines(t testing.TB, token, run string) []string {
	t.Helper()
	resp, err := r.Get("/v1/runs/"+run+"/log", token, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("log of %s: %d %s", run, resp.StatusCode, b)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// ExactlyOnce fails the test unless got is want in order, no line lost
// or twice.
func ExactlyOnce(t testing.TB, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		seen := map[string]int{}
		for _, g := range got {
			seen[g]++
		}
		var dup, lost []string
		for _, w := range want {
			if seen[w] == 0 {
				lost = append(lost, w)
			} else if seen[w] > 1 {
				dup = append(dup, w)
			}
		}
		t.Fatalf("stored %d lines, want %d; lost %d %.1000q, duplicated %d %.1000q", len(got), len(want), len(lost), Head(lost), len(dup), Head(dup))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("line %d is %.300q (%d bytes), want %.300q (%d bytes)", i, got[i], len(got[i]), want[i], len(want[i]))
		}
	}
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
