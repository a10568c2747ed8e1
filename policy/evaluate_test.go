package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

const sourceImage = "ghcr.io/paperclipai/paperclip:v2026.11.3"

// renderedJob is the claude_local golden case after rendering: a Job the
// mutating webhook produced, which must pass every rule.
func renderedJob(t testing.TB) *batchv1.Job {
	t.Helper()
	res, err := golden.Case(t, "profile-claude_local").Render()
	if err != nil {
		t.Fatal(err)
	}
	return res.Job
}

// handed is what the fixture's source hands agents, which a rendered Job
// references.
func handed(t testing.TB) templates.SourceSecrets {
	t.Helper()
	c := golden.Case(t, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	prof, _ := c.Config.JobProfile("claude_local")
	return inh.SecretsFor(c.Config.Source, prof)
}

func rwx(ns, name string) (*corev1.PersistentVolumeClaim, error) {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}},
	}, nil
}

func mustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestEvaluate(t *testing.T) {
	base := renderedJob(t)
	defaultCfg := mustConfig(t, "")
	tests := []struct {
		name      string
		cfg       string
		mutate    func(j *batchv1.Job)
		claims    ClaimLookup
		wantErr   []string // substrings of the aggregated error; none: allowed
		wantWarn  []string
		wantRules []string // failed rules
		undecided string   // the fact a verdict hangs on
	}{
		{name: "rendered Job passes", claims: rwx},
		{name: "image outside the allowlist", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Image = "evil.example.com/miner:1" },
			claims: rwx, wantRules: []string{RuleImages},
			wantErr: []string{`spec.template.spec.containers[0].image: Forbidden: container "agent": image "evil.example.com/miner:1" (evil.example.com/miner:1) is not allowed; allowed: the source Deployment's and profiles' images`}},
		{name: "image allowed by glob, normalized", cfg: "policy:\n  images:\n    allow: ['busybox:1.*']\n",
			mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Image = "docker.io/library/busybox:1.36" }, claims: rwx},
		{name: "glob does not cross a slash", cfg: "policy:\n  images:\n    allow: ['ghcr.io/paperclipai/*']\n",
			mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Image = "ghcr.io/paperclipai/x/y:1" },
			claims: rwx, wantRules: []string{RuleImages}, wantErr: []string{"allowed: ghcr.io/paperclipai/*, the source"}},
		{name: "init container image checked too", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "alpine:3", SecurityContext: j.Spec.Template.Spec.Containers[0].SecurityContext}}
		}, claims: rwx, wantRules: []string{RuleImages}, wantErr: []string{`initContainers[0].image: Forbidden: container "setup"`}},
		{name: "digest required", cfg: "policy:\n  images:\n    requireDigest: true\n", claims: rwx,
			wantRules: []string{RuleImages}, wantErr: []string{"must be referenced by digest"}},
		{name: "mutable tag warns", cfg: "policy:\n  images:\n    allow: [busybox]\n", claims: rwx,
			mutate:   func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Image = "busybox" },
			wantWarn: []string{`image "busybox" uses the mutable tag latest`}},
		{name: "privileged container", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
		}, claims: rwx, wantRules: []string{RulePodSecurity}, wantErr: []string{`violates PodSecurity "restricted:latest": privileged (container "agent" must not set securityContext.privileged=true)`}},
		{name: "hostPath and hostNetwork", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.HostNetwork = true
			j.Spec.Template.Spec.Volumes = append(j.Spec.Template.Spec.Volumes, corev1.Volume{Name: "host",
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, claims: rwx, wantRules: []string{RulePodSecurity}, wantErr: []string{"host namespaces (hostNetwork=true)", `restricted volume type "hostPath"`}},
		{name: "added capability", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}, claims: rwx, wantRules: []string{RulePodSecurity}, wantErr: []string{"SYS_ADMIN"}},
		{name: "root user", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.SecurityContext.RunAsUser = ptr.To[int64](0)
		}, claims: rwx, wantRules: []string{RulePodSecurity}, wantErr: []string{"runAsUser=0"}},
		{name: "missing run id", mutate: func(j *batchv1.Job) { delete(j.Labels, "paperclip.io/run-id") }, claims: rwx,
			wantRules: []string{RuleLabels}, wantErr: []string{"metadata.labels[paperclip.io/run-id]: Required value"}},
		{name: "pod claims another agent", mutate: func(j *batchv1.Job) { j.Spec.Template.Labels["paperclip.io/agent-id"] = "other" }, claims: rwx,
			wantRules: []string{RuleLabels}, wantErr: []string{`spec.template.metadata.labels[paperclip.io/agent-id]: Invalid value: "other": must equal the Job's paperclip.io/agent-id "agent-7f3a"`}},
		{name: "wider egress profile", mutate: func(j *batchv1.Job) { j.Spec.Template.Labels["paperclip.io/egress-profile"] = "open-internet" }, claims: rwx,
			wantRules: []string{RuleLabels}, wantErr: []string{`profile "claude_local" assigns egress profile "anthropic"; a Job cannot choose its own`}},
		{name: "namespace not allowed", cfg: "policy:\n  namespaces: [agents]\n", claims: rwx,
			wantRules: []string{RuleNamespace}, wantErr: []string{`metadata.namespace: Forbidden: agent Jobs may run only in namespaces agents, not "paperclip"`}},
		{name: "claim missing", claims: func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumeclaims"}, name)
		}, wantRules: []string{RuleVolume}, wantErr: []string{`spec.template.spec.volumes[0].persistentVolumeClaim.claimName: Not found: "paperclip-data: no PersistentVolumeClaim \"paperclip-data\" in namespace paperclip`}},
		{name: "claim lookup fails", claims: func(string, string) (*corev1.PersistentVolumeClaim, error) {
			return nil, errors.New("connection refused")
		},
			wantRules: []string{RuleVolume}, wantErr: []string{"Internal error", "connection refused"}},
		{name: "claim not RWX warns", claims: func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			p, _ := rwx(ns, name)
			p.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
			return p, nil
		}, wantWarn: []string{"PersistentVolumeClaim paperclip/paperclip-data is not ReadWriteMany"}},
		{name: "offline: claim not given", undecided: "PersistentVolumeClaim paperclip/paperclip-data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := base.DeepCopy()
			if tt.mutate != nil {
				tt.mutate(job)
			}
			cfg := defaultCfg
			if tt.cfg != "" {
				cfg = mustConfig(t, tt.cfg)
			}
			d := Evaluate(Input{Operation: Create, Job: job, Config: cfg, SourceImages: []string{sourceImage}, Claims: tt.claims, HandedSecrets: handed(t).Whole, HandedKeys: handed(t).Keys})
			msg := ""
			if !d.Allowed() {
				msg = d.Errs.ToAggregate().Error()
			}
			if len(tt.wantErr) == 0 && !d.Allowed() {
				t.Fatalf("denied: %s", msg)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q\ndoes not contain %q", msg, w)
				}
			}
			if strings.Join(d.Failed, ",") != strings.Join(tt.wantRules, ",") {
				t.Errorf("failed rules %v, want %v", d.Failed, tt.wantRules)
			}
			if got := fmt.Sprint(d.Undecided); tt.undecided != "" && (len(d.Undecided) != 1 || d.Undecided[0].Fact != tt.undecided ||
				!strings.Contains(d.Undecided[0].WithoutIt, "Not found")) {
				t.Errorf("undecided %s, want one on %s saying the cluster would not find it", got, tt.undecided)
			}
			warn := strings.Join(d.Warnings, "\n")
			for _, w := range tt.wantWarn {
				if !strings.Contains(warn, w) {
					t.Errorf("warnings %q do not contain %q", warn, w)
				}
			}
			if len(tt.wantWarn) == 0 && len(d.Warnings) > 0 {
				t.Errorf("unexpected warnings %q", d.Warnings)
			}
		})
	}
}

