package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
)

// What a test does with agent runs in an install's namespace. Each
// helper fails the test it is given, naming what it waited for.

// CS is the cluster's admin clientset.
func (in *Install) CS() kubernetes.Interface { return in.c.Clientset() }

// Cluster is the cluster the install is in.
func (in *Install) Cluster() *cluster.Cluster { return in.c }

// ConfigFile is the config the install's replicas were started with.
func (in *Install) ConfigFile() string { return in.configFile }

// BareJob is examples/bare-job.yaml in the install's namespace with its
// own name and agent, so runs of one test do not collide.
func (in *Install) BareJob(t testing.TB, name string) *batchv1.Job {
	t.Helper()
	job, err := in.bareJob(name)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func (in *Install) bareJob(name string) (*batchv1.Job, error) {
	set, err := readExample("examples/bare-job.yaml")
	if err != nil {
		return nil, err
	}
	job := set.Jobs[0]
	job.Name, job.Namespace = name, in.Namespace
	job.Labels[contract.LabelAgentID] = "agent-" + name
	job.Labels[contract.LabelRunID] = name
	return job, nil
}

// AgentRun creates a bare agent Job (BareJob) named name, waits for its
// pod to run and points the pod's log at a file the caller writes.
func (in *Install) AgentRun(ctx context.Context, name string) (*corev1.Pod, *cluster.PodLog, error) {
	job, err := in.bareJob(name)
	if err != nil {
		return nil, nil, err
	}
	if _, err := in.CS().BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		return nil, nil, err
	}
	pod, err := in.RunPod(ctx, name, Running)
	if err != nil {
		return nil, nil, err
	}
	log, err := in.c.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		return nil, nil, err
	}
	return pod, log, nil
}

// CreateJob creates job in the install's namespace or fails the test.
func (in *Install) CreateJob(ctx context.Context, t testing.TB, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	created, err := in.CS().BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Job %s: %v", job.Name, err)
	}
	return created
}

// Job reads a Job of the install's namespace or fails the test.
func (in *Install) Job(ctx context.Context, t testing.TB, name string) *batchv1.Job {
	t.Helper()
	j, err := in.CS().BatchV1().Jobs(in.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading Job %s: %v", name, err)
	}
	return j
}

// AssertNoJob fails the test if Job name was stored.
func (in *Install) AssertNoJob(ctx context.Context, t testing.TB, name string) {
	t.Helper()
	if _, err := in.CS().BatchV1().Jobs(in.Namespace).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Job %s was stored: %v", name, err)
	}
}

// WaitPod waits for a pod of Job job for which ready holds.
func (in *Install) WaitPod(ctx context.Context, t testing.TB, job string, ready func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	pod, err := in.RunPod(ctx, job, ready)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// RunPod is WaitPod outside a test.
func (in *Install) RunPod(ctx context.Context, job string, ready func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := in.CS().CoreV1().Pods(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return ready(pod), nil
	})
	if err != nil {
		return pod, fmt.Errorf("pod of Job %s: %w (last seen: %s)", job, err, PodSummary(pod))
	}
	return pod, nil
}

// Running is WaitPod's condition for a running pod.
func Running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

// PodSummary is a pod's phase and node, for failure messages.
func PodSummary(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return string(p.Status.Phase) + " " + p.Spec.NodeName
}

// FinishRun makes kwok end the Job's pod with exitCode and waits for the
// Job controller to mark the Job finished.
func (in *Install) FinishRun(ctx context.Context, t testing.TB, job, exitCode string) {
	t.Helper()
	if err := in.EndRun(ctx, job, exitCode); err != nil {
		t.Fatal(err)
	}
}

// EndRun is FinishRun outside a test.
func (in *Install) EndRun(ctx context.Context, job, exitCode string) error {
	pod, err := in.RunPod(ctx, job, Running)
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, cluster.AnnotationExitCode, exitCode)
	if _, err := in.CS().CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := in.CS().BatchV1().Jobs(in.Namespace).Get(ctx, job, metav1.GetOptions{})
		return err == nil && claim.Finished(j), nil
	})
	if err != nil {
		return fmt.Errorf("Job %s did not finish: %w", job, err)
	}
	return nil
}

// WaitJobEnded waits for the Job's Complete or Failed condition.
func (in *Install) WaitJobEnded(ctx context.Context, t testing.TB, name string, timeout time.Duration) *batchv1.Job {
	t.Helper()
	var job *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		job, err = in.CS().BatchV1().Jobs(in.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && claim.Finished(job), nil
	})
	if err != nil {
		pod := in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
		t.Fatalf("Job %s did not end: %v; pod %s; kubelet log %s", name, err, PodSummary(pod), in.c.LogFile("kubelet"))
	}
	return job
}

// JobFailed reports whether a Job has failed.
func JobFailed(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Suspended reports whether a Job waits in the queue.
func Suspended(j *batchv1.Job) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }

// WaitStarted waits until the claim controller has unsuspended the Job.
func (in *Install) WaitStarted(ctx context.Context, t testing.TB, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := in.CS().BatchV1().Jobs(in.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && !Suspended(j), nil
	})
	if err != nil {
		t.Fatalf("queued run %s was not started", name)
	}
}

