package decide_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/cmd/clipjob/app"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
	"github.com/paperclipai/clipjob/webhook"
)

// fixture is one Job and the cluster it is decided in, as files: what the
// CLI is given, and what the webhook's caches would hold.
type fixture struct {
	name    string
	jobFile string // holds the Job (other documents in it are ignored)
	cfgFile string // "" for the built-in configuration
	srcFile string
	objects []string
}

// verdict is what a client is told about a CREATE, up to the claim.
type verdict struct {
	Outcome  string // allowed, denied by the mutating/validating webhook
	Code     int32
	Message  string
	Warnings []string
}

// fixtures are every golden fixture, every hostile fixture and the real
// clients' Jobs under each of their configs.
func fixtures(t *testing.T) []fixture {
	t.Helper()
	tmp := t.TempDir()
	objects := filepath.Join("testdata", "objects.yaml")
	var out []fixture
	// configOf writes the Config document of file, if any, to its own
	// file: the CLI reads a config from a file of its own.
	configOf := func(file, fallback string) string {
		set := golden.ReadManifests(t, file)
		if len(set.Raw) == 0 {
			return fallback
		}
		p := filepath.Join(tmp, strings.ReplaceAll(file, string(filepath.Separator), "_")+".config.yaml")
		if err := os.WriteFile(p, set.Raw[0], 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sourceOf := func(file, fallback string) string {
		if len(golden.ReadManifests(t, file).Deployments) > 0 {
			return file
		}
		return fallback
	}
	goldenDir := golden.Dir()
	goldenCfg := configOf(filepath.Join(goldenDir, "config.yaml"), "")
	for _, c := range golden.Cases(t) {
		file := filepath.Join(goldenDir, "cases", c.Name+".yaml")
		out = append(out, fixture{name: "golden/" + c.Name, jobFile: file, cfgFile: configOf(file, goldenCfg),
			srcFile: sourceOf(file, filepath.Join(goldenDir, "source.yaml")), objects: []string{objects}})
	}
	hostile, _ := filepath.Glob(filepath.Join("testdata", "hostile", "*.yaml"))
	if len(hostile) < 10 {
		t.Fatalf("%d hostile fixtures; the table lost its hostile half", len(hostile))
	}
	for _, file := range hostile {
		out = append(out, fixture{name: "hostile/" + strings.TrimSuffix(filepath.Base(file), ".yaml"), jobFile: file,
			cfgFile: configOf(file, ""), srcFile: sourceOf(file, filepath.Join(goldenDir, "source.yaml")), objects: []string{objects}})
	}
	for _, rc := range realClients {
		for _, cfg := range []string{"config-busybox.yaml", rc.config} {
			out = append(out, fixture{name: "real/" + rc.file + "/" + cfg, jobFile: realFile(rc.file), cfgFile: realFile(cfg),
				srcFile: realFile("source.yaml"), objects: []string{realFile("objects.yaml")}})
		}
	}
	return out
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func realFile(name string) string { return filepath.Join("testdata", "real-clients", name) }

// realClients are the real Paperclip clients' Jobs and the documented
// config under which each is admitted as it is.
var realClients = []struct{ file, config string }{
	{"claude-job.json", "config-adapters.yaml"},
	{"claude-job-large.json", "config-adapters.yaml"},
	{"opencode-job.json", "config-adapters.yaml"},
	{"plugin-job.json", "config-plugin.yaml"},
}

// TestWebhookAndCLIAgree runs every fixture through the webhook's handlers
// (the mutating one, its patch applied, then the validating one) and
// through `clipjob check`, and holds the two to the same verdict, code,
// message and warnings.
func TestWebhookAndCLIAgree(t *testing.T) {
	outcomes := map[string]int{}
	for _, f := range fixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			web := throughWebhook(t, f)
			cli := throughCLI(t, f)
			if diff := cmp.Diff(web, cli); diff != "" {
				t.Errorf("the webhook and clipjob check disagree (-webhook +cli):\n%s", diff)
			}
			outcomes[web.Outcome]++
			if strings.HasPrefix(f.name, "hostile/") && web.Outcome == "allowed" && !neutralized[f.name] {
				t.Errorf("a hostile fixture was admitted (warnings %q)", web.Warnings)
			}
			// A fixture that says why it is refused is refused for that,
			// not for something else it happens to carry.
			if want := refusedFor(t, f.jobFile); want != "" && !strings.Contains(web.Message, want) {
				t.Errorf("%s: %s; want a refusal saying %q", web.Outcome, web.Message, want)
			}
		})
	}
	// The table must hold both answers, or agreeing proves little.
	if outcomes["allowed"] < 10 || outcomes["denied by the mutating webhook"] < 5 || outcomes["denied by the validating webhook"] < 5 {
		t.Errorf("outcomes %v: the fixtures no longer exercise both webhooks' refusals and admissions", outcomes)
	}
}

