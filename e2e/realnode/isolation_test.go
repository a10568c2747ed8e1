package realnode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/e2e/paperclipjwt"
)

// instanceRoot is the shared server's instance directory as agents' pods
// and the server see it: its home is the volume at /paperclip.
const instanceRoot = "/paperclip/instances/default/"

// ownDirs are the directories of the volume a run of agent in company
// mounts under isolation mode Agent, each with whether it is read-only.
func ownDirs(company, agent string) map[string]bool {
	return map[string]bool{
		instanceRoot + "workspaces/" + agent:                                 false,
		instanceRoot + "projects/" + company:                                 false,
		instanceRoot + "companies/" + company + "/agents/" + agent + "/home": false,
		ownInstructionsDir(company, agent):                                   true,
		instanceRoot + "skills/" + company:                                   true,
	}
}

// fakeAgentEvent decodes the fake agent's first system line of subtype
// from run's log: its field key into out. False when the log holds none.
func fakeAgentEvent(ctx context.Context, pc *harness.Paperclip, run, subtype, key string, out any) bool {
	found := false
	fakeAgentEvents(ctx, pc, run, subtype, key, func(raw json.RawMessage) bool {
		found = json.Unmarshal(raw, out) == nil
		return false
	})
	return found
}

// fakeAgentEvents hands each of the fake agent's system lines of subtype
// in run's log (its field key) to each, in order, while each says go on.
func fakeAgentEvents(ctx context.Context, pc *harness.Paperclip, run, subtype, key string, each func(json.RawMessage) bool) {
	lines, _ := pc.RunLog(ctx, run)
	for _, l := range harness.StdoutLines(lines) {
		var ev map[string]json.RawMessage
		if json.Unmarshal([]byte(l), &ev) != nil || string(ev["subtype"]) != `"`+subtype+`"` {
			continue
		}
		if !each(ev[key]) {
			return
		}
	}
}

// runMounts is what the fake agent's probe read of its mount table under
// /paperclip in run: path to read-only.
func runMounts(ctx context.Context, t *testing.T, pc *harness.Paperclip, run string) (map[string]bool, probeFacts) {
	t.Helper()
	var probe probeFacts
	if !fakeAgentEvent(ctx, pc, run, "fake_agent_probe", "probe", &probe) {
		t.Fatalf("no probe in the log of run %s\n%s", run, runLogText(ctx, pc, run))
	}
	got := map[string]bool{}
	for _, m := range probe.Mounts {
		got[m.Path] = m.ReadOnly
	}
	return got, probe
}

// probeFacts is the part of the fake agent's probe these tests read.
type probeFacts struct {
	WriteError      string
	HomeWritable    bool
	Read, ReadError string
	// Env is the names of the agent's environment.
	Env    []string
	Mounts []struct {
		Path     string
		ReadOnly bool
	}
}

