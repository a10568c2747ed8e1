package realnode

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/ociimage"
)

// TestPaperclipInTheCluster: Paperclip as operators deploy it. The image
// `make paperclip-image` builds runs as the Paperclip Deployment, with its
// home on a ReadWriteMany claim at /paperclip and its own ServiceAccount
// bound to the Role of the adapter's README; the image's entrypoint
// registers clipjob's adapter. clipjob is installed from its chart (a
// release of its own, for this namespace), with that Deployment as the
// source it completes agent Jobs from; the adapter reaches the API server
// with the pod's ServiceAccount and the chart's relay through its Service
// with a projected token, trusting clipjob's CA copied beside the server
// as the README says. Agents of both types run through the server's API,
// and what Paperclip records is the agents': status, lines in order,
// cost, session, the second run resuming the first's session from the
// agent's home on the claim, and an OpenCode agent's comment on the issue
// it was assigned.
func TestPaperclipInTheCluster(t *testing.T) {
	t.Parallel() // namespaces, a release and a server of its own
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }

	// The namespace Paperclip and its agents run in: the suite's install,
	// registered for every namespace, leaves it, as the chart's
	// webhook.excludeNamespaces does.
	const ns = "paperclip-in-cluster"
	if err := suite.in.ExcludeNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d, err := harness.DeployPaperclip(ctx, suite.cluster, ns, charts.Release{Name: "clipjob-pc", Namespace: "clipjob-pc-system"}, nil, step)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(d.ServerLogs(context.Background()))
		}
		d.Close()
	})
	pc, home, image, claim, serviceAccount := d.Server, d.Home, d.Image, d.Claim, d.ServiceAccount
	cs := suite.cs

	// Loaded at start, registered by the image's entrypoint.
	checkAdaptersLoaded(ctx, t, pc, "the image's start")
	// Its home is the claim: the embedded PostgreSQL and the adapters'
	// records are on the volume.
	for _, f := range []string{"instances/default/db/PG_VERSION", "adapter-plugins.json"} {
		if _, err := os.Stat(filepath.Join(home, f)); err != nil {
			t.Errorf("Paperclip's home on the claim lacks %s: %v", f, err)
		}
	}

	run, first := runFirstAgent(ctx, t, pc, "Acme in the cluster", "lines=6 rate=20 probe=1 (agent {{agent.name}})")
	step("the first run succeeded")
	// In the agent's pod: Paperclip's callback token for the run, signed
	// with the server's secret, and not the secret itself (the server's
	// env, which clipjob inherits from, has it); the run's own
	// directories of the home, not the home.
	mounts, probe := runMounts(ctx, t, pc, run.ID)
	if !slices.Contains(probe.Env, "PAPERCLIP_API_KEY") || slices.Contains(probe.Env, "PAPERCLIP_AGENT_JWT_SECRET") {
		t.Errorf("the agent's env names %v: want PAPERCLIP_API_KEY (the run's token), not PAPERCLIP_AGENT_JWT_SECRET (the server's)", probe.Env)
	}
	for m := range mounts {
		if m == ociimage.PaperclipHome || strings.HasPrefix(m, instanceRoot+"db") {
			t.Errorf("the agent's pod mounts %s of Paperclip's home (mounts %v)", m, mounts)
		}
	}
	// The run's Job, completed from the running Deployment: its image, its
	// claim, Paperclip's workspace for the agent on it as the working
	// directory, created by the server's ServiceAccount.
	jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + run.ID})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("the run's Jobs: %d, %v; want one", len(jobs.Items), err)
	}
	job := jobs.Items[0]
	if got := job.Spec.Template.Spec.Containers[0].Image; got != image {
		t.Errorf("the run's Job runs %s; want the Paperclip Deployment's image %s", got, image)
	}
	if got := job.Annotations[contract.AnnotationSource]; !strings.HasPrefix(got, ns+"/paperclip ") {
		t.Errorf("the run's Job was completed from %q; want the Deployment %s/paperclip", got, ns)
	}
	if got, want := job.Annotations[contract.AnnotationCreatedBy], "system:serviceaccount:"+ns+":"+serviceAccount; got != want {
		t.Errorf("the run's Job was created by %q; want the server's ServiceAccount %s", got, want)
	}
	if got, want := job.Annotations[contract.AnnotationWorkingDir], instanceRoot+"workspaces/"+first.AgentID; got != want {
		t.Errorf("the run's working directory: %q; want Paperclip's workspace of the agent on the claim, %s", got, want)
	}
	claims := 0
	for _, v := range job.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			if v.PersistentVolumeClaim.ClaimName != claim {
				t.Errorf("the run's pod mounts claim %s; want only Paperclip's home, %s", v.PersistentVolumeClaim.ClaimName, claim)
			}
			claims++
		}
	}
	if claims == 0 {
		t.Errorf("the run's pod mounts no part of Paperclip's home (volumes %v)", job.Spec.Template.Spec.Volumes)
	}

	// The agent's second run resumes the session the first left in the
	// agent's home on the claim.
	agentHome := filepath.Join(home, "instances", "default", "companies", job.Labels[contract.LabelCompanyID], "agents", first.AgentID, "home")
	if _, err := os.Stat(filepath.Join(agentHome, ".fakeagent", "sessions", first.SessionAfter)); err != nil {
		t.Errorf("the first run's session is not in the agent's home on the claim: %v", err)
	}
	resumeSecondRun(ctx, t, pc, first)
	step("the second run resumed the first's session")

	// An OpenCode agent, woken by the issue it is assigned, comments its
	// final message on it.
	workAnIssue(ctx, t, pc, job.Labels[contract.LabelCompanyID])
	step("the OpenCode agent commented on its issue")
}