// TestOnePodPerRun: an agent Job that could run more than one pod at once
// (in parallel, or a replacement beside a terminating pod), or whose pods
// are selected by hand, is refused; what the renderer sets passes.
func TestOnePodPerRun(t *testing.T) {
	runCreateCases(t, RuleOnePod, []createCase{
		{name: "parallel pods", mutate: func(j *batchv1.Job) { j.Spec.Parallelism = ptr.To[int32](6) }, want: "spec.parallelism: Invalid value: 6"},
		{name: "several completions", mutate: func(j *batchv1.Job) { j.Spec.Completions = ptr.To[int32](3) }, want: "spec.completions: Invalid value: 3"},
		{name: "replacement while terminating", mutate: func(j *batchv1.Job) { j.Spec.PodReplacementPolicy = nil }, want: "spec.podReplacementPolicy: Invalid value: \"unset (TerminatingOrFailed)\""},
		{name: "manual selector", mutate: func(j *batchv1.Job) { j.Spec.ManualSelector = ptr.To(true) }, want: "spec.manualSelector: Forbidden"},
		{name: "unset counts are one", mutate: func(j *batchv1.Job) { j.Spec.Parallelism, j.Spec.Completions = nil, nil }},
		// Another controller's Job would hold its agent's claim with no pod
		// and nothing to end it.
		{name: "another controller", mutate: func(j *batchv1.Job) { j.Spec.ManagedBy = ptr.To("example.com/elsewhere") },
			want: `spec.managedBy: Forbidden: an agent Job is run by the Job controller (kubernetes.io/job-controller), not "example.com/elsewhere"`},
		{name: "the Job controller named", mutate: func(j *batchv1.Job) { j.Spec.ManagedBy = ptr.To(batchv1.JobControllerName) }},
	})
}

