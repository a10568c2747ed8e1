package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/testing/golden"
)

const ns = "paperclip"

// bareJob is examples/bare-job.yaml with its own name and agent, so tests
// do not collide.
func bareJob(t *testing.T, name string) *batchv1.Job {
	t.Helper()
	job := golden.ReadManifests(t, filepath.Join(harness.Root(), "examples", "bare-job.yaml")).Jobs[0]
	job.Name = name
	job.Labels[contract.LabelAgentID] = "agent-" + name
	job.Labels[contract.LabelRunID] = name
	return job
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func waitPod(ctx context.Context, t *testing.T, job string, ready func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return ready(pod), nil
	})
	if err != nil {
		t.Fatalf("pod of Job %s: %v (last seen: %+v)", job, err, podSummary(pod))
	}
	return pod
}

func podSummary(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return string(p.Status.Phase) + " " + p.Spec.NodeName
}

func envNames(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// TestBareJobBecomesARunningAgentPod submits the README's bare Job and
// follows it through the API server, the Job controller, the scheduler and
// kwok: the stored Job and the Pod made from it carry everything inherited

func equalYAML(t *testing.T, a, b any) bool {
	t.Helper()
	x, _ := yaml.Marshal(a)
	y, _ := yaml.Marshal(b)
	return bytes.Equal(x, y)
}

// startReplicas runs n webhook replicas (the suite's own and n-1 more)
// behind a balancer, registers the balancer for the rest of t, and waits
// until the API server's calls reach the new replicas. It returns their
// addresses, the suite's first.
func startReplicas(ctx context.Context, t *testing.T, n int) []string {
	t.Helper()
	return startReplicasRegistered(ctx, t, n, harness.Register)
}

// startReplicasRegistered is startReplicas with the webhooks registered at
// the balancer by register (harness.RegisterForCompiledPolicies, say).
func startReplicasRegistered(ctx context.Context, t *testing.T, n int, register func(context.Context, kubernetes.Interface, string, []byte) error) []string {
	t.Helper()
	replicas := []string{env.webhook.Addr}
	for i := 1; i < n; i++ {
		wh, err := harness.StartWebhook(ctx, env.cluster, env.webhookBin, fmt.Sprintf("webhook-%d", i), harness.Root()+"/examples/config.yaml")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wh.Stop)
		replicas = append(replicas, wh.Addr)
		env.extra = append(env.extra, wh)
	}
	lb, err := harness.StartBalancer(replicas...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Stop)
	if err := register(ctx, env.cs, lb.Addr, env.cluster.CA.CertPEM); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = harness.Register(context.Background(), env.cs, env.webhookAddr, env.cluster.CA.CertPEM) })
	// Dry runs (no claims written) until a new replica answers one. The
	// probe brings its own container, so a compiled policy leaves it to
	// the mutating webhook whatever the registration.
	probe := bareJob(t, "e2e-race-probe")
	probe.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	probe.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Command: []string{"claude"}}}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, _ = env.cs.BatchV1().Jobs(ns).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		var n float64
		for _, w := range env.extra {
			v, _ := w.Counter(`clipjob_admission_requests_total{dry_run="true",`)
			n += v
		}
		return n > 0, nil
	})
	if err != nil {
		t.Fatal("the API server never called the new replicas through the balancer")
	}
	return replicas
}

// createConcurrently creates n Jobs made by job at once, named prefix-NNN,
// from a client whose own rate limit does not serialize them, and sorts
// the answers.
func createConcurrently(ctx context.Context, t *testing.T, n int, prefix string, job func(name string) *batchv1.Job) (admitted []string, conflicts int, other []error) {
	t.Helper()
	cfg := *env.cluster.Config
	cfg.QPS, cfg.Burst = 1000, 1000
	fast := kubernetes.NewForConfigOrDie(&cfg)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		j := job(fmt.Sprintf("%s-%03d", prefix, i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := fast.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted = append(admitted, j.Name)
			case apierrors.IsConflict(err) && strings.Contains(err.Error(), "already has an active run: Job "+ns+"/"+prefix+"-"):
				conflicts++
			default:
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	return admitted, conflicts, other
}

// clientAs is a client acting as ServiceAccount name of the suite's
// namespace, which may only use verbs on Jobs there: someone other than
// the Paperclip server who may create Jobs beside its agents.
func clientAs(ctx context.Context, t *testing.T, name string, verbs ...string) kubernetes.Interface {
	t.Helper()
	token, err := harness.ServiceAccountToken(ctx, env.cluster, ns, name, []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: verbs}})
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(env.cluster.Config)
	rc.BearerToken = token
	return kubernetes.NewForConfigOrDie(rc)
}

func assertNoJob(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := env.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Job %s was stored: %v", name, err)
	}
}

// finishRun makes kwok end the Job's pod with exitCode and waits for the
// Job controller to mark the Job finished.
func finishRun(ctx context.Context, t *testing.T, job, exitCode string) {
	t.Helper()
	pod := waitPod(ctx, t, job, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, cluster.AnnotationExitCode, exitCode)
	if _, err := env.cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := env.cs.BatchV1().Jobs(ns).Get(ctx, job, metav1.GetOptions{})
		return err == nil && claim.Finished(j), nil
	})
	if err != nil {
		t.Fatalf("Job %s did not finish: %v", job, err)
	}
}

func validateCounts(t *testing.T) []float64 {
	t.Helper()
	var out []float64
	for _, w := range append([]*harness.Webhook{env.webhook}, env.extra...) {
		if !w.Running() {
			continue // an earlier test's replica
		}
		v, err := w.Counter(`clipjob_admission_requests_total{dry_run="false",`, `webhook="validate"`)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func diff(a, b []float64) []float64 {
	out := make([]float64, len(b))
	for i := range b {
		out[i] = b[i] - a[i]
	}
	return out
}

// rawOf is obj as a List item.
func rawOf(t *testing.T, obj any) runtime.RawExtension {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: raw}
}

// cause is the message of the API error's cause of type t, as a client
// reads clipjob's 409 causes.
func cause(err error, t metav1.CauseType) (string, bool) {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return "", false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Type == t {
			return c.Message, true
		}
	}
	return "", false
}
