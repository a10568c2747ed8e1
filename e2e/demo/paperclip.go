package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// The namespace Paperclip and its agents run in, and clipjob's release.
const demoNamespace = "paperclip"

var demoRelease = charts.Release{Name: "clipjob", Namespace: "clipjob-system"}

// paperclipJourney is what a Paperclip operator sees: Paperclip in the
// cluster with its home on a ReadWriteMany claim, clipjob installed from
// its chart, an agent woken through Paperclip's API, its bare Job
// completed by the webhook, its pod running, its lines arriving in
// Paperclip's run log and its result recorded.
func paperclipJourney(ctx context.Context, c *cluster.Cluster, keep bool) error {
	if !c.HasRealNode() {
		return fmt.Errorf("Paperclip in the cluster needs the real node (unset %s, or run `make demo DEMO_FLAGS=-bare` for the bare Job alone on kwok)", cluster.NodeEnv)
	}
	step("Deploying Paperclip and clipjob into the cluster. The first run builds Paperclip's image\n" +
		"    (Node.js 24, the paperclipai package, clipjob's adapter, a fake agent CLI): a few minutes.")
	start := time.Now()
	// As on a cluster whose network plugin enforces NetworkPolicies: the
	// chart's agent egress policy then holds, as the Job shown below says.
	if err := c.EnforceNetworkPolicy(ctx); err != nil {
		return err
	}
	fmt.Printf("    %5.1fs  NetworkPolicies are enforced on the node (kube-router's policy controller): agent pods reach only what their egress profile allows\n", time.Since(start).Seconds())
	d, err := harness.DeployPaperclip(ctx, c, demoNamespace, demoRelease, nil, func(what string) {
		fmt.Printf("    %5.1fs  %s\n", time.Since(start).Seconds(), what)
	})
	if err != nil {
		return err
	}
	defer d.Close()
	pc := d.Server

	step("Making a company and a claude_k8s agent through Paperclip's API (as its board does)")
	company, err := pc.NewCompany(ctx, "Demo Robotics")
	if err != nil {
		return err
	}
	// The image's agent CLIs are the fake agent: its prompt is its script.
	agent, err := pc.NewAgent(ctx, company.ID, map[string]any{"name": "Builder", "adapterType": "claude_k8s",
		"adapterConfig": map[string]any{"promptTemplate": "lines=6 rate=3 (the demo's agent, {{agent.name}})"}})
	if err != nil {
		return err
	}
	fmt.Printf("    company %s, agent %s (%s)\n", company.ID, agent.ID, agent.Name)

	step("Waking the agent (POST /api/agents/%s/wakeup, the board's \"Run now\")", agent.ID)
	woken := time.Now()
	run, err := pc.Wake(ctx, agent.ID, "make demo")
	if err != nil {
		return err
	}
	fmt.Printf("    Paperclip queued run %s; its adapter submits a bare Job labeled %s=%s\n", run.ID, contract.LabelAgentID, agent.ID)

	job, err := waitRunJob(ctx, c, run.ID)
	if err != nil {
		return err
	}
	step("The Job as the API server stored it, completed by clipjob's webhook (kubectl get job -n %s %s):", demoNamespace, job.Name)
	pod := job.Spec.Template.Spec
	fmt.Printf("    completed from:  %s\n", job.Annotations[contract.AnnotationSource])
	fmt.Printf("    profile:         %s\n", job.Annotations[contract.AnnotationProfile])
	fmt.Printf("    image:           %s (the Paperclip Deployment's)\n", pod.Containers[0].Image)
	fmt.Printf("    working dir:     %s\n", job.Annotations[contract.AnnotationWorkingDir])
	if sc := pod.Containers[0].SecurityContext; sc != nil && sc.RunAsUser != nil {
		fmt.Printf("    runs as:         uid %d, read-only root %v, capabilities dropped %v\n", *sc.RunAsUser, *sc.ReadOnlyRootFilesystem, sc.Capabilities.Drop)
	}
	fmt.Printf("    of Paperclip's home (claim %s) it mounts only its own directories:\n", d.Claim)
	for _, m := range pod.Containers[0].VolumeMounts {
		if m.SubPath != "" {
			mode := "read-write"
			if m.ReadOnly {
				mode = "read-only"
			}
			fmt.Printf("      %s (%s)\n", m.MountPath, mode)
		}
	}

	step("The agent's lines, as they arrive in Paperclip's run log (GET /api/heartbeat-runs/%s/log):", run.ID)
	seen, first := 0, time.Duration(0)
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		lines, err := pc.RunLog(ctx, run.ID)
		if err != nil {
			return false, nil
		}
		for _, l := range lines[min(seen, len(lines)):] {
			if first == 0 && agentChunk(l.Stream, l.Chunk) {
				first = time.Since(woken)
			}
			fmt.Printf("    %-6s %s\n", l.Stream, strings.TrimRight(truncate(l.Chunk, 160), "\n"))
		}
		seen = max(seen, len(lines))
		run, err = pc.Run(ctx, run.ID)
		return err == nil && run.Ended(), nil
	})
	if err != nil {
		return fmt.Errorf("run %s did not end: %w (last %+v)", run.ID, err, run)
	}
	step("Paperclip recorded the run: %s, cost $%v, session %s", run.Status, run.UsageJSON["costUsd"], run.SessionAfter)
	fmt.Printf("    from the wake to the agent's first line in Paperclip's run log: %s\n", first.Round(10*time.Millisecond))
	if run.Status != "succeeded" {
		return fmt.Errorf("the run %s: %s %s", run.ID, run.Status, run.Error)
	}

	if !keep {
		step("Done. `make demo DEMO_FLAGS=-keep` keeps it all running to look around.")
		return nil
	}
	step("Still running. In another shell:")
	fmt.Printf("    export KUBECONFIG=%s\n", c.Kubeconfig)
	fmt.Printf("    kubectl get deploy,pods,jobs -n %s; kubectl get pods -n %s\n", demoNamespace, demoRelease.Namespace)
	fmt.Printf("    curl -s %s/api/companies/%s/agents     # Paperclip's API (a port-forward to its pod)\n", pc.URL, company.ID)
	fmt.Printf("    curl -s -X POST -H 'Content-Type: application/json' -d '{\"source\":\"on_demand\"}' %s/api/agents/%s/wakeup\n", pc.URL, agent.ID)
	fmt.Printf("    Paperclip's home is %s on this machine (the claim's volume).\n", d.Home)
	fmt.Println("    Press Ctrl-C to stop.")
	<-ctx.Done()
	return nil
}

// waitRunJob waits until run's Job is stored, and returns it.
func waitRunJob(ctx context.Context, c *cluster.Cluster, run string) (*batchv1.Job, error) {
	var job *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		jobs, err := c.Clientset().BatchV1().Jobs(demoNamespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + run})
		if err != nil || len(jobs.Items) == 0 {
			return false, nil
		}
		job = &jobs.Items[0]
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no Job of run %s in %s: %w", run, demoNamespace, err)
	}
	return job, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