// TestPodsCarryOnlyTheJobsContractLabels: a pod label the Job does not
// carry, or carries otherwise, is refused: the relay files a run under the
// company its pods name, and the egress policies select on them.
func TestPodsCarryOnlyTheJobsContractLabels(t *testing.T) {
	runCreateCases(t, RuleLabels, []createCase{
		{name: "another company on the pods", mutate: func(j *batchv1.Job) { j.Spec.Template.Labels[contract.LabelCompanyID] = "victim-co" },
			want: `spec.template.metadata.labels[paperclip.io/company-id]: Invalid value: "victim-co": must equal the Job's`},
		{name: "a label on the pods only", mutate: func(j *batchv1.Job) { j.Spec.Template.Labels[contract.LabelSessionID] = "s9" },
			want: "spec.template.metadata.labels[paperclip.io/session-id]: Forbidden: the Job does not carry paperclip.io/session-id"},
		{name: "a task the Job names otherwise", mutate: func(j *batchv1.Job) {
			j.Labels[contract.LabelTaskID], j.Spec.Template.Labels[contract.LabelTaskID] = "t1", "t2"
		}, want: `spec.template.metadata.labels[paperclip.io/task-id]: Invalid value: "t2": must equal the Job's paperclip.io/task-id "t1"`},
		{name: "the Job's label missing on the pods", mutate: func(j *batchv1.Job) { j.Labels[contract.LabelSessionID] = "s1" },
			want: `spec.template.metadata.labels[paperclip.io/session-id]: Invalid value: ""`},
		{name: "other labels are the Job's business", mutate: func(j *batchv1.Job) { j.Spec.Template.Labels["team"] = "x" }},
	})
}

// TestSandboxIsTheProfiles: a Job cannot swap the sandbox its profile
// sets (the sandbox-enforced fixture: gVisor, a ServiceAccount, no token,
// the agent pool and its toleration), pick its node, or tolerate every
// taint.
func TestSandboxIsTheProfiles(t *testing.T) {
	c := golden.Case(t, "sandbox-enforced")
	res, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	runCasesOn(t, RuleSandbox, res.Job, c.Config, []createCase{
		{name: "runtime class swapped", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.RuntimeClassName = ptr.To("runc") },
			want: `spec.template.spec.runtimeClassName: Invalid value: "runc": must be gvisor`},
		{name: "the server's ServiceAccount", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.ServiceAccountName = "paperclip-server" },
			want: `spec.template.spec.serviceAccountName: Invalid value: "paperclip-server": must be agent-runner`},
		{name: "a mounted token", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.AutomountServiceAccountToken = ptr.To(true) },
			want: `spec.template.spec.automountServiceAccountToken: Invalid value: "true": must be false`},
		{name: "another pool", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.NodeSelector["pool"] = "control-plane" },
			want: `spec.template.spec.nodeSelector[pool]: Invalid value: "control-plane": must be agents`},
		{name: "an extra toleration", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.Tolerations = append(j.Spec.Template.Spec.Tolerations, corev1.Toleration{Key: "gpu", Operator: corev1.TolerationOpExists})
		}, want: "spec.template.spec.tolerations[1]: Forbidden: not among the profile's tolerations"},
		{name: "every taint tolerated", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}, want: "spec.template.spec.tolerations[0]: Forbidden: a toleration without a key tolerates every taint"},
		{name: "a node picked by name", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.NodeName = "control-plane-1" },
			want: "spec.template.spec.nodeName: Forbidden"},
		{name: "a node selector entry of its own", mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.NodeSelector["zone"] = "a" }},
	})
}

