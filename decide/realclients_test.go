package decide_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/cmd/clipjob/app"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// TestRealClientsJobs: each real client's Job is admitted as it is under
// its documented config, and under a config that allows only its busybox
// init it is refused with a message naming the setting to change.
func TestRealClientsJobs(t *testing.T) {
	for _, tc := range []struct {
		file, refusedBy, names string
	}{
		{"claude-job.json", "denied by the validating webhook", "list it in policy.secrets.shared"},
		{"claude-job-large.json", "denied by the validating webhook", "list it in policy.secrets.shared"},
		{"opencode-job.json", "denied by the validating webhook", "list it in policy.secrets.shared"},
		{"plugin-job.json", "denied by the mutating webhook", "set profiles.claude_local.automountServiceAccountToken: true"},
	} {
		var documented string
		for _, rc := range realClients {
			if rc.file == tc.file {
				documented = rc.config
			}
		}
		f := fixture{jobFile: realFile(tc.file), srcFile: realFile("source.yaml"), objects: []string{realFile("objects.yaml")}}
		f.cfgFile = realFile(documented)
		if v := throughWebhook(t, f); v.Outcome != "allowed" {
			t.Errorf("%s under %s: %s: %s", tc.file, documented, v.Outcome, v.Message)
		}
		f.cfgFile = realFile("config-busybox.yaml")
		if v := throughWebhook(t, f); v.Outcome != tc.refusedBy || !strings.Contains(v.Message, tc.names) {
			t.Errorf("%s under config-busybox.yaml: %s: %s; want %s naming %q", tc.file, v.Outcome, v.Message, tc.refusedBy, tc.names)
		}
	}
}

