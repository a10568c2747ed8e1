package realnode

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// The tier's longest test (a crashed server stays down over a minute)
// has this file to itself, named to sort before the other Paperclip
// tests: Go starts parallel tests in the order it finds them, and this
// one must start with the first or the tier waits on it.

// A restart of Paperclip mid-run: a graceful one (SIGTERM) deletes the
// interrupted run's Job; a crash (SIGKILL) leaves it, and the agent's next
// run finds it through clipjob's 409, asks Paperclip, which says the run is
// over, and deletes it. Either way the agent's next run runs.
//
// Both on one server of the test's own, one after the other (each ends
// with the server up again): a server's start (onboarding, its
// PostgreSQL, the adapter's install) costs the tier about twenty seconds
// of CPU, and the two cases side by side would save only the graceful
// one's twenty seconds of wall time.
func TestPaperclipRestartMidRun(t *testing.T) {
	t.Parallel() // it stops and starts a server of its own
	pc := ownPaperclip(t)
	for _, stop := range []string{"SIGTERM", "SIGKILL"} {
		t.Run(stop, func(t *testing.T) {
			ctx, company := paperclipOnTheRealNode(t, pc, 12*time.Minute, "Restart Co")
			agent := newAgent(ctx, t, pc, company.ID, "Long "+stop, "claude_k8s", map[string]any{"promptTemplate": "lines=1 sleep=600"}, nil)
			run := wake(ctx, t, pc, agent.ID, "e2e: a long run")
			waitRunStatus(ctx, t, pc, run.ID, "running")
			waitAgentJobs(ctx, t, agent.ID, 1)
			if stop == "SIGTERM" {
				pc.Stop()
				if got := agentJobs(ctx, t, agent.ID); len(got) != 0 {
					t.Errorf("after a graceful stop the interrupted run's Job is still there: %v", got)
				}
			} else {
				pc.Kill()
				if got := agentJobs(ctx, t, agent.ID); len(got) != 1 {
					t.Fatalf("a crash leaves the Job (nobody could delete it): %v", got)
				}
				// The server stays down over a minute, as after a crash
				// that needs someone: Paperclip's controller lease on the
				// run (60 s) has expired when it starts, so it marks the
				// run lost at once. (Back sooner, it marks it lost ~5
				// minutes after the run's last update; the agent's runs
				// are refused and retried until then.)
				time.Sleep(65 * time.Second)
			}
			if err := pc.Start(ctx); err != nil {
				t.Fatal(err)
			}
			old := waitRunEnds(ctx, t, pc, run.ID)
			t.Logf("after the %s restart Paperclip records the run %s (%s)", stop, old.Status, old.ErrorCode)
			if err := pc.Do(ctx, http.MethodPatch, "/api/agents/"+agent.ID, map[string]any{"adapterConfig": map[string]any{"promptTemplate": "lines=2"}}, nil); err != nil {
				t.Fatal(err)
			}
			next := wake(ctx, t, pc, agent.ID, "e2e: after the restart")
			done := waitRunEnds(ctx, t, pc, next.ID)
			if done.Status != "succeeded" {
				t.Fatalf("the agent's next run after a %s restart: %+v\n%s", stop, done, runLogText(ctx, pc, next.ID))
			}
			if stop == "SIGKILL" {
				if log := runLogText(ctx, pc, next.ID); !strings.Contains(log, "ended in Paperclip") {
					t.Errorf("the next run does not say it deleted the orphan:\n%s", log)
				}
			}
			if got := agentJobs(ctx, t, agent.ID); len(got) > 1 {
				t.Errorf("Jobs left: %v", got)
			}
		})
	}
}