// TestServerCredentialsRefused: env under a denied name in any container
// is refused on the final Job (the renderer drops it; this holds if
// mutation failed open).
func TestServerCredentialsRefused(t *testing.T) {
	runCreateCases(t, RuleCredentials, []createCase{
		{name: "the database URL in the Job's env", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Env = append(j.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "DATABASE_URL", Value: "postgres://x"})
		}, want: "spec.template.spec.containers[0].env["},
		{name: "an auth secret in an init container", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: sourceImage,
				SecurityContext: j.Spec.Template.Spec.Containers[0].SecurityContext, Env: []corev1.EnvVar{{Name: "BETTER_AUTH_SECRET", Value: "x"}}}}
		}, want: "spec.template.spec.initContainers[0].env[0]: Forbidden: BETTER_AUTH_SECRET is the Paperclip server's"},
		{name: "other env is the Job's", mutate: func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Env = append(j.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "TASK", Value: "x"})
		}},
	})
}

func TestEvaluateUpdate(t *testing.T) {
	old := renderedJob(t)
	cfg := mustConfig(t, "")
	tests := []struct {
		name    string
		mutate  func(j *batchv1.Job)
		wantErr string
	}{
		{"label added by a controller", func(j *batchv1.Job) { j.Labels["team"] = "x" }, ""},
		{"agent changed", func(j *batchv1.Job) { j.Labels["paperclip.io/agent-id"] = "agent-other" },
			`metadata.labels[paperclip.io/agent-id]: Invalid value: "agent-other": is immutable (was "agent-7f3a")`},
		{"agent removed", func(j *batchv1.Job) { delete(j.Labels, "paperclip.io/agent-id") }, "is immutable"},
		{"run changed", func(j *batchv1.Job) { j.Labels["paperclip.io/run-id"] = "r2" }, "paperclip.io/run-id"},
		{"suspend toggled", func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(false) }, ""},
		{"template changed while suspended", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}, "spec.template: Forbidden: the pod template of an agent Job is fixed once admitted"},
		{"egress label widened on the template", func(j *batchv1.Job) { j.Spec.Template.Labels["paperclip.io/egress-profile"] = "open" }, "spec.template: Forbidden"},
		{"parallelism patched up on a running run", func(j *batchv1.Job) { j.Spec.Parallelism = ptr.To[int32](6) },
			"spec.parallelism: Invalid value: 6: an agent run is one pod"},
		{"replacement policy loosened", func(j *batchv1.Job) { j.Spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed) },
			`spec.podReplacementPolicy: Invalid value: "TerminatingOrFailed": must be Failed`},
		{"parallelism 0 pauses the run", func(j *batchv1.Job) { j.Spec.Parallelism = ptr.To[int32](0) }, ""},
		// The adapter type picks the profile the start timeout comes from.
		{"adapter type changed", func(j *batchv1.Job) { j.Labels["paperclip.io/adapter-type"] = "nonexistent" },
			`metadata.labels[paperclip.io/adapter-type]: Invalid value: "nonexistent": is immutable (was "claude_local")`},
		{"company added", func(j *batchv1.Job) { j.Labels["paperclip.io/task-id"] = "t-9" }, "metadata.labels[paperclip.io/task-id]"},
		{"a deadline set", func(j *batchv1.Job) { j.Spec.ActiveDeadlineSeconds = ptr.To[int64](600) }, ""},
	}
	withDeadline := old.DeepCopy()
	withDeadline.Spec.ActiveDeadlineSeconds = ptr.To[int64](600)
	for _, tt := range []struct {
		name    string
		seconds *int64
		wantErr string
	}{
		{"deadline lowered (how the claim controller ends a run that never started)", ptr.To[int64](60), ""},
		{"deadline raised", ptr.To[int64](99999), "spec.activeDeadlineSeconds: Forbidden: may be lowered, not raised or removed (it is 600)"},
		{"deadline removed", nil, "spec.activeDeadlineSeconds: Forbidden"},
	} {
		job := withDeadline.DeepCopy()
		job.Spec.ActiveDeadlineSeconds = tt.seconds
		d := Evaluate(Input{Operation: Update, Job: job, Old: withDeadline, Config: cfg})
		if got := d.Errs.ToAggregate(); (tt.wantErr == "") != (got == nil) || (got != nil && !strings.Contains(got.Error(), tt.wantErr)) {
			t.Errorf("%s: got %v, want %q", tt.name, got, tt.wantErr)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := old.DeepCopy()
			tt.mutate(job)
			d := Evaluate(Input{Operation: Update, Job: job, Old: old, Config: cfg})
			if tt.wantErr == "" {
				if !d.Allowed() {
					t.Fatalf("denied: %v", d.Errs)
				}
				return
			}
			if d.Allowed() || !strings.Contains(d.Errs.ToAggregate().Error(), tt.wantErr) {
				t.Errorf("got %v, want %q", d.Errs, tt.wantErr)
			}
		})
	}
	// A Job admitted before the one-pod rule still takes its unsuspend.
	legacy := old.DeepCopy()
	legacy.Spec.PodReplacementPolicy, legacy.Spec.Suspend = nil, ptr.To(true)
	started := legacy.DeepCopy()
	started.Spec.Suspend = ptr.To(false)
	if d := Evaluate(Input{Operation: Update, Job: started, Old: legacy, Config: cfg}); !d.Allowed() {
		t.Errorf("an unchanged pod shape was judged on UPDATE: %v", d.Errs)
	}
	// A plain Job gaining the agent label is a change of agent too.
	plain := old.DeepCopy()
	delete(plain.Labels, "paperclip.io/agent-id")
	d := Evaluate(Input{Operation: Update, Job: old, Old: plain, Config: cfg})
	if d.Allowed() {
		t.Error("adding paperclip.io/agent-id on UPDATE was allowed")
	}
}