// TestRealClientsMountingTheWholeVolumeAreRefusedWhenConfined: the
// adapters that mount the shared claim themselves would hand every run
// Paperclip's whole home. With isolation on (the default) their Jobs are
// refused naming the volume to remove; their documented config turns it
// off explicitly.
func TestRealClientsMountingTheWholeVolumeAreRefusedWhenConfined(t *testing.T) {
	cfg, err := os.ReadFile(realFile("config-adapters.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	confined := strings.Replace(string(cfg), "isolation:\n  mode: Shared\n", "", 1)
	if confined == string(cfg) {
		t.Fatal("config-adapters.yaml does not turn isolation off as this test expects")
	}
	for _, file := range []string{"claude-job.json", "opencode-job.json"} {
		f := fixture{jobFile: realFile(file), srcFile: realFile("source.yaml"), objects: []string{realFile("objects.yaml")},
			cfgFile: writeFile(t, t.TempDir(), "confined.yaml", confined)}
		v := throughWebhook(t, f)
		if v.Outcome != "denied by the validating webhook" || !strings.Contains(v.Message, `is the shared volume, which clipjob mounts itself`) ||
			!strings.Contains(v.Message, `remove volume "data"`) {
			t.Errorf("%s with isolation on: %s: %s; want a refusal naming volume data", file, v.Outcome, v.Message)
		}
	}
}

// TestThePluginsSettingsOneByOne: from a config that knows nothing of the
// plugin, each refusal names one setting, and applying it gets the Job one
// step further, until it is admitted: an operator is led, not left to
// guess.
func TestThePluginsSettingsOneByOne(t *testing.T) {
	steps := []struct{ names, yaml string }{
		{"profiles.claude_local.automountServiceAccountToken: true", "profiles: {claude_local: {automountServiceAccountToken: true}}\n"},
		{"tenantNamespaces", "tenantNamespaces: [paperclip-co-*]\n"},
		{"policy.images.allow", ""},
	}
	base := "apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\n"
	images := "policy: {images: {allow: [\"ghcr.io/paperclipai/agent-runtime-*\"]}"
	cfg := base
	dir := t.TempDir()
	for i, step := range steps {
		v := throughWebhook(t, fixture{jobFile: realFile("plugin-job.json"), cfgFile: writeFile(t, dir, "step.yaml", cfg+images+"}\n"),
			srcFile: realFile("source.yaml"), objects: []string{realFile("objects.yaml")}})
		if i == len(steps)-1 {
			// The image is allowed from the start here; what is left is
			// the env Secret that comes after the Job.
			step.names = "policy.secrets.createdAfterJob: true"
		}
		if v.Outcome == "allowed" || !strings.Contains(v.Message, step.names) {
			t.Fatalf("step %d: %s: %s; want a refusal naming %q", i, v.Outcome, v.Message, step.names)
		}
		cfg += step.yaml
	}
	v := throughWebhook(t, fixture{jobFile: realFile("plugin-job.json"), cfgFile: writeFile(t, dir, "last.yaml", cfg+images+", secrets: {createdAfterJob: true}}\n"),
		srcFile: realFile("source.yaml"), objects: []string{realFile("objects.yaml")}})
	if v.Outcome != "allowed" {
		t.Fatalf("with every setting named: %s: %s", v.Outcome, v.Message)
	}
	if !slices.ContainsFunc(v.Warnings, func(w string) bool { return strings.Contains(w, "does not exist yet") }) {
		t.Errorf("a Secret admitted before it exists is not warned about: %v", v.Warnings)
	}
}

// TestThePluginsEnvSecretOffline: under the plugin's documented config
// (createdAfterJob), the cluster admits its Job before its env Secret
// exists, with a warning. `clipjob check` not given that Secret must say
// so — the webhook's own warning — and not advise the setting the config
// already has.
func TestThePluginsEnvSecretOffline(t *testing.T) {
	f := fixture{jobFile: realFile("plugin-job.json"), cfgFile: realFile("config-plugin.yaml"),
		srcFile: realFile("source.yaml"), objects: []string{realFile("objects.yaml")}}
	web := throughWebhook(t, f)
	var notYet string
	for _, w := range web.Warnings {
		if strings.Contains(w, "does not exist yet") {
			notYet = w
		}
	}
	if web.Outcome != "allowed" || notYet == "" {
		t.Fatalf("the webhook, the env Secret missing: %s %q, warnings %q; want allowed with a warning that it does not exist yet", web.Outcome, web.Message, web.Warnings)
	}
	// Without --objects-complete the Secret is a fact not given.
	var stdout, stderr bytes.Buffer
	code := app.Main([]string{"check", "-f", f.jobFile, "--source", f.srcFile, "--objects", f.objects[0], "--config", f.cfgFile}, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 3 || !strings.Contains(out, "undecided: Secret paperclip-co-1/pc-01jd8xacc0plugin0000000000-env was not given") {
		t.Fatalf("clipjob check exit %d: %s%s; want exit 3, the env Secret undecided", code, out, stderr.String())
	}
	if want := "without it the cluster admits the Job with a warning (" + notYet + ")"; !strings.Contains(out, want) {
		t.Errorf("clipjob check said:\n%s\nwant it to say %q, as the webhook does", out, want)
	}
	if strings.Contains(out, "refuses") || strings.Contains(out, "set policy.secrets.createdAfterJob") {
		t.Errorf("clipjob check says the cluster refuses the Job, or advises the setting the config has:\n%s", out)
	}
}

// TestRealClientsJobsStrippedToBare: with what it inherits taken out (the
// image, the shared claim and secret volumes, pull secrets, DNS, the
// server's env), each adapter's Job renders to the same image, claim, pull
// secrets, DNS and secret volumes its client computed from the same
// Deployment. And so do its variants under other names, another source and
// another namespace: the rule, not the case.
func TestRealClientsJobsStrippedToBare(t *testing.T) {
	for _, file := range []string{"claude-job.json", "claude-job-large.json", "opencode-job.json"} {
		for _, variant := range []struct {
			name string
			edit func(*clientCase)
		}{
			{"as built", func(*clientCase) {}},
			{"other names", func(c *clientCase) {
				c.rename("paperclip-data", "shared-home")
				c.rename("github-app-key", "gh-key")
				c.rename("ghcr-pull", "registry-auth")
				c.cfg = "source: {secretVolumes: [gh-key]}\n"
			}},
			{"another source and namespace", func(c *clientCase) {
				c.src.Name, c.src.Namespace, c.job.Namespace = "orchestrator", "agents", "agents"
				c.cfg = "source: {namespace: agents, deployment: orchestrator, secretVolumes: [github-app-key]}\n"
			}},
		} {
			t.Run(file+"/"+variant.name, func(t *testing.T) {
				c := newClientCase(t, file)
				variant.edit(c)
				want := c.job.Spec.Template.Spec
				bare := c.stripped()
				cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\n" + c.cfg))
				if err != nil {
					t.Fatal(err)
				}
				inh, err := templates.InheritFromDeployment(c.src, cfg.Source)
				if err != nil {
					t.Fatal(err)
				}
				m := decide.Mutate(decide.Input{Operation: policy.Create, Job: bare, Config: cfg,
					Facts: decide.Facts{Source: func(*config.Config) (*templates.Inherited, *templates.TemplateHashes, error) { return inh, nil, nil }}})
				if m.Refusal != nil {
					t.Fatalf("the bare Job is refused: %s", m.Refusal.Message)
				}
				got := m.Result.Job.Spec.Template.Spec
				agent := got.Containers[0]
				if agent.Image != want.Containers[0].Image {
					t.Errorf("image %s, its client computed %s", agent.Image, want.Containers[0].Image)
				}
				if diff := cmp.Diff(claims(want), claims(got)); diff != "" {
					t.Errorf("claims (-client +clipjob):\n%s", diff)
				}
				if diff := cmp.Diff(want.ImagePullSecrets, got.ImagePullSecrets); diff != "" {
					t.Errorf("pull secrets (-client +clipjob):\n%s", diff)
				}
				if diff := cmp.Diff(want.DNSConfig, got.DNSConfig); diff != "" {
					t.Errorf("DNS (-client +clipjob):\n%s", diff)
				}
				if diff := cmp.Diff(secretMounts(want, want.Containers[0]), secretMounts(got, agent)); diff != "" {
					t.Errorf("secret volumes by mount path (-client +clipjob):\n%s", diff)
				}
			})
		}
	}
}

// clientCase is a real client's Job and the source it read, to edit.
type clientCase struct {
	job *batchv1.Job
	src *appsv1.Deployment
	cfg string
}

func newClientCase(t *testing.T, file string) *clientCase {
	t.Helper()
	src := golden.ReadManifests(t, realFile("source.yaml")).Deployments[0]
	// The documented config lists the GitHub App key the server mounts:
	// its agents use it, and no secret volume goes unlisted.
	return &clientCase{job: oneJob(t, realFile(file)), src: src, cfg: "source: {secretVolumes: [github-app-key]}\n"}
}

// rename changes a Secret's, claim's or pull secret's name everywhere,
// in the Job and in its source alike.
func (c *clientCase) rename(from, to string) {
	for _, spec := range []*corev1.PodSpec{&c.job.Spec.Template.Spec, &c.src.Spec.Template.Spec} {
		for i := range spec.Volumes {
			v := &spec.Volumes[i]
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == from {
				v.PersistentVolumeClaim.ClaimName = to
			}
			if v.Secret != nil && v.Secret.SecretName == from {
				v.Secret.SecretName = to
			}
		}
		for i := range spec.ImagePullSecrets {
			if spec.ImagePullSecrets[i].Name == from {
				spec.ImagePullSecrets[i].Name = to
			}
		}
	}
}

// stripped is the Job without what it inherited: the agent container's
// image and env from the server, the shared claim and secret volumes
// and their mounts, pull secrets and DNS. Its own init container, prompt
// volume and command stay.
func (c *clientCase) stripped() *batchv1.Job {
	job := c.job.DeepCopy()
	spec := &job.Spec.Template.Spec
	fromSource := map[string]bool{}
	for _, v := range c.src.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			fromSource[v.PersistentVolumeClaim.ClaimName] = true
		}
		if v.Secret != nil {
			fromSource[v.Secret.SecretName] = true
		}
	}
	inherited := map[string]bool{}
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool {
		inherited[v.Name] = v.PersistentVolumeClaim != nil && fromSource[v.PersistentVolumeClaim.ClaimName] ||
			v.Secret != nil && fromSource[v.Secret.SecretName]
		return inherited[v.Name]
	})
	spec.ImagePullSecrets, spec.DNSConfig, spec.DNSPolicy = nil, nil, ""
	serverEnv := map[string]bool{}
	for _, e := range c.src.Spec.Template.Spec.Containers[1].Env {
		serverEnv[e.Name] = true
	}
	for i := range spec.Containers {
		ct := &spec.Containers[i]
		ct.Image = ""
		ct.VolumeMounts = slices.DeleteFunc(ct.VolumeMounts, func(m corev1.VolumeMount) bool { return inherited[m.Name] })
		ct.Env = slices.DeleteFunc(ct.Env, func(e corev1.EnvVar) bool { return serverEnv[e.Name] })
		ct.EnvFrom = nil
	}
	return job
}

