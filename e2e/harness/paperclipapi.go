package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
)

// The parts of Paperclip's API the suite and the demo drive a server
// through, as its board does: companies, agents, wakes, runs and their logs.

// PaperclipCompany is a company of a Paperclip server.
type PaperclipCompany struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// PaperclipAgent is an agent of a company.
type PaperclipAgent struct {
	ID        string `json:"id"`
	CompanyID string `json:"companyId"`
	Name      string `json:"name"`
	Status    string `json:"status"`
}

// PaperclipRun is the part of a heartbeat run the suite reads.
type PaperclipRun struct {
	ID            string         `json:"id"`
	AgentID       string         `json:"agentId"`
	Status        string         `json:"status"`
	Error         string         `json:"error"`
	ErrorCode     string         `json:"errorCode"`
	ExitCode      *int           `json:"exitCode"`
	UsageJSON     map[string]any `json:"usageJson"`
	ResultJSON    map[string]any `json:"resultJson"`
	SessionBefore string         `json:"sessionIdBefore"`
	SessionAfter  string         `json:"sessionIdAfter"`
	RetryOf       string         `json:"retryOfRunId"`
}

// Ended says whether Paperclip holds the run as over.
func (r PaperclipRun) Ended() bool {
	switch r.Status {
	case "succeeded", "failed", "cancelled", "timed_out", "interrupted":
		return true
	}
	return false
}

// PaperclipLogLine is one record of a run's log as Paperclip stores it.
type PaperclipLogLine struct {
	Stream string `json:"stream"`
	Chunk  string `json:"chunk"`
}

// NewCompany makes a company named name.
func (p *Paperclip) NewCompany(ctx context.Context, name string) (PaperclipCompany, error) {
	var c PaperclipCompany
	err := p.Do(ctx, http.MethodPost, "/api/companies", map[string]any{"name": name}, &c)
	return c, err
}

// NewAgent makes an agent of company from the whole create request. The
// adapter offers Paperclip's managed instructions bundle, so Paperclip
// makes the new agent's bundle and refuses prompt templates at creation,
// as for its built-in adapters; templates in adapterConfig (the fake
// agent's script) are set by an edit after, as an operator would.
func (p *Paperclip) NewAgent(ctx context.Context, company string, body map[string]any) (PaperclipAgent, error) {
	config, _ := body["adapterConfig"].(map[string]any)
	created, templates := map[string]any{}, map[string]any{}
	for k, v := range config {
		if k == "promptTemplate" || k == "bootstrapPromptTemplate" {
			templates[k] = v
		} else {
			created[k] = v
		}
	}
	body = maps.Clone(body)
	body["adapterConfig"] = created
	var a PaperclipAgent
	if err := p.Do(ctx, http.MethodPost, "/api/companies/"+company+"/agents", body, &a); err != nil {
		return a, err
	}
	if len(templates) > 0 {
		if err := p.Do(ctx, http.MethodPatch, "/api/agents/"+a.ID, map[string]any{"adapterConfig": templates}, nil); err != nil {
			return a, err
		}
	}
	return a, nil
}

// Wake asks for a run of agent, as the board's "Run now" does, and returns
// the run Paperclip queued.
func (p *Paperclip) Wake(ctx context.Context, agent, reason string) (PaperclipRun, error) {
	var r PaperclipRun
	if err := p.Do(ctx, http.MethodPost, "/api/agents/"+agent+"/wakeup", map[string]any{"source": "on_demand", "triggerDetail": "manual", "reason": reason}, &r); err != nil {
		return r, err
	}
	if r.ID == "" {
		return r, fmt.Errorf("the wakeup of agent %s queued no run: %+v", agent, r)
	}
	return r, nil
}

// Run reads run id.
func (p *Paperclip) Run(ctx context.Context, id string) (PaperclipRun, error) {
	var r PaperclipRun
	err := p.Do(ctx, http.MethodGet, "/api/heartbeat-runs/"+id, nil, &r)
	return r, err
}

// RunLog reads run id's log: every record Paperclip holds now.
func (p *Paperclip) RunLog(ctx context.Context, id string) ([]PaperclipLogLine, error) {
	var out []PaperclipLogLine
	offset := 0
	for {
		var page struct {
			Content    string `json:"content"`
			NextOffset *int   `json:"nextOffset"`
		}
		if err := p.Do(ctx, http.MethodGet, fmt.Sprintf("/api/heartbeat-runs/%s/log?offset=%d&limitBytes=1048576", url.PathEscape(id), offset), nil, &page); err != nil {
			return out, err
		}
		sc := bufio.NewScanner(strings.NewReader(page.Content))
		sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
		for sc.Scan() {
			var l PaperclipLogLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				out = append(out, l)
			}
		}
		if page.NextOffset == nil || *page.NextOffset <= offset {
			return out, nil
		}
		offset = *page.NextOffset
	}
}

// StdoutLines are the lines of a run's log records on stdout: the agent
// CLI's own output.
func StdoutLines(records []PaperclipLogLine) []string {
	var out []string
	for _, l := range records {
		if l.Stream == "stdout" {
			out = append(out, strings.Split(strings.TrimRight(l.Chunk, "\n"), "\n")...)
		}
	}
	return out
}

// AgentTexts are the assistant's texts in a run's log records, in order:
// what a Claude stream-json agent (the fake agent: "line 1", "line 2", …)
// said.
func AgentTexts(records []PaperclipLogLine) []string {
	var out []string
	for _, l := range StdoutLines(records) {
		var ev struct {
			Type    string
			Message struct{ Content []struct{ Type, Text string } }
		}
		if json.Unmarshal([]byte(l), &ev) != nil || ev.Type != "assistant" {
			continue
		}
		for _, c := range ev.Message.Content {
			if c.Type == "text" {
				out = append(out, c.Text)
			}
		}
	}
	return out
}