// TestEveryRenderedFixturePasses: whatever a client asks for, what the
// mutating webhook renders satisfies the policy, Pod Security included.
func TestEveryRenderedFixturePasses(t *testing.T) {
	for _, c := range golden.Cases(t) {
		res, err := c.Render()
		if err != nil {
			continue // refused by the mutating webhook already
		}
		d := Evaluate(Input{Operation: Create, Job: res.Job, Config: c.Config,
			SourceImages: []string{c.Source.Spec.Template.Spec.Containers[len(c.Source.Spec.Template.Spec.Containers)-1].Image}, Claims: rwx,
			HandedSecrets: handed(t).Whole, HandedKeys: handed(t).Keys})
		if !d.Allowed() {
			t.Errorf("%s: rendered Job denied: %v", c.Name, d.Errs)
		}
	}
}

// createCase is a rendered Job changed by mutate, evaluated on CREATE:
// allowed when want is empty, else refused by rule with a message that
// contains want.
type createCase struct {
	name   string
	mutate func(j *batchv1.Job)
	want   string
}

func runCreateCases(t *testing.T, rule string, cases []createCase) {
	t.Helper()
	runCasesOn(t, rule, renderedJob(t), mustConfig(t, ""), cases)
}

// runCasesOn runs cases against rendered, a Job rendered under cfg.
func runCasesOn(t *testing.T, rule string, rendered *batchv1.Job, cfg *config.Config, cases []createCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := rendered.DeepCopy()
			tc.mutate(job)
			d := Evaluate(Input{Operation: Create, Job: job, Config: cfg, SourceImages: []string{sourceImage}, Claims: rwx, HandedSecrets: handed(t).Whole, HandedKeys: handed(t).Keys})
			if tc.want == "" {
				if !d.Allowed() {
					t.Fatalf("denied: %v", d.Errs)
				}
				return
			}
			if d.Allowed() || !strings.Contains(d.Errs.ToAggregate().Error(), tc.want) || !slices.Contains(d.Failed, rule) {
				t.Errorf("got %v (failed %v), want %q from rule %s", d.Errs, d.Failed, tc.want, rule)
			}
		})
	}
}

