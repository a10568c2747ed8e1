package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// FirstRunCommands are an operator's commands from `helm install` to an
// agent's first line in Paperclip's run log, as docs/paperclip.md ("From
// helm install to a first run") gives them; `make first-run` runs exactly
// these (firstrun_test.go holds the docs to them).
//
// Paperclip's manifest comes first: the server's pod starts (and begins
// making its database) while clipjob installs, and `kubectl exec` does not
// wait for a container to start, only for a pod to exist, so the pod
// must run by the third command.
var FirstRunCommands = []string{
	"kubectl apply -f examples/paperclip-in-cluster.yaml",
	"helm install clipjob ./charts/clipjob -n clipjob-system --create-namespace -f examples/paperclip-in-cluster-values.yaml --wait",
	"kubectl -n paperclip exec deploy/paperclip -- clipjob-paperclip-first-run",
}

// firstRun measures FirstRunCommands on a cluster as an operator has it:
// one real node, untainted, and no fake one; a DNS server for Services;
// storage for the relay's and Paperclip's claims; clipjob's and
// Paperclip's images on the node. Only then does the clock start: it
// stops at the first agent line the last command prints from Paperclip's
// run log.
func firstRun(ctx context.Context) error {
	helm, err := output(ctx, "bash", filepath.Join(harness.Root(), "hack", "helm.sh"))
	if err != nil {
		return fmt.Errorf("hack/helm.sh: %w", err)
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		return fmt.Errorf("kubectl: %w", err)
	}
	step("Starting a cluster with one real node and DNS for Services")
	c, err := cluster.Start(ctx, cluster.Options{Log: io.Discard, RealNode: true, ClusterDNS: true})
	if err != nil {
		return err
	}
	defer c.Stop()
	cs := c.Clientset()
	// The real node alone, open to every pod, as a cluster's node is.
	if err := cs.CoreV1().Nodes().Delete(ctx, cluster.NodeName, metav1.DeleteOptions{}); err != nil {
		return err
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, cluster.RealNodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var taints []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != cluster.RealNodeTaint {
			taints = append(taints, t)
		}
	}
	node.Spec.Taints = taints
	if _, err := cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return err
	}
	step("Loading clipjob's and Paperclip's images into the node (the first run builds Paperclip's)")
	began := time.Now()
	if _, err := harness.LoadClipjobImage(ctx, c); err != nil {
		return err
	}
	ref, err := harness.LoadPaperclipImage(ctx, c)
	if err != nil {
		return err
	}
	if want, err := manifestImage(); err != nil || want != ref {
		return fmt.Errorf("examples/paperclip-in-cluster.yaml runs %q, the image loaded is %s (%v)", want, ref, err)
	}
	fmt.Printf("    %s and %s in %s\n", "clipjob", ref, time.Since(began).Round(time.Second))
	// The storage a cluster provides: a volume for each claim, as a
	// provisioner would make (the relay's store, uid 65532; Paperclip's
	// home, ReadWriteMany, uid 1000, setgid as an NFS export for it).
	for _, v := range []struct {
		name, ns, claim string
		mode            corev1.PersistentVolumeAccessMode
		uid, gid        int
		perm            os.FileMode
	}{
		{"clipjob-relay-store", "clipjob-system", "clipjob-relay", corev1.ReadWriteOnce, 65532, 65532, 0o755},
		{"paperclip-home", "paperclip", "paperclip-home", corev1.ReadWriteMany, harness.SharedUID, harness.SharedGID, 0o775 | os.ModeSetgid},
	} {
		dir := filepath.Join(c.Dir, v.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.Chown(dir, v.uid, v.gid); err != nil {
			return err
		}
		if err := os.Chmod(dir, v.perm); err != nil {
			return err
		}
		if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, harness.HostPathVolume(v.name, dir, v.mode, v.ns, v.claim), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	load := loadAverage()
	step("The documented commands, timed (load average before: %s)", load)
	env := append(os.Environ(), "KUBECONFIG="+c.Kubeconfig,
		"PATH="+filepath.Dir(helm)+string(os.PathListSeparator)+filepath.Dir(kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	start := time.Now()
	var first time.Duration
	var took []time.Duration
	for i, command := range FirstRunCommands {
		fmt.Printf("\n    $ %s\n", command)
		began := time.Now()
		cmd := exec.CommandContext(ctx, "sh", "-c", command)
		cmd.Dir, cmd.Env, cmd.Stderr = harness.Root(), env, os.Stdout
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if first == 0 && i == len(FirstRunCommands)-1 && agentLine(line) {
				first = time.Since(start)
				fmt.Printf("    %6.1fs  ", first.Seconds())
			} else {
				fmt.Print("             ")
			}
			fmt.Println(line)
		}
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("%s: %w", command, err)
		}
		took = append(took, time.Since(began))
		fmt.Printf("    (%s)\n", took[i].Round(100*time.Millisecond))
	}
	if first == 0 {
		return fmt.Errorf("the last command printed no agent line")
	}
	step("From the first command to the agent's first line in Paperclip's run log: %s, %d commands", first.Round(100*time.Millisecond), len(FirstRunCommands))
	for i, command := range FirstRunCommands {
		fmt.Printf("    %6.1fs  %s\n", took[i].Seconds(), command)
	}
	fmt.Printf("    %d cores; load average before %s, after %s; %s\n", runtime.NumCPU(), load, loadAverage(), time.Now().Format("2006-01-02"))
	return nil
}

// agentLine says whether line, as clipjob-paperclip-first-run prints a
// record of the run's log, is the agent's: its output, not the notes
// Paperclip ("[paperclip] …") and the adapter ("[clipjob] …") write into
// the same log before the agent starts.
func agentLine(line string) bool {
	chunk, ok := strings.CutPrefix(line, "stdout: ")
	return ok && agentChunk("stdout", chunk)
}

// agentChunk says whether a record of a run's log is the agent's output.
func agentChunk(stream, chunk string) bool {
	return stream == "stdout" && !strings.HasPrefix(chunk, "[paperclip]") && !strings.HasPrefix(chunk, "[clipjob]")
}

// manifestImage is the Paperclip image examples/paperclip-in-cluster.yaml runs.
func manifestImage() (string, error) {
	objs, err := readFirstRunManifest()
	if err != nil {
		return "", err
	}
	return objs.deployment.Spec.Template.Spec.Containers[0].Image, nil
}

// loadAverage is the machine's load average, to stand beside a figure.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Stderr = harness.Root(), os.Stderr
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}