// AssertWaiting fails the test for each named run that is not suspended.
func (in *Install) AssertWaiting(ctx context.Context, t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		j, err := in.CS().BatchV1().Jobs(in.Namespace).Get(ctx, n, metav1.GetOptions{})
		if err != nil || !Suspended(j) {
			t.Errorf("run %s should still wait (suspended); err %v", n, err)
		}
	}
}

// ClientAs is a client of ServiceAccount name in the install's
// namespace, allowed verbs on Jobs there and nothing else.
func (in *Install) ClientAs(ctx context.Context, t testing.TB, name string, verbs ...string) kubernetes.Interface {
	t.Helper()
	token, err := ServiceAccountToken(ctx, in.c, in.Namespace, name, []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: verbs}})
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(in.c.Config)
	rc.BearerToken = token
	return kubernetes.NewForConfigOrDie(rc)
}

// Configz is what a webhook's /configz says of its config.
type Configz struct {
	Hash    string `json:"hash"`
	Refused string `json:"refused"`
}

// Configz reads the webhook's /configz or fails the test.
func (w *Webhook) Configz(t testing.TB) Configz {
	t.Helper()
	body, err := w.Get("/configz")
	if err != nil {
		t.Fatal(err)
	}
	var z Configz
	if err := json.Unmarshal([]byte(body), &z); err != nil {
		t.Fatalf("/configz: %v: %s", err, body)
	}
	return z
}

// WriteConfig replaces the first replica's config file and waits until it
// has looked at it: applied, or refused when applied is false.
func (in *Install) WriteConfig(ctx context.Context, t testing.TB, content string, applied bool) Configz {
	t.Helper()
	return in.Webhook.WriteConfig(ctx, t, content, applied)
}

// WriteConfig replaces the replica's config file and waits until it has
// looked at it: applied, or refused when applied is false.
func (w *Webhook) WriteConfig(ctx context.Context, t testing.TB, content string, applied bool) Configz {
	t.Helper()
	before := w.Configz(t)
	// Whole or not at all, as the kubelet updates a ConfigMap's files: a
	// poll between a truncate and a write read an empty file, and its
	// refusal was taken for the one the test asked for.
	tmp := w.ConfigFile + ".next"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, w.ConfigFile); err != nil {
		t.Fatal(err)
	}
	var z Configz
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		z = w.Configz(t)
		if applied {
			return z.Hash != before.Hash && z.Refused == "", nil
		}
		return z.Refused != "" && z.Refused != before.Refused, nil
	})
	if err != nil {
		t.Fatalf("webhook did not pick up the config (applied=%v): %+v", applied, z)
	}
	return z
}

// Config is the config file the first replica serves now.
func (in *Install) Config(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(in.Webhook.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Dir is a directory of the install's own for a test's files.
func (in *Install) Dir() string { return filepath.Join(in.c.Dir, in.Namespace) }

// LoadConfig is the config the first replica serves now, decoded.
func (in *Install) LoadConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.Load(in.Webhook.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Replicas are the install's running replicas: the first and those
// StartReplicas added.
func (in *Install) Replicas() []*Webhook {
	var out []*Webhook
	for _, w := range append([]*Webhook{in.Webhook}, in.extra...) {
		if w != nil && w.Running() {
			out = append(out, w)
		}
	}
	return out
}

// StartReplicas runs n replicas (the first and n-1 more) behind a
// balancer, registers the balancer for the rest of t with values over the
// suite's chart values, and waits until the API server's calls reach the
// new replicas. It returns their addresses, the first's first.
func (in *Install) StartReplicas(ctx context.Context, t testing.TB, n int, values map[string]any) []string {
	t.Helper()
	replicas := []string{in.Webhook.Addr}
	var added []*Webhook
	for i := 1; i < n; i++ {
		wh, err := in.StartReplica(ctx, in.name(fmt.Sprintf("webhook-%d", len(in.extra)+1)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wh.Stop)
		replicas = append(replicas, wh.Addr)
		in.extra = append(in.extra, wh)
		added = append(added, wh)
	}
	lb, err := StartBalancer(replicas...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Stop)
	if err := in.Register(ctx, RegisterOptions{Addr: lb.Addr, Values: values}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Register(context.Background(), RegisterOptions{}) })
	// Dry runs (no claims written) until a new replica answers one. The
	// probe brings its own container, so a compiled policy leaves it to
	// the mutating webhook whatever the registration.
	probe := in.BareJob(t, "replica-probe")
	probe.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	probe.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Command: []string{"claude"}}}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, _ = in.CS().BatchV1().Jobs(in.Namespace).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		var n float64
		for _, w := range added {
			v, _ := w.Counter(`clipjob_admission_requests_total{dry_run="true",`)
			n += v
		}
		return n > 0 || len(added) == 0, nil
	})
	if err != nil {
		t.Fatal("the API server never called the new replicas through the balancer")
	}
	return replicas
}

// RestoreConfigAfter returns the config the first replica serves and puts
// it back when t ends, waiting until it is served again: for tests that
// share an install (the real-node tier's).
func (in *Install) RestoreConfigAfter(t testing.TB) string {
	t.Helper()
	original := in.Config(t)
	t.Cleanup(func() {
		if now, err := os.ReadFile(in.Webhook.ConfigFile); err == nil && string(now) == original {
			return
		}
		in.WriteConfig(context.Background(), t, original, true)
	})
	return original
}