// The run's env Secret must exist and be made for this run.
func TestRunEnvSecret(t *testing.T) {
	job := renderedJob(t)
	job.Annotations[contract.AnnotationEnvSecret] = "run-env"
	run, agent := job.Labels[contract.LabelRunID], job.Labels[contract.LabelAgentID]
	cfg := mustConfig(t, "")
	expected := "run-env"
	lookup := func(labels map[string]string, err error, owners ...metav1.OwnerReference) SecretMeta {
		return func(ns, name string) (*metav1.ObjectMeta, error) {
			if ns != job.Namespace || name != expected {
				t.Errorf("looked up %s/%s", ns, name)
			}
			return &metav1.ObjectMeta{Labels: labels, OwnerReferences: owners}, err
		}
	}
	notFound := apierrors.NewNotFound(corev1.Resource("secrets"), "run-env")
	for _, tc := range []struct {
		name, secret, cfg string
		uid               types.UID
		lookup            SecretMeta
		wantErr           string
		warn              string
		undecided         bool
	}{
		{name: "made for this run", lookup: lookup(map[string]string{contract.LabelRunID: run, contract.LabelAgentID: agent}, nil)},
		// A run id is the client's choice: another agent's run with the same
		// id must not take this Secret.
		{name: "the same run id, another agent", lookup: lookup(map[string]string{contract.LabelRunID: run, contract.LabelAgentID: "agent-other"}, nil),
			wantErr: `paperclip.io/agent-id="agent-other", not this run's`},
		{name: "missing", lookup: lookup(nil, notFound), wantErr: `metadata.annotations[paperclip.io/env-secret]: Not found: "run-env: no Secret \"run-env\" in namespace paperclip; create the run's Secret (labeled paperclip.io/run-id=` + run},
		{name: "another run's", lookup: lookup(map[string]string{contract.LabelRunID: "other-run"}, nil), wantErr: `Forbidden: Secret run-env is labeled paperclip.io/run-id="other-run"`},
		// A finished run's Secret, kept until its Job's TTL: a Job copying
		// that run's ids does not get its callback token.
		{name: "labeled for this run, owned by another Job", lookup: lookup(map[string]string{contract.LabelRunID: run, contract.LabelAgentID: agent}, nil,
			metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "run-earlier", UID: "uid-earlier"}),
			wantErr: "Secret run-env belongs to Job run-earlier (its owner), another run"},
		// A queued run judged again when it starts may own its Secret
		// already: that owner is the run itself (same UID), not another.
		{name: "owned by this very Job (the start check)", uid: "uid-this", lookup: lookup(map[string]string{contract.LabelRunID: run, contract.LabelAgentID: agent}, nil,
			metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: "uid-this"})},
		{name: "owned by a Job of the same name, another UID", uid: "uid-this", lookup: lookup(map[string]string{contract.LabelRunID: run, contract.LabelAgentID: agent}, nil,
			metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: "uid-before"}),
			wantErr: "(its owner), another run"},
		{name: "the server's", lookup: lookup(map[string]string{"app": "paperclip"}, nil), wantErr: `labeled paperclip.io/run-id=""`},
		// Named for its Job ("<job>-<word>"), the run id alone makes it the
		// run's: Paperclip's adapters label their Secrets so.
		{name: "named for the Job, run id only", secret: job.Name + "-env", lookup: lookup(map[string]string{contract.LabelRunID: run}, nil)},
		// More than one word after the Job's name would let a Job named
		// like a prefix of another run's Job take that run's Secret.
		{name: "named after a prefix of the Job", secret: job.Name + "-x-env", lookup: lookup(map[string]string{contract.LabelRunID: run}, nil),
			wantErr: "not this run's"},
		{name: "named for the Job, another run", secret: job.Name + "-env", lookup: lookup(map[string]string{contract.LabelRunID: "other"}, nil),
			wantErr: "not this run's"},
		// A shared Secret is never a run's: its Job would own and delete it.
		{name: "a shared Secret as the run's", secret: "llm-key", cfg: "policy: {secrets: {shared: [llm-*]}}",
			lookup: lookup(map[string]string{contract.LabelRunID: run, contract.LabelAgentID: agent}, nil), wantErr: "is shared (policy.secrets.shared)"},
		// Not there yet: refused, unless the config lets a Secret named for
		// its Job come after it, as Paperclip's Kubernetes plugin does.
		{name: "named for the Job, not there", secret: job.Name + "-env", lookup: lookup(nil, notFound),
			wantErr: "or set policy.secrets.createdAfterJob: true"},
		{name: "named for the Job, after it", secret: job.Name + "-env", cfg: "policy: {secrets: {createdAfterJob: true}}",
			lookup: lookup(nil, notFound), warn: "does not exist yet (policy.secrets.createdAfterJob)"},
		{name: "another name, after the Job", cfg: "policy: {secrets: {createdAfterJob: true}}", lookup: lookup(nil, notFound), wantErr: "Not found"},
		{name: "no lookup", lookup: nil, undecided: true},
	} {
		name := "run-env"
		if tc.secret != "" {
			name = tc.secret
		}
		job := job.DeepCopy()
		job.Annotations[contract.AnnotationEnvSecret] = name
		job.UID = tc.uid
		cfg := cfg
		if tc.cfg != "" {
			cfg = mustConfig(t, tc.cfg)
		}
		expected = name
		d := Evaluate(Input{Operation: Create, Job: job, Config: cfg, SecretMeta: tc.lookup, Claims: rwx, HandedSecrets: handed(t).Whole, HandedKeys: handed(t).Keys})
		if tc.undecided != (len(d.Undecided) == 1) {
			t.Errorf("%s: undecided %v", tc.name, d.Undecided)
		}
		got := ""
		for _, e := range d.Errs {
			if strings.Contains(e.Field, "env-secret") {
				got = e.Error()
			}
		}
		if (tc.wantErr == "") != (got == "") || !strings.Contains(got, tc.wantErr) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.wantErr)
		}
		if tc.warn != "" && !strings.Contains(strings.Join(d.Warnings, "\n"), tc.warn) {
			t.Errorf("%s: warnings %v", tc.name, d.Warnings)
		}
	}
}

