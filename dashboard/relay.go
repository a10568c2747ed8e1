package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/paperclipai/clipjob/relay/store"
)

// Relay reaches the relay's HTTP API with a token made for its audience
// (`kubectl create token <serviceaccount> --audience clipjob-relay`, the
// token a Paperclip adapter reads with). The token stays in this process:
// the page's requests come here, never to the relay.
type Relay struct {
	// URL is the API's base, e.g. https://localhost:8090 through
	// `kubectl port-forward`.
	URL string
	// TokenFile holds the token; it is read at each request, so a token
	// renewed in place (a projected one, or rewritten by a script) is used.
	TokenFile string
	// HTTP sends the requests; its TLS config trusts the relay's CA.
	HTTP *http.Client
	// Limit is how many of the newest runs to list (the relay's default
	// 100 leaves older runs out).
	Limit int
}

func (r *Relay) request(ctx context.Context, path string, query url.Values, accept string) (*http.Request, error) {
	token, err := os.ReadFile(r.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the relay token (--relay-token-file): %w", err)
	}
	u := strings.TrimSuffix(r.URL, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", accept)
	return req, nil
}

// Runs lists the runs the relay's token may read, newest first.
func (r *Relay) Runs(ctx context.Context) ([]store.Run, error) {
	q := url.Values{}
	if r.Limit > 0 {
		q.Set("limit", fmt.Sprint(r.Limit))
	}
	req, err := r.request(ctx, "/v1/runs", q, "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("listing runs from the relay at %s (--relay-url): %w", r.redactedURL(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("the relay at %s answered %s: %s", r.redactedURL(), resp.Status, strings.TrimSpace(string(body)))
	}
	var out struct {
		Runs      []store.Run `json:"runs"`
		Truncated bool        `json:"truncated"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("reading the relay's run list: %w", err)
	}
	if out.Truncated {
		// Older runs are left out of the page and of the costs: say so.
		return out.Runs, &TruncatedError{Shown: len(out.Runs)}
	}
	return out.Runs, nil
}

// TruncatedError is a run list the relay cut at the limit asked for: the
// runs it holds are the newest.
type TruncatedError struct{ Shown int }

func (e *TruncatedError) Error() string {
	return fmt.Sprintf("the relay lists only its newest %d runs: older ones, and their costs, are not shown (raise --relay-limit)", e.Shown)
}

// Run is the relay's record of a run (of the Job jobUID, when given), or
// nil when the relay has none the token may read.
func (r *Relay) Run(ctx context.Context, run, jobUID string) (*store.Run, error) {
	q := url.Values{}
	if jobUID != "" {
		q.Set("job", jobUID)
	}
	req, err := r.request(ctx, "/v1/runs/"+url.PathEscape(run), q, "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading run %s from the relay at %s (--relay-url): %w", run, r.redactedURL(), err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, nil
	default:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("the relay at %s answered %s: %s", r.redactedURL(), resp.Status, strings.TrimSpace(string(body)))
	}
	var out store.Run
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("reading the relay's record of run %s: %w", run, err)
	}
	return &out, nil
}

// Log opens a run's log as the relay's NDJSON stream (one JSON event a
// line: "line", "keepalive", then "end"), following it from after the
// line numbered after.
func (r *Relay) Log(ctx context.Context, run, jobUID string, after uint64) (*http.Response, error) {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if jobUID != "" {
		q.Set("job", jobUID)
	}
	req, err := r.request(ctx, "/v1/runs/"+url.PathEscape(run)+"/log", q, "application/x-ndjson")
	if err != nil {
		return nil, err
	}
	return r.HTTP.Do(req)
}

// redactedURL is URL for messages the page shows: without a password.
func (r *Relay) redactedURL() string {
	u, err := url.Parse(r.URL)
	if err != nil {
		return "(the --relay-url given)"
	}
	return u.Redacted()
}
