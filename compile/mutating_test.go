package compile

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

const creator = "system:serviceaccount:paperclip:paperclip"

// compiled is a namespace's policies ready to evaluate.
type compiled struct {
	inh      *templates.Inherited
	cfg      *config.Config
	policies []Policy
	evals    []*evaluator
}

func compileFor(t testing.TB, inh *templates.Inherited, cfg *config.Config, namespace string) *compiled {
	t.Helper()
	ps, err := Mutating(Input{Namespace: namespace, Inherited: inh, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	c := &compiled{inh: inh, cfg: cfg, policies: ps}
	for _, p := range ps {
		e, err := newEvaluator(p.Policy)
		if err != nil {
			t.Fatalf("policy %s does not compile as the API server compiles it: %v", p.Policy.Name, err)
		}
		c.evals = append(c.evals, e)
	}
	return c
}

// admit runs every policy over job as the API server would (each that
// matches, in turn) and says which matched.
func (c *compiled) admit(t testing.TB, job *batchv1.Job) (*batchv1.Job, []string) {
	t.Helper()
	var matched []string
	for i, e := range c.evals {
		out, ok, err := e.mutate(job, creator)
		if err != nil {
			t.Fatalf("policy %s on Job %s: %v", c.policies[i].Policy.Name, job.Name, err)
		}
		if ok {
			matched = append(matched, out.Annotations[contract.AnnotationProfile])
			job = out
		}
	}
	return job, matched
}

// agrees fails unless the policies leave job to the webhook or complete
// it exactly as Render does; it reports whether they completed it.
func (c *compiled) agrees(t testing.TB, job *batchv1.Job) bool {
	t.Helper()
	got, matched := c.admit(t, job)
	want, err := templates.Render(templates.Input{Job: job, Inherited: c.inh, Config: c.cfg, Creator: creator})
	switch {
	case len(matched) == 0:
		return false
	case len(matched) > 1:
		t.Fatalf("Job %s: %d policies matched (%v); one profile applies", job.Name, len(matched), matched)
	case err != nil:
		t.Fatalf("Job %s: Render refuses it (%v), but policy %s completed it: a mutating policy cannot refuse, so its domain must leave the Job to the webhook", job.Name, err, matched[0])
	case want.Profile != matched[0]:
		t.Fatalf("Job %s: Render applies profile %s, the policy of %s matched", job.Name, want.Profile, matched[0])
	case !equality.Semantic.DeepEqual(got, want.Job):
		w, _ := yaml.Marshal(want.Job)
		g, _ := yaml.Marshal(got)
		t.Fatalf("Job %s: the policy's Job differs from Render's (-Render +policy):\n%s", job.Name, cmp.Diff(string(w), string(g)))
	}
	// Once completed, no policy matches again (reinvocation changes nothing).
	if _, again := c.admit(t, got); len(again) > 0 {
		t.Fatalf("Job %s: policy %v matches its own result", job.Name, again)
	}
	return true
}

// The golden fixtures: every bare one is completed by its policy exactly
// as Render completes it; every other one is left to the webhook.
func TestCompiledPoliciesRenderTheGoldenFixtures(t *testing.T) {
	bare := []string{
		"alias-adapter-label", "controller-annotations-dropped", "env-secret-ok", "pod-labels-only-the-jobs",
		"profile-claude_local", "profile-codex_local", "profile-configured", "profile-cursor_local",
		"profile-gemini_local", "profile-opencode_local", "profile-pi_local", "prompt-secret",
		"queue-mode", "queue-mode-client-cannot-skip", "run-options",
	}
	var completed []string
	for _, fx := range golden.Cases(t) {
		inh, err := templates.InheritFromDeployment(fx.Source, fx.Config.Source)
		if err != nil || inh.Tenant {
			continue // no source to compile from: every Job there is the webhook's
		}
		c := compileFor(t, inh, fx.Config, fx.Job.Namespace)
		if c.agrees(t, fx.Job) {
			completed = append(completed, fx.Name)
		}
	}
	for _, name := range bare {
		if !slices.Contains(completed, name) {
			t.Errorf("fixture %s is a bare Job, but no policy completed it (completed: %v)", name, completed)
		}
	}
}

// testSource is the golden fixtures' source and config.
func testSource(t testing.TB) (*templates.Inherited, *config.Config) {
	fx := golden.Case(t, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(fx.Source, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	return inh, fx.Config
}

// bareJob is what a client sends: contract labels and annotations only.
func bareJob(name string, labels, annotations, tplAnnotations map[string]string) *batchv1.Job {
	j := &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "paperclip", Labels: labels, Annotations: annotations},
	}
	j.Spec.Template.Annotations = tplAnnotations
	return j
}

// Every combination of the run values a bare Job may carry, for every
// profile and isolation mode, with and without the API server's defaults.
func TestCompiledPoliciesRenderEveryCombination(t *testing.T) {
	inh, agentCfg := testSource(t)
	renderEveryCombination(t, inh, []*config.Config{agentCfg, withIsolation(t, "Company"), withIsolation(t, "Shared")})
}

// A profile's name is any label value: one that starts with a digit or
// holds dots and dashes still makes valid policy variables, and its Jobs
// are completed as Render completes them.
func TestCompiledPoliciesOfProfilesNamedAnyhow(t *testing.T) {
	inh, _ := testSource(t)
	cfg, err := config.Parse([]byte("apiVersion: " + config.APIVersion + "\nkind: Config\nprofiles:\n" +
		"  2fast:\n    command: [sh, -c, 'exec fast']\n" +
		"  my.agent-v2:\n    command: [sh, -c, 'exec mine']\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := compileFor(t, inh, cfg, "paperclip")
	for _, profile := range []string{"2fast", "my.agent-v2"} {
		job := bareJob("named-"+strings.ReplaceAll(profile, ".", "-"), map[string]string{contract.LabelAgentID: "agent-1", contract.LabelCompanyID: "acme",
			contract.LabelAdapterType: profile}, map[string]string{}, map[string]string{contract.AnnotationPrompt: "Go."})
		if !c.agrees(t, job) {
			t.Errorf("a bare Job of profile %s was left to the webhook", profile)
		}
	}
}

// withIsolation is the fixtures' config in another isolation mode.
func withIsolation(t testing.TB, mode string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte("apiVersion: " + config.APIVersion + "\nkind: Config\nisolation:\n  mode: " + mode + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// renderEveryCombination tries each combination under one of the
// isolation modes of cfgs and a third of the profiles, in turn, so that
// every combination, every profile and mode, and every value with every
// profile and mode is tried: each Job costs the API server's own CEL
// evaluation twice, and every combination under every mode tripled the
// unit tier's longest test for no pairing it lacked.
func renderEveryCombination(t *testing.T, inh *templates.Inherited, cfgs []*config.Config) {
	compiled := make([]*compiled, len(cfgs))
	profiles := make([][]string, len(cfgs))
	pairs := 0
	for i, cfg := range cfgs {
		compiled[i] = compileFor(t, inh, cfg, "paperclip")
		for _, p := range append(cfg.ProfileNames(), "", "claude") {
			if prof, _ := cfg.JobProfile(p); len(prof.Command) > 0 {
				profiles[i] = append(profiles[i], p)
			}
		}
		pairs += len(profiles[i])
	}
	type item struct {
		set func(l, a, ta map[string]string)
	}
	// The run's company is always there (a confined run's directories
	// are named by it; without it Render refuses the Job, below).
	items := []item{
		{func(l, a, ta map[string]string) { l[contract.LabelRunID] = "run-1" }},
		{func(l, a, ta map[string]string) { l[contract.LabelSessionID] = "sess-0" }},
		{func(l, a, ta map[string]string) { l[contract.LabelTaskID] = "task-9" }},
		{func(l, a, ta map[string]string) { l[contract.LabelSessionID] = "sess-1" }},
		{func(l, a, ta map[string]string) { a[contract.AnnotationModel] = "anthropic/claude-sonnet-4-5" }},
		{func(l, a, ta map[string]string) { a[contract.AnnotationMaxTurns] = "10000" }},
		{func(l, a, ta map[string]string) { a[contract.AnnotationEnvSecret] = "run-1-env" }},
		{func(l, a, ta map[string]string) {
			a[contract.AnnotationWorkingDir] = "/paperclip/instances/default/projects/acme/p-1/repo/.paperclip/worktrees/run-1/"
		}},
		{func(l, a, ta map[string]string) { ta[contract.AnnotationPrompt] = "Fix it." }},
		{func(l, a, ta map[string]string) { ta[contract.AnnotationPromptSecret] = "run-1-prompt/p.txt" }},
	}
	n, seen := 0, map[string]bool{}
	for mask := range 1 << len(items) {
		if mask&(1<<8) != 0 && mask&(1<<9) != 0 {
			continue // both prompts: refused by Render, left to the webhook (below)
		}
		// The mode from mask/3, the profiles from mask%3: every mode
		// meets every profile as mask runs.
		m := (mask / 3) % len(cfgs)
		c, mode := compiled[m], cfgs[m].Isolation.Mode
		for i, prof := range profiles[m] {
			if (mask+i)%3 != 0 && mask != 0 {
				continue // every combination, each under a third of the profiles
			}
			l := map[string]string{contract.LabelAgentID: "agent-1", contract.LabelCompanyID: "acme"}
			if prof != "" {
				l[contract.LabelAdapterType] = prof
			}
			a, ta := map[string]string{}, map[string]string{}
			for b, it := range items {
				if mask&(1<<b) != 0 {
					it.set(l, a, ta)
				}
			}
			job := bareJob(fmt.Sprintf("combo-%d-%s", mask, prof), l, a, ta)
			if !c.agrees(t, job) {
				t.Fatalf("bare Job %s (mask %b, profile %q, isolation %q) was left to the webhook", job.Name, mask, prof, mode)
			}
			n++
			seen[string(mode)+"/"+prof] = true
			defaulted := apiServerDefaults(job)
			if !c.agrees(t, defaulted) {
				t.Fatalf("bare Job %s (isolation %q) as the API server defaults it was left to the webhook", job.Name, mode)
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d combinations tried", n)
	}
	if len(seen) != pairs {
		t.Fatalf("%d of the %d pairs of isolation mode and profile tried: %v", len(seen), pairs, seen)
	}
}

// apiServerDefaults is job as a mutating admission plugin sees it: with
// the defaults the API server sets on decode (SetDefaults_Job and
// SetDefaults_PodSpec of Kubernetes 1.37; the e2e suite's dry runs on a
// real API server hold the policies to its own).
func apiServerDefaults(job *batchv1.Job) *batchv1.Job {
	j := job.DeepCopy()
	j.Name += "-defaulted"
	j.Spec.ManualSelector = ptr.To(false)
	j.Spec.BackoffLimit = ptr.To[int32](6)
	j.Spec.Completions, j.Spec.Parallelism = ptr.To[int32](1), ptr.To[int32](1)
	j.Spec.Suspend = ptr.To(false)
	j.Spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	j.Spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
	s := &j.Spec.Template.Spec
	s.RestartPolicy = corev1.RestartPolicyNever
	s.DNSPolicy = corev1.DNSClusterFirst
	s.TerminationGracePeriodSeconds = ptr.To[int64](30)
	s.SchedulerName = corev1.DefaultSchedulerName
	s.SecurityContext = &corev1.PodSecurityContext{}
	return j
}

// What a client may set on a bare Job beside the run values: Render keeps
// some, replaces others; the policy must do the same.
func TestCompiledPoliciesKeepWhatRenderKeeps(t *testing.T) {
	inh, cfg := testSource(t)
	c := compileFor(t, inh, cfg, "paperclip")
	base := func() *batchv1.Job {
		return bareJob("kept", map[string]string{contract.LabelAgentID: "a", contract.LabelCompanyID: "c", contract.LabelRunID: "r", contract.LabelAdapterType: "claude_local"},
			map[string]string{contract.AnnotationProfile: "forged", contract.AnnotationQueued: "false", "team": "x"},
			map[string]string{contract.AnnotationPrompt: "p"})
	}
	cases := map[string]func(j *batchv1.Job){
		"on-failure": func(j *batchv1.Job) { j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure },
		"always":     func(j *batchv1.Job) { j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways },
		"backoff-3":  func(j *batchv1.Job) { j.Spec.BackoffLimit = ptr.To[int32](3) },
		"backoff-6":  func(j *batchv1.Job) { j.Spec.BackoffLimit = ptr.To[int32](6) },
		"ttl":        func(j *batchv1.Job) { j.Spec.TTLSecondsAfterFinished = ptr.To[int32](60) },
		"deadline":   func(j *batchv1.Job) { j.Spec.ActiveDeadlineSeconds = ptr.To[int64](600) },
		"parallel":   func(j *batchv1.Job) { j.Spec.Parallelism, j.Spec.Completions = ptr.To[int32](5), ptr.To[int32](5) },
		"suspended":  func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(true) },
		"grace":      func(j *batchv1.Job) { j.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5) },
		"pod-labels": func(j *batchv1.Job) {
			j.Spec.Template.Labels = map[string]string{"app": "x", contract.LabelCompanyID: "other"}
		},
		"egress-label":       func(j *batchv1.Job) { j.Labels[contract.LabelEgress] = "everything" },
		"role-label":         func(j *batchv1.Job) { j.Labels[contract.LabelRole] = "server" },
		"empty-containers":   func(j *batchv1.Job) { j.Spec.Template.Spec.Containers = []corev1.Container{} },
		"created-by-forged":  func(j *batchv1.Job) { j.Annotations[contract.AnnotationCreatedBy] = "someone-else" },
		"replacement-policy": func(j *batchv1.Job) { j.Spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed) },
		"alias-label": func(j *batchv1.Job) {
			delete(j.Labels, contract.LabelAdapterType)
			j.Labels[contract.LabelAdapter] = "claude"
		},
		// The source holds "server-only" under a denied name: a run value
		// equal to it was withheld by Render, which the policy cannot see.
		"run-values-equal-to-a-server-credential": func(j *batchv1.Job) {
			j.Labels[contract.LabelCompanyID] = "server-only"
			j.Labels[contract.LabelSessionID] = "server-only"
			j.Annotations[contract.AnnotationModel] = "server-only"
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			j := base()
			change(j)
			if !c.agrees(t, j) {
				t.Fatal("left to the webhook; a bare Job with this is the policy's")
			}
		})
	}
}

// What the policy cannot do as Render does — refuse, warn, merge with a
// container of the Job's own — it leaves to the webhook; the webhook then
// refuses or completes it. A hostile value never gets a half-completed Job.
func TestCompiledPoliciesLeaveTheRestToTheWebhook(t *testing.T) {
	inh, cfg := testSource(t)
	c := compileFor(t, inh, cfg, "paperclip")
	server := inh.ReadSecrets()
	if len(server) == 0 {
		t.Fatal("the fixtures' source reads no Secret; the test needs one")
	}
	cases := map[string]func(j *batchv1.Job){
		"own-container": func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "x", Image: "busybox"}}
		},
		"init-container":  func(j *batchv1.Job) { j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "x"}} },
		"own-volume":      func(j *batchv1.Job) { j.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "v"}} },
		"host-network":    func(j *batchv1.Job) { j.Spec.Template.Spec.HostNetwork = true },
		"service-account": func(j *batchv1.Job) { j.Spec.Template.Spec.ServiceAccountName = "admin" },
		"node-selector":   func(j *batchv1.Job) { j.Spec.Template.Spec.NodeSelector = map[string]string{"a": "b"} },
		"run-as-root": func(j *batchv1.Job) {
			j.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}
		},
		"dns-none": func(j *batchv1.Job) { j.Spec.Template.Spec.DNSPolicy = corev1.DNSNone },
		"pull-secret": func(j *batchv1.Job) {
			j.Spec.Template.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "x"}}
		},
		"indexed":           func(j *batchv1.Job) { j.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion) },
		"backoff-per-index": func(j *batchv1.Job) { j.Spec.BackoffLimitPerIndex = ptr.To[int32](1) },
		"managed-by":        func(j *batchv1.Job) { j.Spec.ManagedBy = ptr.To("kueue.x-k8s.io/multikueue") },
		"manual-selector":   func(j *batchv1.Job) { j.Spec.ManualSelector = ptr.To(true) },
		"selector": func(j *batchv1.Job) {
			j.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
		},
		"unknown-adapter":     func(j *batchv1.Job) { j.Labels[contract.LabelAdapterType] = "hermes_local" },
		"model-with-space":    func(j *batchv1.Job) { j.Annotations[contract.AnnotationModel] = "x --dangerous" },
		"model-empty":         func(j *batchv1.Job) { j.Annotations[contract.AnnotationModel] = "" },
		"turns-zero":          func(j *batchv1.Job) { j.Annotations[contract.AnnotationMaxTurns] = "0" },
		"turns-padded":        func(j *batchv1.Job) { j.Annotations[contract.AnnotationMaxTurns] = "010" },
		"turns-too-many":      func(j *batchv1.Job) { j.Annotations[contract.AnnotationMaxTurns] = "10001" },
		"env-secret-server":   func(j *batchv1.Job) { j.Annotations[contract.AnnotationEnvSecret] = server[0] },
		"env-secret-bad-name": func(j *batchv1.Job) { j.Annotations[contract.AnnotationEnvSecret] = "Run_1" },
		"empty-agent-id":      func(j *batchv1.Job) { j.Labels[contract.LabelAgentID] = "" },
		"no-company":          func(j *batchv1.Job) { delete(j.Labels, contract.LabelCompanyID) },
		"empty-company":       func(j *batchv1.Job) { j.Labels[contract.LabelCompanyID] = "" },
		"company-dotdot":      func(j *batchv1.Job) { j.Labels[contract.LabelCompanyID] = ".." },
		"company-slash":       func(j *batchv1.Job) { j.Labels[contract.LabelCompanyID] = "a/b" },
		"workdir-other-agent": func(j *batchv1.Job) {
			j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/instances/default/workspaces/b"
		},
		"workdir-agent-prefix": func(j *batchv1.Job) {
			j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/instances/default/workspaces/ab"
		},
		"workdir-other-co": func(j *batchv1.Job) {
			j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/instances/default/projects/d/x"
		},
		"workdir-volume-root":  func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/paperclip" },
		"workdir-dotdot":       func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/../etc" },
		"workdir-outside":      func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/etc" },
		"workdir-prefix-only":  func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/paperclipx/a" },
		"workdir-relative":     func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "paperclip/a" },
		"workdir-double-slash": func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/paperclip//a" },
		"workdir-dot":          func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/./a" },
		"workdir-newline":      func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = "/paperclip/a\nb" },
		"both-prompts": func(j *batchv1.Job) {
			j.Spec.Template.Annotations[contract.AnnotationPromptSecret] = "p"
		},
		"prompt-secret-server": func(j *batchv1.Job) {
			delete(j.Spec.Template.Annotations, contract.AnnotationPrompt)
			j.Spec.Template.Annotations[contract.AnnotationPromptSecret] = server[0] + "/token"
		},
		"prompt-secret-key-slash": func(j *batchv1.Job) {
			delete(j.Spec.Template.Annotations, contract.AnnotationPrompt)
			j.Spec.Template.Annotations[contract.AnnotationPromptSecret] = "p/a/b"
		},
		"prompt-secret-key-dotdot": func(j *batchv1.Job) {
			delete(j.Spec.Template.Annotations, contract.AnnotationPrompt)
			j.Spec.Template.Annotations[contract.AnnotationPromptSecret] = "p/..x"
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			j := bareJob(name, map[string]string{contract.LabelAgentID: "a", contract.LabelCompanyID: "c", contract.LabelRunID: "r", contract.LabelAdapterType: "claude_local"},
				map[string]string{}, map[string]string{contract.AnnotationPrompt: "p"})
			change(j)
			if _, matched := c.admit(t, j); len(matched) > 0 {
				t.Fatalf("policy %v completed it; it is the webhook's", matched)
			}
		})
	}
}