// A Job's own references to Secrets of the namespace are held to the run
// Secrets' rule: any but those clipjob shares from the source must be
// labeled for the run, whatever the route.
func TestJobsOwnSecretReferences(t *testing.T) {
	labels := map[string]map[string]string{"run-own": {contract.LabelRunID: "run-01jd8x", contract.LabelAgentID: "agent-7f3a"}}
	lookup := func(_, name string) (*metav1.ObjectMeta, error) {
		return &metav1.ObjectMeta{Labels: labels[name]}, nil
	}
	for _, tc := range []struct {
		name   string
		mutate func(*batchv1.Job)
		want   string
	}{
		{"envFrom of the namespace's Secret", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].EnvFrom = append(j.Spec.Template.Spec.Containers[0].EnvFrom,
				corev1.EnvFromSource{Prefix: "X_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "server-db"}}})
		}, "envFrom"},
		{"a secret volume", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Volumes = append(j.Spec.Template.Spec.Volumes, corev1.Volume{Name: "x",
				VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "server-db"}}})
		}, "volumes"},
		{"a projected one", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Volumes = append(j.Spec.Template.Spec.Volumes, corev1.Volume{Name: "x",
				VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "server-db"}}}}}}})
		}, "projected"},
		{"a key under another name", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Env = append(j.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "INNOCENT",
				ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "server-db"}, Key: "url"}}})
		}, "secretKeyRef"},
		{"the run's own, labeled", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Volumes = append(j.Spec.Template.Spec.Volumes, corev1.Volume{Name: "x",
				VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "run-own"}}})
		}, ""},
		// Shared by config: referenced as it is, no run label needed.
		{"a shared Secret by envFrom", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].EnvFrom = append(j.Spec.Template.Spec.Containers[0].EnvFrom,
				corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "llm-key"}, Optional: ptr.To(true)}})
		}, ""},
		// ... but never the server's own, whatever the config lists.
		{"the server's credentials, listed as shared", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].EnvFrom = append(j.Spec.Template.Spec.Containers[0].EnvFrom,
				corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "server-db-shared"}}})
		}, "server-db-shared holds the Paperclip server's credentials"},
	} {
		job := renderedJob(t)
		tc.mutate(job)
		cfg := mustConfig(t, "policy: {secrets: {shared: [llm-key, server-db-shared]}}")
		d := Evaluate(Input{Operation: Create, Job: job, Config: cfg, Claims: rwx, SecretMeta: lookup, HandedSecrets: handed(t).Whole, HandedKeys: handed(t).Keys,
			ServerSecrets: []string{"server-db-shared"}, SourceImages: []string{job.Spec.Template.Spec.Containers[0].Image}})
		got := d.Errs.ToAggregate()
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%s: refused: %v", tc.name, got)
		case tc.want != "" && (got == nil || !strings.Contains(got.Error(), tc.want) || !strings.Contains(got.Error(), "server-db")):
			t.Errorf("%s: want a refusal at %s naming server-db, got %v", tc.name, tc.want, got)
		}
	}
}