// refusedFor is what a fixture's first line says its refusal holds
// ("# refused: <text>"), or "".
func refusedFor(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	want, _ := strings.CutPrefix(first, "# refused: ")
	if want == first {
		return ""
	}
	return want
}

// neutralized are the hostile fixtures clipjob admits because the mutating
// webhook undoes the attack (golden pod-labels-only-the-jobs shows the
// result): the pods get exactly the Job's paperclip.io/ labels.
var neutralized = map[string]bool{"hostile/other-company-pods": true}

// cluster is what the webhook's caches hold for a fixture.
type cluster struct {
	cfg     *config.Config
	inh     *templates.Inherited
	srcErr  error
	secrets map[string]*corev1.Secret
	pvcs    map[string]*corev1.PersistentVolumeClaim
}

func clusterOf(t *testing.T, f fixture) cluster {
	t.Helper()
	c := cluster{cfg: config.Default(), secrets: map[string]*corev1.Secret{}, pvcs: map[string]*corev1.PersistentVolumeClaim{}}
	if f.cfgFile != "" {
		var err error
		if c.cfg, err = config.Load(f.cfgFile); err != nil {
			t.Fatal(err)
		}
	}
	src := golden.ReadManifests(t, f.srcFile)
	c.srcErr = fmt.Errorf("no source Deployment in %s", f.srcFile)
	for _, d := range src.Deployments {
		if d.Name == c.cfg.Source.Deployment {
			d.Namespace = c.cfg.Source.Namespace
			c.inh, c.srcErr = templates.InheritFromDeployment(d, c.cfg.Source)
		}
	}
	for _, file := range append([]string{f.srcFile}, f.objects...) {
		for _, o := range golden.ReadManifests(t, file).Others {
			switch o := o.(type) {
			case *corev1.Secret:
				c.secrets[o.Namespace+"/"+o.Name] = o
			case *corev1.PersistentVolumeClaim:
				c.pvcs[o.Namespace+"/"+o.Name] = o
			}
		}
	}
	return c
}

type staticConfig struct{ cfg *config.Config }

func (s staticConfig) Current() *config.Config { return s.cfg }

type staticSource struct {
	inh *templates.Inherited
	err error
}

func (s staticSource) Inherited(context.Context, *config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
	return s.inh, nil, s.err
}