// TestAHostileAgentReachesNoOtherAgentsData: the real Paperclip server
// keeps its home on the agents' volume at /paperclip, as its image does
// (its .env, its database there). Agent A1 of company A runs as an
// attacker beside A2 (company A) and B1 (company B), all through that
// server; A2 and B1 probe their pods and write their workspaces (the
// working directory Paperclip chose, made by the server before the Job)
// and their homes. From inside A1: it sees
// nothing of the volume but its own directories (no .env, config.json,
// secrets, database, run logs or mirror, adapter plugins, no other
// agent's home, no other company's tree); it cannot write its
// instructions, its skills, or anything above its mounts, nor move a
// mount away; every token it forges for B1 from everything it can read is
// refused by the server (401), while one forged from the server's secret
// is accepted, so the forging is right. The links it plants (up the tree,
// at the volume's root) in its workspace, home and project redirect no
// mount: on their next runs A1, A2 and B1 each mount exactly their own
// directories, the read-only ones read-only, and write their workspaces.
//
// Unlike Paperclip's image, where the server and its agents are one uid
// (1000), the suite's server runs as nobody in the volume's group (its
// embedded PostgreSQL needs a user with a passwd entry), so its private
// files (.env 0600, instances/ 0700) would be out of an unconfined agent's
// reach here too: what the attacker sees (the walk, the mount tables) is
// the proof; the tokens are what it would do with whatever it reads.
func TestAHostileAgentReachesNoOtherAgentsData(t *testing.T) {
	t.Parallel() // companies of its own on the shared server
	pc := thePaperclip(t)
	ctx, companyA := paperclipOnTheRealNode(t, pc, 15*time.Minute, "Attacker A")
	companyB := newCompany(ctx, t, pc, "Victim B")
	probe := map[string]any{"promptTemplate": "lines=1 probe=1 write=" + instanceRoot + "workspaces/{{agent.id}}/written-by-the-agent"}
	b1 := newAgent(ctx, t, pc, companyB.ID, "Victim", "claude_k8s", probe, nil)
	a1 := newAgent(ctx, t, pc, companyA.ID, "Attacker", "claude_k8s", map[string]any{
		"promptTemplate": "lines=1 attack=" + b1.ID + "@" + companyB.ID}, nil)
	a2 := newAgent(ctx, t, pc, companyA.ID, "Colleague", "claude_k8s", probe, nil)
	agents := []pcAgent{a1, a2, b1}

	// runAll runs every agent at once; each prober sees its own
	// directories and writes its workspace and home.
	runAll := func(reason string, probers ...pcAgent) map[string]string {
		runs := map[string]string{}
		for _, a := range agents {
			runs[a.ID] = wake(ctx, t, pc, a.ID, reason).ID
		}
		for _, a := range agents {
			if r := waitRunEnds(ctx, t, pc, runs[a.ID]); r.Status != "succeeded" {
				t.Fatalf("%s (%s): run %+v\n%s", a.Name, reason, r, runLogText(ctx, pc, r.ID))
			}
		}
		for _, a := range probers {
			mounts, probe := runMounts(ctx, t, pc, runs[a.ID])
			if want := ownDirs(a.CompanyID, a.ID); !maps.Equal(mounts, want) {
				t.Errorf("%s (%s): mounts under /paperclip %v; want exactly %v (path: read-only)", a.Name, reason, mounts, want)
			}
			if probe.WriteError != "" || !probe.HomeWritable {
				t.Errorf("%s (%s): writing its workspace: %q; home writable %v", a.Name, reason, probe.WriteError, probe.HomeWritable)
			}
			if _, err := os.Stat(filepath.Join(suite.in.SharedDir(), "instances", "default", "workspaces", a.ID, "written-by-the-agent")); err != nil {
				t.Errorf("%s (%s): its file is not in its workspace on the volume: %v", a.Name, reason, err)
			}
		}
		return runs
	}
	first := runAll("e2e: the attack", a2, b1)
	var got struct {
		Seen, Read, Planted []string
		Count               int
		Tried               map[string]string
	}
	if !fakeAgentEvent(ctx, pc, first[a1.ID], "fake_agent_attack", "attack", &got) {
		t.Fatalf("no attack in the attacker's log\n%s", runLogText(ctx, pc, first[a1.ID]))
	}
	var forged []struct{ From, Token string }
	fakeAgentEvents(ctx, pc, first[a1.ID], "fake_agent_forged", "forged", func(raw json.RawMessage) bool {
		var batch []struct{ From, Token string }
		if err := json.Unmarshal(raw, &batch); err != nil {
			t.Errorf("a line of forged tokens: %v", err)
		}
		forged = append(forged, batch...)
		return true
	})

	own := ownDirs(companyA.ID, a1.ID)
	for dir := range own {
		if !slices.Contains(got.Seen, dir) {
			t.Errorf("the attacker did not see its own %s (it saw %d paths)", dir, got.Count)
		}
	}
	var outside []string
	for _, seen := range got.Seen {
		if path, _, _ := strings.Cut(seen, " -> "); !withinOrAbove(path, own) {
			outside = append(outside, seen)
		}
	}
	if len(outside) > 0 {
		t.Errorf("the attacker saw %d paths of the volume (%d listed), outside its own directories: %s", got.Count, len(got.Seen), strings.Join(outside[:min(len(outside), 40)], ", "))
	}

	for what, err := range got.Tried {
		if err == "" {
			t.Errorf("the attacker could: %s", what)
		}
	}
	for _, ro := range []string{"instructions", "skills"} {
		tried := slices.ContainsFunc(slices.Collect(maps.Keys(got.Tried)), func(k string) bool { return strings.Contains(k, "/"+ro+"/") })
		if !tried {
			t.Errorf("the attacker never tried to write its %s: %v", ro, got.Tried)
		}
	}

	secret := agentJWTSecret(t)
	victim := paperclipjwt.Claims{Agent: b1.ID, Company: companyB.ID, AdapterType: "claude_k8s", Run: paperclipjwt.NewRunID(), Instance: "default"}
	if code, body := asAgent(ctx, t, pc, paperclipjwt.Mint(secret, victim, false, time.Now())); code != http.StatusOK || !strings.Contains(body, b1.ID) {
		t.Fatalf("a token forged from the server's own secret for %s: %d %s; the forging does not match the server's, so the attacker's tokens prove nothing", b1.ID, code, body)
	}
	if len(forged) == 0 {
		t.Fatal("the attacker forged no token: it read nothing, not even its environment")
	}
	accepted := 0
	for _, f := range forged {
		if code, body := asAgent(ctx, t, pc, strings.ReplaceAll(f.Token, " ", ".")); code != http.StatusUnauthorized {
			if accepted++; accepted <= 10 {
				t.Errorf("a token the attacker signed with %s: %d %s, want 401", f.From, code, body)
			}
		}
	}
	if accepted > 0 {
		t.Errorf("the server took %d of the %d tokens the attacker forged for %s", accepted, len(forged), b1.Name)
	}

	if len(got.Planted) != 6 {
		t.Errorf("the attacker planted %v, want two links in each of its three writable directories", got.Planted)
	}
	for _, p := range got.Planted {
		host := filepath.Join(suite.in.SharedDir(), strings.TrimPrefix(p, "/paperclip/"))
		if fi, err := os.Lstat(host); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the planted link %s is not on the volume as a link: %v", host, err)
		}
	}
	if err := pc.Do(ctx, http.MethodPatch, "/api/agents/"+a1.ID, map[string]any{"adapterConfig": probe}, nil); err != nil {
		t.Fatal(err)
	}
	runAll("e2e: the runs after the attack", agents...)
}