// TestCreatorIsTheCreatingUser: the created-by annotation is how a client
// tells its own runs from a Job that copied their labels, so a Job may
// not name another creator, and nobody may rewrite it afterwards.
// TestRunSecretIsFixedOnceAdmitted: the env Secret a Job names was checked
// at admission and comes to be owned by the Job; an UPDATE naming another
// (the server's) is refused.
func TestRunSecretIsFixedOnceAdmitted(t *testing.T) {
	old := renderedJob(t)
	old.Annotations[contract.AnnotationEnvSecret] = old.Name + "-env"
	job := old.DeepCopy()
	job.Annotations[contract.AnnotationEnvSecret] = "paperclip-db"
	d := Evaluate(Input{Operation: Update, Job: job, Old: old, Config: mustConfig(t, "")})
	if d.Allowed() || !strings.Contains(d.Errs.ToAggregate().Error(), "env-secret]: Invalid value: \"paperclip-db\": is immutable") {
		t.Errorf("changing the env Secret after admission: %v", d.Errs.ToAggregate())
	}
	if d := Evaluate(Input{Operation: Update, Job: old.DeepCopy(), Old: old, Config: mustConfig(t, "")}); !d.Allowed() {
		t.Errorf("an UPDATE that keeps it: %v", d.Errs.ToAggregate())
	}
}

func TestCreatorIsTheCreatingUser(t *testing.T) {
	const server = "system:serviceaccount:paperclip:paperclip"
	cfg := mustConfig(t, "")
	withCreator := func(who string) *batchv1.Job {
		j := renderedJob(t)
		if who != "" {
			j.Annotations[contract.AnnotationCreatedBy] = who
		}
		return j
	}
	creatorErrs := func(d *Decision) string {
		var msgs []string
		for _, e := range d.Errs {
			if strings.Contains(e.Field, contract.AnnotationCreatedBy) {
				msgs = append(msgs, e.Error())
			}
		}
		return strings.Join(msgs, "; ")
	}
	for _, tt := range []struct {
		name    string
		in      Input
		wantErr string
	}{
		{"created by the user it names", Input{Operation: Create, Job: withCreator(server), User: server}, ""},
		{"naming the Paperclip server while another user creates it",
			Input{Operation: Create, Job: withCreator(server), User: "system:serviceaccount:tenant:ci"},
			`metadata.annotations[clipjob.paperclip.io/created-by]: Invalid value: "system:serviceaccount:paperclip:paperclip": must be the creating user "system:serviceaccount:tenant:ci"`},
		{"no creator recorded (the mutating webhook did not run)", Input{Operation: Create, Job: withCreator(""), User: server},
			"must be the creating user"},
		{"offline check: no user to compare", Input{Operation: Create, Job: withCreator("anyone")}, ""},
		{"update keeps it", Input{Operation: Update, Job: withCreator(server), Old: withCreator(server), User: "system:serviceaccount:kube-system:job-controller"}, ""},
		{"update rewrites it", Input{Operation: Update, Job: withCreator("system:serviceaccount:tenant:ci"), Old: withCreator(server), User: "system:serviceaccount:tenant:ci"},
			`is immutable (was "system:serviceaccount:paperclip:paperclip")`},
		{"update adds it to a Job admitted without one", Input{Operation: Update, Job: withCreator(server), Old: withCreator("")},
			`is immutable (was "")`},
		{"update removes it", Input{Operation: Update, Job: withCreator(""), Old: withCreator(server)}, "is immutable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Config = cfg
			got := creatorErrs(Evaluate(tt.in))
			if (tt.wantErr == "") != (got == "") || !strings.Contains(got, tt.wantErr) {
				t.Errorf("creator errors %q, want %q", got, tt.wantErr)
			}
		})
	}
}