// A Job with no agent label is no policy's, whatever else it carries.
func TestCompiledPoliciesIgnoreOtherJobs(t *testing.T) {
	inh, cfg := testSource(t)
	c := compileFor(t, inh, cfg, "paperclip")
	for _, labels := range []map[string]string{nil, {}, {contract.LabelRunID: "r", contract.LabelAdapterType: "claude_local"}} {
		j := bareJob("other", labels, nil, nil)
		if _, matched := c.admit(t, j); len(matched) > 0 {
			t.Fatalf("labels %v: policy %v matched a Job that is no agent run", labels, matched)
		}
	}
}

// Values a client picks, fuzzed: the policy either leaves the Job to the
// webhook or completes it as Render does; never completes one Render
// refuses.
func FuzzCompiledPolicy(f *testing.F) {
	f.Add("agent", "co", "run", "sess", "claude-sonnet-4-5", "10", "env-1", "/paperclip/instances/default/workspaces/agent/a/", "prompt", "", "claude_local")
	f.Add("a", "", "", "", "x y", "0", "Bad", "/paperclip/..", "", "s/k", "codex")
	f.Add("a", "c", "r", "s", "m", "007", "e", "/paperclip", "p", "s/", "")
	f.Add("a", "..", "r", "s", "m", "1", "e", "/paperclip/instances/default/projects/../x", "", "s/..", "opencode_local")
	f.Add("a", "c", "r", "s", "m", "1", "e", "/paperclip/instances/default/projects/c", "", "s/..", "opencode_local")
	inh, cfg := testSource(f)
	c := compileFor(f, inh, cfg, "paperclip")
	f.Fuzz(func(t *testing.T, agent, company, run, session, model, turns, envSecret, workDir, prompt, promptSecret, adapter string) {
		l := map[string]string{contract.LabelAgentID: agent, contract.LabelAdapterType: adapter}
		a, ta := map[string]string{}, map[string]string{}
		for k, v := range map[string]string{contract.LabelCompanyID: company, contract.LabelRunID: run, contract.LabelSessionID: session} {
			if v != "" {
				l[k] = v
			}
		}
		for k, v := range map[string]string{contract.AnnotationModel: model, contract.AnnotationMaxTurns: turns,
			contract.AnnotationEnvSecret: envSecret, contract.AnnotationWorkingDir: workDir} {
			if v != "" {
				a[k] = v
			}
		}
		if prompt != "" {
			ta[contract.AnnotationPrompt] = prompt
		}
		if promptSecret != "" {
			ta[contract.AnnotationPromptSecret] = promptSecret
		}
		if strings.ContainsRune(agent+company+run+session+adapter, 0) {
			return // not a label value the API server would take
		}
		for _, v := range []string{agent, company, run, session, model, turns, envSecret, workDir, prompt, promptSecret, adapter} {
			if !utf8.ValidString(v) {
				return // the API server's JSON decoding has replaced such bytes before any admission sees them
			}
		}
		c.agrees(t, bareJob("fuzz", l, a, ta))
	})
}

// The policies select agent Jobs by label before any CEL runs: an
// ordinary Job in the namespace costs the API server no expression.
func TestCompiledPoliciesSelectAgentJobsByLabel(t *testing.T) {
	inh, cfg := testSource(t)
	c := compileFor(t, inh, cfg, "paperclip")
	for _, p := range c.policies {
		sel := p.Policy.Spec.MatchConstraints.ObjectSelector
		if sel == nil || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != contract.LabelAgentID ||
			sel.MatchExpressions[0].Operator != metav1.LabelSelectorOpExists {
			t.Errorf("policy %s selects %+v; want the Jobs that carry %s", p.Policy.Name, sel, contract.LabelAgentID)
		}
	}
}
