// Command demo is `make demo`: it starts a local control plane with a real
// node, deploys Paperclip there as operators do (its image as a
// Deployment, its home on a ReadWriteMany claim) and clipjob from its
// chart, wakes an agent through Paperclip's API, and shows its bare Job
// as clipjob completed it, its lines arriving in Paperclip's run log and
// the result Paperclip recorded (paperclip.go).
//
// With -bare it shows the bare-Job contract alone, Paperclip's side
// played by the demo: a stand-in Paperclip Deployment and claim, the
// webhooks run on this machine, examples/bare-job.yaml submitted, the Job
// and Pod as stored; then the log relay, the Job deleted as the TTL
// controller would, and the run's status, result and log the relay still
// serves. It runs on kwok too (CLIPJOB_E2E_NODE=kwok).
//
// With -keep it leaves everything running and prints how to reach it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/relay"
)

func main() {
	keep := flag.Bool("keep", false, "keep everything running until Ctrl-C")
	bare := flag.Bool("bare", false, "the bare-Job contract alone: no Paperclip server, the webhooks and relay on this machine")
	first := flag.Bool("first-run", false, "time the documented commands from helm install to an agent's first line in Paperclip's run log (docs/paperclip.md)")
	flag.Parse()
	// The chart is applied with controller-runtime's client, whose logs
	// are not this program's output.
	ctrllog.SetLogger(logr.Discard())
	var err error
	if *first {
		ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = firstRun(ctx)
		cancel()
	} else {
		err = run(*keep, *bare)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

func run(keep, bare bool) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	step("Starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)\n    and a real node (containerd, kubelet, kube-proxy; %s=kwok for none)", cluster.NodeEnv)
	fmt.Println("    The first run builds the Kubernetes binaries from the Go module proxy; that takes several minutes.")
	c, err := cluster.Start(ctx, cluster.Options{Log: os.Stdout, RealNode: cluster.WantRealNode()})
	if err != nil {
		return err
	}
	defer c.Stop()
	cs := c.Clientset()
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	fmt.Printf("    Kubernetes %s is up.\n", v.GitVersion)
	if !bare {
		return paperclipJourney(ctx, c, keep)
	}

	step("Installing a stand-in Paperclip (examples/paperclip.yaml: namespace, ReadWriteMany claim, Deployment),\n    building and starting clipjob-webhook, registering its webhook configurations")
	in, err := harness.InstallCluster(ctx, c, "webhook", "")
	if err != nil {
		return err
	}
	wh := in.Webhook
	defer wh.Stop()
	fmt.Printf("    Serving on https://%s, log %s\n", wh.Addr, wh.Log)

	example, err := os.ReadFile(filepath.Join(harness.Root(), "examples", "bare-job.yaml"))
	if err != nil {
		return err
	}
	step("Submitting the bare Job (examples/bare-job.yaml):")
	fmt.Print(indent(string(example)))
	set, err := manifest.Read(strings.NewReader(string(example)))
	if err != nil {
		return err
	}
	job := set.Jobs[0]
	if c.HasRealNode() {
		// The real node is tainted so that the suite's kwok tests stay off
		// it; Paperclip's own Jobs carry no placement.
		fmt.Printf("    (the demo adds a nodeSelector and toleration for the real node %s, where the\n"+
			"    Paperclip image is a fake agent; its prompt gains a word of that agent's script:\n"+
			"    print the API key it was given, as an agent that ran `env` would)\n", cluster.RealNodeName)
		job.Spec.Template.Spec.NodeSelector, job.Spec.Template.Spec.Tolerations = cluster.RealNodePlacement()
		job.Spec.Template.Annotations["paperclip.io/prompt"] += " leak=ANTHROPIC_API_KEY"
	}
	if _, err := cs.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the bare Job: %w", err)
	}

	stored, err := cs.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	step("The Job as the API server stored it (kubectl get job -n %s %s -o yaml):", job.Namespace, job.Name)
	stored.ManagedFields = nil
	stored.Status = batchv1.JobStatus{}
	y, err := manifest.JobYAML(stored)
	if err != nil {
		return err
	}
	fmt.Print(indent(string(y)))

	step("The Pod the Job controller made from it:")
	var pod *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job.Name})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return pod.Status.Phase != corev1.PodPending, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the agent pod: %w", err)
	}
	fmt.Printf("    pod %s: %s on %s\n", pod.Name, pod.Status.Phase, pod.Spec.NodeName)
	fmt.Printf("    image %s, user %d, egress profile %q; of claim %s it mounts only its own directories:\n",
		pod.Spec.Containers[0].Image, *pod.Spec.SecurityContext.RunAsUser,
		pod.Labels["paperclip.io/egress-profile"], claimOf(pod))
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.SubPath != "" {
			mode := "read-write"
			if m.ReadOnly {
				mode = "read-only"
			}
			fmt.Printf("      %s (%s)\n", m.MountPath, mode)
		}
	}

	r, err := showRelay(ctx, c, pod, job.Name)
	if err != nil {
		return err
	}
	defer r.Stop()

	if !keep {
		step("Done. Run `make demo DEMO_FLAGS=\"-bare -keep\"` to keep the cluster up and explore it with kubectl.")
		return nil
	}
	step("Still running. In another shell:")
	fmt.Printf("    export KUBECONFIG=%s\n    kubectl get jobs,pods -n paperclip\n    kubectl apply -f examples/bare-job.yaml   # admitted again: the first run finished\n", c.Kubeconfig)
	fmt.Printf("    The relay's API is at https://%s (cluster CA: %s/pki/ca.crt; token: kubectl create token paperclip-server -n paperclip --audience clipjob-relay)\n", r.APIAddr, c.Dir)
	fmt.Println("    Press Ctrl-C to stop.")
	<-ctx.Done()
	return nil
}

