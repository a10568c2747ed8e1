package integration

import (
	"bytes"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/cmd/clipjob/app"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/internal/testing/golden"
)

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
// from the Paperclip Deployment, the profile and the security floor.
func TestBareJobBecomesARunningAgentPod(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-bare")
	created, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a bare Job: %v", err)
	}
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("the stored Job has the profile, the source's values and the Job defaults", func(t *testing.T) {
		if got := stored.Annotations[contract.AnnotationProfile]; got != "claude_local" {
			t.Errorf("profile annotation %q, want claude_local", got)
		}
		if stored.Annotations[contract.AnnotationTemplateHash] == "" {
			t.Error("no template-hash annotation")
		}
		if *stored.Spec.BackoffLimit != 0 || stored.Spec.TTLSecondsAfterFinished == nil || *stored.Spec.TTLSecondsAfterFinished != 300 {
			t.Errorf("job defaults: backoffLimit %v ttl %v", *stored.Spec.BackoffLimit, stored.Spec.TTLSecondsAfterFinished)
		}
		spec := stored.Spec.Template.Spec
		if len(spec.Containers) != 1 || spec.Containers[0].Name != "agent" {
			t.Fatalf("containers %+v", spec.Containers)
		}
		agent := spec.Containers[0]
		if agent.Image != "ghcr.io/paperclipai/paperclip:v2026.11.3" {
			t.Errorf("image %q not inherited", agent.Image)
		}
		env := envNames(agent)
		if _, ok := env["ANTHROPIC_API_KEY"]; !ok {
			t.Error("ANTHROPIC_API_KEY (valueFrom) not inherited")
		}
		for _, denied := range []string{"DATABASE_URL", "BETTER_AUTH_SECRET"} {
			if _, ok := env[denied]; ok {
				t.Errorf("%s reached the agent", denied)
			}
		}
		if env["HOME"].Value != "/paperclip/instances/default/companies/acme/agents/agent-e2e-bare/home" || env[contract.EnvPromptFile].Value == "" || env["PAPERCLIP_AGENT_ID"].Value != "agent-e2e-bare" {
			t.Errorf("HOME %q prompt file %q agent id %q", env["HOME"].Value, env[contract.EnvPromptFile].Value, env["PAPERCLIP_AGENT_ID"].Value)
		}
		if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "ghcr-pull" {
			t.Errorf("pull secrets %+v", spec.ImagePullSecrets)
		}
	})
	t.Run("its pod runs with the agent labels, the floor and the shared volume", func(t *testing.T) {
		pod := in.WaitPod(ctx, t, created.Name, harness.Running)
		if pod.Labels[contract.LabelRole] != contract.RoleAgent || pod.Labels[contract.LabelEgress] != "anthropic" ||
			pod.Labels[contract.LabelAgentID] != "agent-e2e-bare" || pod.Labels[contract.LabelRunID] != "e2e-bare" {
			t.Errorf("pod labels %v", pod.Labels)
		}
		sc := pod.Spec.SecurityContext
		if sc == nil || !*sc.RunAsNonRoot || *sc.RunAsUser != 1000 || *sc.FSGroup != 1000 || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod security context %+v", sc)
		}
		csc := pod.Spec.Containers[0].SecurityContext
		if csc == nil || *csc.AllowPrivilegeEscalation || csc.Capabilities.Drop[0] != "ALL" || !*csc.ReadOnlyRootFilesystem {
			t.Errorf("container security context %+v", csc)
		}
		var claim string
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				claim = v.PersistentVolumeClaim.ClaimName
			}
		}
		if claim != "paperclip-data" {
			t.Errorf("pod mounts claim %q, want paperclip-data", claim)
		}
	})
}

// TestJobWithoutAgentLabelUntouched: the objectSelector keeps the webhook
// away from every other Job.
func TestJobWithoutAgentLabelUntouched(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-plain", Namespace: in.Namespace, Labels: map[string]string{"app": "plain"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: "busybox:1.36", Command: []string{"true"}}},
		}}},
	}
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := stored.Annotations[contract.AnnotationProfile]; ok {
		t.Error("a Job without the agent label was mutated")
	}
	c := stored.Spec.Template.Spec.Containers[0]
	if len(c.Env) != 0 || len(c.VolumeMounts) != 0 || c.SecurityContext != nil || *stored.Spec.BackoffLimit != 6 {
		t.Errorf("plain Job changed: env %v mounts %v sc %v backoff %d", c.Env, c.VolumeMounts, c.SecurityContext, *stored.Spec.BackoffLimit)
	}
}

// TestOwnContainerAndDryRun: a Job with its own container keeps its
// command; a server-side dry run returns the completed Job and stores
// nothing.
func TestOwnContainerAndDryRun(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-own")
	job.Spec.Template.Spec.Containers = []corev1.Container{{Name: "runner", Command: []string{"sh", "-c", "echo hi"}}}
	dry, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatal(err)
	}
	c := dry.Spec.Template.Spec.Containers[0]
	if c.Name != "runner" || strings.Join(c.Command, " ") != "sh -c echo hi" || c.Image == "" {
		t.Errorf("dry-run result: %s %v image %q", c.Name, c.Command, c.Image)
	}
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, job.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry run stored the Job: %v", err)
	}
}

// TestCLIRendersWhatTheClusterStores: `clipjob render` on the same bare Job,
// with the Deployment read back from the cluster, yields the same template
// hash, env and volumes as the webhook.
func TestCLIRendersWhatTheClusterStores(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-cli")
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep, err := suite.cs.AppsV1().Deployments(in.Namespace).Get(ctx, "paperclip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep.APIVersion, dep.Kind = "apps/v1", "Deployment"
	dir := t.TempDir()
	job.APIVersion, job.Kind = "batch/v1", "Job"
	var out, errb bytes.Buffer
	code := app.Main([]string{"render", "-f", golden.WriteYAML(t, dir, "job.yaml", job), "--source", golden.WriteYAML(t, dir, "dep.yaml", dep),
		"--config", in.ConfigFile()}, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("clipjob render: %s", errb.String())
	}
	set, err := manifest.Read(&out)
	if err != nil {
		t.Fatal(err)
	}
	offline := set.Jobs[0]
	if a, b := offline.Annotations[contract.AnnotationTemplateHash], stored.Annotations[contract.AnnotationTemplateHash]; a != b {
		t.Errorf("template hash: CLI %s, webhook %s", a, b)
	}
	oc, sc := offline.Spec.Template.Spec.Containers[0], stored.Spec.Template.Spec.Containers[0]
	if !equalYAML(t, oc.Env, sc.Env) || !equalYAML(t, oc.VolumeMounts, sc.VolumeMounts) ||
		!equalYAML(t, offline.Spec.Template.Spec.SecurityContext, stored.Spec.Template.Spec.SecurityContext) {
		t.Errorf("CLI and webhook disagree:\nCLI env %v\nwebhook env %v", oc.Env, sc.Env)
	}
}

func equalYAML(t *testing.T, a, b any) bool {
	t.Helper()
	x, _ := yaml.Marshal(a)
	y, _ := yaml.Marshal(b)
	return bytes.Equal(x, y)
}
