// Command demo is `make demo`: it starts a local control plane, runs the
// clipjob webhook against it, installs a stand-in Paperclip (Deployment and
// ReadWriteMany claim), submits examples/bare-job.yaml and prints the Job
// the API server stored and the Pod made from it.
//
// With -keep it leaves everything running and prints how to reach it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/manifest"
)

func main() {
	keep := flag.Bool("keep", false, "keep the control plane and webhook running until Ctrl-C")
	flag.Parse()
	if err := run(*keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

func run(keep bool) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	step("Starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)")
	fmt.Println("    The first run builds the Kubernetes binaries from the Go module proxy; that takes several minutes.")
	c, err := cluster.Start(ctx, cluster.Options{Log: os.Stdout})
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

	step("Installing a stand-in Paperclip (examples/paperclip.yaml: namespace, ReadWriteMany claim, Deployment),\n    building and starting clipjob-webhook, registering its webhook configurations")
	wh, _, err := harness.Install(ctx, c, "webhook")
	if err != nil {
		return err
	}
	defer wh.Stop()
	fmt.Printf("    Serving on https://%s, log %s\n", wh.Addr, wh.Log)

	bare, err := os.ReadFile(filepath.Join(harness.Root(), "examples", "bare-job.yaml"))
	if err != nil {
		return err
	}
	step("Submitting the bare Job (examples/bare-job.yaml):")
	fmt.Print(indent(string(bare)))
	set, err := manifest.Read(strings.NewReader(string(bare)))
	if err != nil {
		return err
	}
	job := set.Jobs[0]
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

	step("The Pod the Job controller made from it, scheduled to the kwok node:")
	var pod *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job.Name})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return pod.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the agent pod: %w", err)
	}
	fmt.Printf("    pod %s: %s on %s\n", pod.Name, pod.Status.Phase, pod.Spec.NodeName)
	fmt.Printf("    image %s, user %d, egress profile %q, claim %s at %s\n",
		pod.Spec.Containers[0].Image, *pod.Spec.SecurityContext.RunAsUser,
		pod.Labels["paperclip.io/egress-profile"], claimOf(pod), "/paperclip")

	if !keep {
		step("Done. Run `make demo DEMO_FLAGS=-keep` to keep the cluster up and explore it with kubectl.")
		return nil
	}
	step("Still running. In another shell:")
	fmt.Printf("    export KUBECONFIG=%s\n    kubectl get jobs,pods -n paperclip\n    kubectl get job -n paperclip %s -o yaml\n", c.Kubeconfig, job.Name)
	fmt.Println("    Press Ctrl-C to stop.")
	<-ctx.Done()
	return nil
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