// agentLog is what a Claude Code run prints (stream-json); kwok has no
// containers, so the demo writes it into the pod's log for the agent.
var agentLog = []string{
	`{"type":"system","subtype":"init","session_id":"7c1e9d20-demo","model":"claude-sonnet-4-5"}`,
	`{"type":"assistant","message":{"content":[{"type":"text","text":"Running the tests in pkg/foo."}]}}`,
	`{"type":"user","message":{"content":[{"type":"tool_result","content":"ANTHROPIC_API_KEY=sk-ant-api03-demo0000000000000000000000"}]}}`,
	`{"type":"result","subtype":"success","is_error":false,"result":"Fixed the off-by-one in pkg/foo.","session_id":"7c1e9d20-demo","total_cost_usd":0.0871,"usage":{"input_tokens":812,"output_tokens":1290}}`,
}

// showRelay runs the log relay, lets the agent write and finish, deletes
// the Job as the TTL controller would, and shows what the relay kept.
func showRelay(ctx context.Context, c *cluster.Cluster, pod *corev1.Pod, job string) (_ *harness.Relay, err error) {
	if c.HasRealNode() {
		step("Starting clipjob-relay; it follows the agent container's log through the kubelet")
	} else {
		step("Starting clipjob-relay; the agent writes its stream-json log (kwok plays the container)")
	}
	bin, err := harness.Build(c.Dir, "clipjob-relay")
	if err != nil {
		return nil, err
	}
	r, err := harness.StartRelay(ctx, c, bin, "relay", pod.Namespace)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.Stop()
		}
	}()
	cs := c.Clientset()
	if !c.HasRealNode() {
		log, err := c.PodLog(ctx, pod.Namespace, pod.Name)
		if err != nil {
			return nil, err
		}
		if err := log.Write(agentLog...); err != nil {
			return nil, err
		}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"0"}}}`, cluster.AnnotationExitCode)
		if _, err := cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return nil, err
		}
	}
	token, err := harness.ServiceAccountToken(ctx, c, pod.Namespace, "paperclip-server", harness.LogReaderRules, relay.DefaultTokenAudience)
	if err != nil {
		return nil, err
	}
	run := pod.Labels["paperclip.io/run-id"]
	var status map[string]any
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := relayGET(c, r, token, "/v1/runs/"+run)
		if err != nil {
			return false, nil
		}
		status = map[string]any{}
		return json.Unmarshal(body, &status) == nil && status["done"] == true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the relay to collect the run: %w", err)
	}
	step("The run finished; deleting Job %s the way the TTL controller does (pods first)", job)
	if err := cs.BatchV1().Jobs(pod.Namespace).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		return nil, err
	}
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	step("What the relay still serves (GET /v1/runs/%s, with a ServiceAccount token that may get pods/log):", run)
	body, err := relayGET(c, r, token, "/v1/runs/"+run)
	if err != nil {
		return nil, err
	}
	var pretty bytes.Buffer
	_ = json.Indent(&pretty, body, "", "  ")
	fmt.Print(indent(pretty.String()))
	step("Its log (GET /v1/runs/%s/log; note the API key redacted before storage):", run)
	logBody, err := relayGET(c, r, token, "/v1/runs/"+run+"/log")
	if err != nil {
		return nil, err
	}
	fmt.Print(indent(string(logBody)))
	return r, nil
}

func relayGET(c *cluster.Cluster, r *harness.Relay, token, path string) ([]byte, error) {
	req, _ := http.NewRequest(http.MethodGet, "https://"+r.APIAddr+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.CA.HTTPClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s %s", path, resp.Status, body)
	}
	return body, err
}

func claimOf(p *corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return "none"
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "    " + strings.Join(lines, "\n    ") + "\n"
}