func throughWebhook(t *testing.T, f fixture) verdict {
	t.Helper()
	ctx := context.Background()
	c := clusterOf(t, f)
	job := oneJob(t, f.jobFile)
	sources := staticSource{c.inh, c.srcErr}
	mutator := &webhook.Mutator{Configs: staticConfig{c.cfg}, Sources: sources}
	validator := &webhook.Validator{Configs: staticConfig{c.cfg}, Sources: sources, Claims: claim.NewLock(fake.NewClientset()),
		PVCs: func(_ context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
			if p, ok := c.pvcs[ns+"/"+name]; ok {
				return p, nil
			}
			return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
		},
		Secrets: func(_ context.Context, ns, name string) (*metav1.ObjectMeta, error) {
			if s, ok := c.secrets[ns+"/"+name]; ok {
				return &s.ObjectMeta, nil
			}
			return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
		},
	}
	raw := mustJSON(t, job)
	resp := mutator.Handle(ctx, request(job, raw))
	v := verdict{Warnings: resp.Warnings}
	if !resp.Allowed {
		v.Outcome, v.Code, v.Message = "denied by the mutating webhook", resp.Result.Code, resp.Result.Message
		return v
	}
	if len(resp.Patches) > 0 {
		ops := mustJSON(t, resp.Patches)
		patch, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			t.Fatal(err)
		}
		if raw, err = patch.Apply(raw); err != nil {
			t.Fatal(err)
		}
	}
	// The API server gives the Job its UID before validating admission.
	stored := &batchv1.Job{}
	if err := json.Unmarshal(raw, stored); err != nil {
		t.Fatal(err)
	}
	stored.UID = "3f1d2c4e-0000-4000-8000-000000000001"
	resp = validator.Handle(ctx, request(stored, mustJSON(t, stored)))
	v.Warnings = append(v.Warnings, resp.Warnings...)
	if !resp.Allowed {
		v.Outcome, v.Code, v.Message = "denied by the validating webhook", resp.Result.Code, resp.Result.Message
		return v
	}
	v.Outcome = "allowed"
	return v
}

func request(job *batchv1.Job, raw []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req-1", Operation: admissionv1.Create, Namespace: job.Namespace, Name: job.Name,
		Kind:   metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"},
		Object: runtime.RawExtension{Raw: raw},
	}}
}

func throughCLI(t *testing.T, f fixture) verdict {
	t.Helper()
	// The webhook knows every object; so is the CLI told.
	args := []string{"check", "-f", f.jobFile, "--source", f.srcFile, "--objects-complete"}
	for _, o := range f.objects {
		args = append(args, "--objects", o)
	}
	if f.cfgFile != "" {
		args = append(args, "--config", f.cfgFile)
	}
	var stdout, stderr bytes.Buffer
	code := app.Main(args, nil, &stdout, &stderr)
	job := oneJob(t, f.jobFile)
	prefix := "job/" + job.Name + ": "
	line := strings.TrimSuffix(stdout.String(), "\n")
	if strings.Count(stdout.String(), "\n") != 1 || !strings.HasPrefix(line, prefix) {
		t.Fatalf("clipjob check (exit %d) printed %q, want one verdict line; stderr:\n%s", code, stdout.String(), stderr.String())
	}
	line = strings.TrimPrefix(line, prefix)
	var v verdict
	for _, l := range strings.Split(stderr.String(), "\n") {
		if w, ok := strings.CutPrefix(l, "Warning: "+prefix); ok {
			v.Warnings = append(v.Warnings, w)
		}
	}
	switch {
	case line == "allowed" && code == 0:
		v.Outcome = "allowed"
	case strings.HasPrefix(line, "denied by the ") && code == 1:
		head, msg, _ := strings.Cut(line, "): ")
		var which, reason string
		if _, err := fmt.Sscanf(head, "denied by the %s webhook (%d %s", &which, &v.Code, &reason); err != nil {
			t.Fatalf("verdict %q: %v", line, err)
		}
		v.Outcome, v.Message = "denied by the "+which+" webhook", msg
	default:
		t.Fatalf("clipjob check exit %d: %q", code, line)
	}
	return v
}

func oneJob(t *testing.T, file string) *batchv1.Job {
	t.Helper()
	set := golden.ReadManifests(t, file)
	if len(set.Jobs) != 1 {
		t.Fatalf("%s: want one Job, found %d", file, len(set.Jobs))
	}
	return set.Jobs[0]
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