// withinOrAbove: path is one of dirs, inside one, or a directory on the
// way to one (a mount point's parents, which the container runtime makes).
func withinOrAbove(path string, dirs map[string]bool) bool {
	for d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") || strings.HasPrefix(d, path+"/") {
			return true
		}
	}
	return false
}

// agentJWTSecret is the shared server's PAPERCLIP_AGENT_JWT_SECRET, from
// the .env its onboarding wrote in its home on the volume.
func agentJWTSecret(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join(suite.in.SharedDir(), "instances", "default", ".env"))
	if err != nil {
		t.Fatalf("the server's .env is not on the agents' volume (its home should be): %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "PAPERCLIP_AGENT_JWT_SECRET="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	t.Fatalf("the server's .env holds no PAPERCLIP_AGENT_JWT_SECRET")
	return ""
}

// asAgent is the status and body of the server's "who am I" for an agent
// token.
func asAgent(ctx context.Context, t *testing.T, pc *harness.Paperclip, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pc.URL+"/api/agents/me", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, fmt.Sprintf("%.300s", body)
}

// TestPaperclipAgentReadsItsInstructionsBundle: Paperclip keeps an
// agent's managed instructions bundle in its home on the volume; the
// entry file reaches the agent in its prompt, and the files beside it are
// in the pod, read-only at the path Paperclip names, so the references
// the instructions make resolve there as they would for a local agent.
func TestPaperclipAgentReadsItsInstructionsBundle(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, company := paperclipOnTheRealNode(t, pc, 10*time.Minute, "Instructions Co")
	const notes = "Deploy on Tuesdays only.\n"
	agent := newAgentWith(ctx, t, pc, company.ID, map[string]any{
		"name": "Reader", "adapterType": "claude_k8s",
		"adapterConfig": map[string]any{"promptTemplate": "lines=1 probe=1"},
		"instructionsBundle": map[string]any{"entryFile": "AGENTS.md", "files": map[string]any{
			"AGENTS.md": "Read NOTES.md before you start: read=NOTES.md\n",
			"NOTES.md":  notes,
		}},
	})
	var a struct{ AdapterConfig map[string]any }
	if err := pc.Do(ctx, http.MethodGet, "/api/agents/"+agent.ID, nil, &a); err != nil {
		t.Fatal(err)
	}
	entry, _ := a.AdapterConfig["instructionsFilePath"].(string)
	if want := ownInstructionsDir(company.ID, agent.ID) + "/AGENTS.md"; entry != want {
		t.Fatalf("Paperclip keeps the agent's instructions at %q, want %q (adapterConfig %v)", entry, want, a.AdapterConfig)
	}
	run := wake(ctx, t, pc, agent.ID, "e2e: instructions")
	if r := waitRunEnds(ctx, t, pc, run.ID); r.Status != "succeeded" {
		t.Fatalf("run %+v\n%s", r, runLogText(ctx, pc, run.ID))
	}
	_, probe := runMounts(ctx, t, pc, run.ID)
	if probe.Read != notes || probe.ReadError != "" {
		t.Errorf("the agent read NOTES.md beside its instructions as %q (error %q), want %q", probe.Read, probe.ReadError, notes)
	}
}

// TestPaperclipAgentReadsItsCompanySkill: a skill made in the company's
// library through the real server and enabled for a claude_k8s agent is
// shown configured on the agent's skills (the adapter's syncSkills and
// listSkills), and its run reads the skill's SKILL.md at the path the
// prompt names, in the company's skills directory the pod mounts
// read-only. Paperclip's operational skill, enabled for every agent of a
// legacy adapter and bundled in the server's own install, which the pod
// does not see, is a warning in the run's log, and the run succeeds.
func TestPaperclipAgentReadsItsCompanySkill(t *testing.T) {
	t.Parallel() // a company of its own on the shared server
	pc := thePaperclip(t)
	ctx, company := paperclipOnTheRealNode(t, pc, 10*time.Minute, "Skills Co")
	const markdown = "---\nname: e2e-notes\ndescription: Notes for the release.\n---\n# Notes\nDeploy on Tuesdays only.\n"
	var skill struct{ Key string }
	if err := pc.Do(ctx, http.MethodPost, "/api/companies/"+company.ID+"/skills",
		map[string]any{"name": "e2e-notes", "slug": "e2e-notes", "markdown": markdown}, &skill); err != nil {
		t.Fatal(err)
	}
	if want := "company/" + company.ID + "/e2e-notes"; skill.Key != want {
		t.Fatalf("the skill's key is %q, want %q", skill.Key, want)
	}
	agent := newAgent(ctx, t, pc, company.ID, "Skilled", "claude_k8s", map[string]any{"promptTemplate": "lines=1 probe=1 skill=" + skill.Key}, nil)
	type snapshot struct {
		Entries []struct {
			Key, State string
			Desired    bool
		}
	}
	var synced snapshot
	if err := pc.Do(ctx, http.MethodPost, "/api/agents/"+agent.ID+"/skills/sync",
		map[string]any{"mode": "add", "desiredSkills": []string{skill.Key}}, &synced); err != nil {
		t.Fatal(err)
	}
	var listed snapshot
	if err := pc.Do(ctx, http.MethodGet, "/api/agents/"+agent.ID+"/skills", nil, &listed); err != nil {
		t.Fatal(err)
	}
	for what, snap := range map[string]snapshot{"sync": synced, "list": listed} {
		state := map[string]string{}
		for _, e := range snap.Entries {
			if e.Desired {
				state[e.Key] = e.State
			}
		}
		if state[skill.Key] != "configured" || state[operationalSkill] != "missing" {
			t.Errorf("the agent's skills (%s) are %v, want %s configured and %s missing (the pod does not see the server's install)", what, state, skill.Key, operationalSkill)
		}
	}
	run := wake(ctx, t, pc, agent.ID, "e2e: skills")
	if r := waitRunEnds(ctx, t, pc, run.ID); r.Status != "succeeded" {
		t.Fatalf("run %+v\n%s", r, runLogText(ctx, pc, run.ID))
	}
	_, probe := runMounts(ctx, t, pc, run.ID)
	if probe.Read != markdown || probe.ReadError != "" {
		t.Errorf("the agent read its skill's SKILL.md as %q (error %q), want %q\n%s", probe.Read, probe.ReadError, markdown, runLogText(ctx, pc, run.ID))
	}
	if log := runLogText(ctx, pc, run.ID); !strings.Contains(log, `[clipjob] Warning: skill "`+operationalSkill+`" is enabled for this agent but its files are unavailable in the run's pod`) {
		t.Errorf("no warning in the run's log of the operational skill the pod cannot read\n%s", log)
	}
}

// operationalSkill is Paperclip's skill for calling its API, enabled for
// every agent of a legacy adapter and bundled in the server's install.
const operationalSkill = "paperclipai/paperclip/paperclip"

// ownInstructionsDir is where Paperclip keeps agent's managed
// instructions, as pods and the server see it.
func ownInstructionsDir(company, agent string) string {
	return instanceRoot + "companies/" + company + "/agents/" + agent + "/instructions"
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
	resumeSecondRun(ctx, t, pc, first)
}

// resumeSecondRun wakes first's agent again, and holds the run to have
// resumed the session first ended with, and succeeded.
func resumeSecondRun(ctx context.Context, t *testing.T, pc *harness.Paperclip, first pcRun) {
	t.Helper()
	// Paperclip marks a run succeeded before it keeps the run's session
	// for the agent's next run (its heartbeat service: setRunStatus, then
	// updateRuntimeState); a wake in between starts a new session.
	waitSessionStored(ctx, t, pc, first.AgentID, first.ID)
	second := waitRunEnds(ctx, t, pc, wake(ctx, t, pc, first.AgentID, "e2e: the second run").ID)
	if second.Status != "succeeded" || second.SessionBefore != first.SessionAfter || second.SessionAfter != first.SessionAfter {
		t.Fatalf("the second run: session before %q after %q (status %s), want both %q\n%s",
			second.SessionBefore, second.SessionAfter, second.Status, first.SessionAfter, runLogText(ctx, pc, second.ID))
	}
}

// waitSessionStored waits until Paperclip keeps the session run left for
// the agent's next run: its runtime state names run as its last.
func waitSessionStored(ctx context.Context, t *testing.T, pc *harness.Paperclip, agentID, run string) {
	t.Helper()
	var state struct {
		LastRunID string `json:"lastRunId"`
		SessionID string `json:"sessionId"`
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := pc.Do(ctx, http.MethodGet, "/api/agents/"+agentID+"/runtime-state", nil, &state)
		return err == nil && state.LastRunID == run, nil
	})
	if err != nil {
		t.Fatalf("Paperclip never kept the session of run %s for the agent's next run: runtime state %+v", run, state)
	}
}