func claims(spec corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		}
	}
	slices.Sort(out)
	return out
}

// secretMounts maps each mount path of c backed by a Secret volume to that
// Secret's name.
func secretMounts(spec corev1.PodSpec, c corev1.Container) map[string]string {
	byName := map[string]string{}
	for _, v := range spec.Volumes {
		if v.Secret != nil && !strings.HasSuffix(v.Secret.SecretName, "-prompt") {
			byName[v.Name] = v.Secret.SecretName
		}
	}
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		if s, ok := byName[m.Name]; ok {
			out[m.MountPath] = s
		}
	}
	return out
}

// TestAJobsOwnVolumeOverItsWorkspaceIsAdmitted: a Job that mounts a
// volume of its own where its workspace would be gets that volume there
// and starts in it (clipjob's mount gives way), without being told that
// its working directory is not mounted.
func TestAJobsOwnVolumeOverItsWorkspaceIsAdmitted(t *testing.T) {
	job := `apiVersion: batch/v1
kind: Job
metadata:
  name: own-workspace
  namespace: paperclip
  labels: {paperclip.io/agent-id: agent-7f3a, paperclip.io/company-id: acme, paperclip.io/run-id: r1, paperclip.io/adapter-type: claude_local}
spec:
  template:
    metadata:
      annotations: {paperclip.io/prompt: hi}
    spec:
      containers:
      - name: agent
        volumeMounts: [{name: scratch, mountPath: /paperclip/instances/default/workspaces/agent-7f3a}]
      volumes: [{name: scratch, emptyDir: {}}]
`
	f := fixture{jobFile: writeFile(t, t.TempDir(), "job.yaml", job), srcFile: filepath.Join(golden.Dir(), "source.yaml"),
		objects: []string{filepath.Join("testdata", "objects.yaml")}}
	if v := throughWebhook(t, f); v.Outcome != "allowed" {
		t.Fatalf("%s: %s", v.Outcome, v.Message)
	}
}
