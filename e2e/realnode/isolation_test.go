package realnode

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPaperclipAgentsSeeOnlyTheirOwn: the real Paperclip server keeps its
// home on the agents' volume at /paperclip, as its image does (its .env,
// its database there). An agent of company A and one of company B each
// run the fake agent's probe through the server: each pod's mount table
// under /paperclip holds its own agent's and company's directories and
// nothing else (not the instance's .env, secrets, database or run logs,
// not the other company's), the read-only ones read-only; each writes its
// workspace (the directory Paperclip chose, made by the server before the
// Job) and its home.
func TestPaperclipAgentsSeeOnlyTheirOwn(t *testing.T) {
	t.Parallel() // companies of its own on the shared server
	pc := thePaperclip(t)
	ctx, companyA := paperclipOnTheRealNode(t, pc, 10*time.Minute, "Isolated A")
	companyB := newCompany(ctx, t, pc, "Isolated B")
	root := "/paperclip/instances/default/"
	if _, err := os.Stat(filepath.Join(suite.in.SharedDir(), "instances", "default", ".env")); err != nil {
		t.Fatalf("the server's .env is not on the agents' volume (its home should be): %v", err)
	}
	for _, c := range []pcCompany{companyA, companyB} {
		agent := newAgent(ctx, t, pc, c.ID, "Prober", "claude_k8s", map[string]any{"promptTemplate": "lines=1 probe=1"}, nil)
		workspace := root + "workspaces/" + agent.ID
		// The probe writes in the run's working directory: the workspace.
		if err := pc.Do(ctx, "PATCH", "/api/agents/"+agent.ID, map[string]any{"adapterConfig": map[string]any{
			"promptTemplate": "lines=1 probe=1 write=" + workspace + "/written-by-the-agent"}}, nil); err != nil {
			t.Fatal(err)
		}
		run := wake(ctx, t, pc, agent.ID, "e2e: what the agent sees")
		if r := waitRunEnds(ctx, t, pc, run.ID); r.Status != "succeeded" {
			t.Fatalf("company %s: run %+v\n%s", c.Name, r, runLogText(ctx, pc, run.ID))
		}
		lines, _ := runLog(ctx, pc, run.ID)
		var probe struct {
			WriteError   string
			HomeWritable bool
			Mounts       []struct {
				Path     string
				ReadOnly bool
			}
		}
		found := false
		for _, l := range stdoutLines(lines) {
			var ev struct {
				Subtype string
				Probe   json.RawMessage
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Subtype == "fake_agent_probe" {
				found = json.Unmarshal(ev.Probe, &probe) == nil
			}
		}
		if !found {
			t.Fatalf("company %s: no probe in the run's log\n%s", c.Name, runLogText(ctx, pc, run.ID))
		}
		want := map[string]bool{
			workspace:                 false,
			root + "projects/" + c.ID: false,
			root + "companies/" + c.ID + "/agents/" + agent.ID + "/home":         false,
			root + "companies/" + c.ID + "/agents/" + agent.ID + "/instructions": true,
			root + "skills/" + c.ID: true,
		}
		got := map[string]bool{}
		for _, m := range probe.Mounts {
			got[m.Path] = m.ReadOnly
		}
		if !maps.Equal(got, want) {
			t.Errorf("company %s: the agent's mounts under /paperclip: %v; want exactly %v (path: read-only)", c.Name, got, want)
		}
		if probe.WriteError != "" || !probe.HomeWritable {
			t.Errorf("company %s: writing the workspace: %q; home writable %v", c.Name, probe.WriteError, probe.HomeWritable)
		}
		written := filepath.Join(suite.in.SharedDir(), "instances", "default", "workspaces", agent.ID, "written-by-the-agent")
		if _, err := os.Stat(written); err != nil {
			t.Errorf("company %s: the agent's file is not in its workspace on the volume: %v", c.Name, err)
		}
	}
}

// TestPaperclipAgentResumesItsOwnSession: an agent's second run through
// the real server resumes the session its first run started, from the
// agent's own home on the volume (the fake agent, like Claude, keeps its
// sessions under $HOME and fails to resume one its home does not hold).
func TestPaperclipAgentResumesItsOwnSession(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, company := paperclipOnTheRealNode(t, pc, 10*time.Minute, "Sessions Co")
	agent := newAgent(ctx, t, pc, company.ID, "Remembers", "claude_k8s", map[string]any{"promptTemplate": "lines=2"}, nil)
	first := waitRunEnds(ctx, t, pc, wake(ctx, t, pc, agent.ID, "e2e: the first run").ID)
	if first.Status != "succeeded" || first.SessionAfter == "" {
		t.Fatalf("the first run: %+v\n%s", first, runLogText(ctx, pc, first.ID))
	}
	home := filepath.Join(suite.in.SharedDir(), "instances", "default", "companies", company.ID, "agents", agent.ID, "home")
	if _, err := os.Stat(filepath.Join(home, ".fakeagent", "sessions", first.SessionAfter)); err != nil {
		t.Fatalf("the session is not in the agent's own home on the volume: %v", err)
	}
	second := waitRunEnds(ctx, t, pc, wake(ctx, t, pc, agent.ID, "e2e: the second run").ID)
	if second.Status != "succeeded" || second.SessionBefore != first.SessionAfter || second.SessionAfter != first.SessionAfter {
		t.Fatalf("the second run: session before %q after %q (status %s), want both %q\n%s",
			second.SessionBefore, second.SessionAfter, second.Status, first.SessionAfter, runLogText(ctx, pc, second.ID))
	}
}
