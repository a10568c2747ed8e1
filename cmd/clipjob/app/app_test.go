package app

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/doctor"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestRenderGolden runs `clipjob render` over the shared render fixtures:
// the CLI must print what the core and the webhook produce.
func TestRenderGolden(t *testing.T) {
	for _, c := range golden.Cases(t) {
		t.Run(c.Name, func(t *testing.T) {
			dir := t.TempDir()
			c.Job.APIVersion, c.Job.Kind = "batch/v1", "Job"
			c.Source.APIVersion, c.Source.Kind = "apps/v1", "Deployment"
			job := golden.WriteYAML(t, dir, "job.yaml", c.Job)
			src := golden.WriteYAML(t, dir, "source.yaml", c.Source)
			cfg := golden.WriteYAML(t, dir, "config.yaml", c.Config)
			var stdout, stderr bytes.Buffer
			code := Main([]string{"render", "-f", job, "--source", src, "--config", cfg}, nil, &stdout, &stderr)
			if _, wantErr := c.Render(); wantErr != nil {
				if code != 1 || !strings.Contains(stderr.String(), wantErr.Error()) {
					t.Fatalf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), wantErr)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			set, err := manifest.Read(&stdout)
			if err != nil || len(set.Jobs) != 1 {
				t.Fatalf("output is not one Job: %v", err)
			}
			var warnings []string
			for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if w, ok := strings.CutPrefix(line, "Warning: Job "+c.Job.Name+": "); ok {
					warnings = append(warnings, w)
				}
			}
			out := set.Jobs[0]
			golden.Compare(t, c.GoldenPath, golden.Format(out.Annotations[contract.AnnotationProfile], out, warnings, nil))
		})
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{nil, 2, "Usage:"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"render"}, 2, "render needs -f"},
		{[]string{"render", "--nope"}, 2, "flag provided but not defined"},
		{[]string{"render", "-f", "/does/not/exist.yaml", "--source", "/does/not/exist.yaml"}, 1, "no such file"},
		{[]string{"help"}, 0, "Usage:"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := Main(tt.args, nil, &stdout, &stderr)
		if code != tt.wantCode || !strings.Contains(stderr.String(), tt.wantErr) {
			t.Errorf("clipjob %v: exit %d stderr %q; want %d and %q", tt.args, code, stderr.String(), tt.wantCode, tt.wantErr)
		}
	}
}

func TestRenderFromStdinPassesOtherJobsThrough(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	dir := t.TempDir()
	c.Source.APIVersion, c.Source.Kind = "apps/v1", "Deployment"
	src := golden.WriteYAML(t, dir, "source.yaml", c.Source)
	in := `apiVersion: batch/v1
kind: Job
metadata: {name: plain}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: agent
  labels: {paperclip.io/agent-id: a1, paperclip.io/company-id: c1, paperclip.io/run-id: r1, paperclip.io/adapter-type: codex_local}
`
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"render", "-f", "-", "--source", src}, strings.NewReader(in), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	set, err := manifest.Read(&stdout)
	if err != nil || len(set.Jobs) != 2 {
		t.Fatalf("want 2 Jobs out: %v", err)
	}
	if _, ok := set.Jobs[0].Annotations[contract.AnnotationProfile]; ok {
		t.Error("a Job without the agent label was rendered")
	}
	if got := set.Jobs[1].Annotations[contract.AnnotationProfile]; got != "codex_local" {
		t.Errorf("agent Job rendered with profile %q", got)
	}
	if !strings.Contains(stderr.String(), "Job plain has no label paperclip.io/agent-id") {
		t.Errorf("stderr does not say the plain Job was left alone: %q", stderr.String())
	}
}

func TestRenderStrictManifest(t *testing.T) {
	dir := t.TempDir()
	job := filepath.Join(dir, "job.yaml")
	_ = os.WriteFile(job, []byte("apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec: {templte: {}}\n"), 0o644)
	var stdout, stderr bytes.Buffer
	code := Main([]string{"render", "-f", job, "--source", filepath.Join(golden.Dir(), "source.yaml")}, nil, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), `unknown field "spec.templte"`) {
		t.Errorf("exit %d stderr %q; want the misspelt field named", code, stderr.String())
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(golden.Dir(), "source.yaml")
	jobs := filepath.Join(dir, "jobs.yaml")
	_ = os.WriteFile(jobs, []byte(`apiVersion: batch/v1
kind: Job
metadata:
  name: good
  namespace: paperclip
  labels: {paperclip.io/agent-id: a1, paperclip.io/company-id: c1, paperclip.io/run-id: r1, paperclip.io/adapter-type: claude_local}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: evil
  namespace: paperclip
  labels: {paperclip.io/agent-id: a2, paperclip.io/company-id: c1, paperclip.io/run-id: r2}
spec:
  template:
    spec:
      containers: [{name: miner, image: "evil.example.com/miner:1"}]
`), 0o644)
	pvc := filepath.Join(dir, "pvc.yaml")
	_ = os.WriteFile(pvc, []byte(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: paperclip-data, namespace: paperclip}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`), 0o644)
	var stdout, stderr bytes.Buffer
	code := Main([]string{"check", "-f", jobs, "--source", src, "--pvc", pvc}, nil, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1 (one Job denied): %s", code, stderr.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "job/good: allowed") {
		t.Errorf("good Job not allowed:\n%s", out)
	}
	if !strings.Contains(out, `job/evil: denied by the validating webhook (403 Forbidden): spec.template.spec.containers[0].image: Forbidden: container "miner": image "evil.example.com/miner:1"`) {
		t.Errorf("evil Job's denial does not name container and image:\n%s", out)
	}
	if !strings.Contains(stderr.String(), "is not ReadWriteMany") {
		t.Errorf("the RWO claim was not warned about: %s", stderr.String())
	}

	// Without the claim's manifest the verdict hangs on it: undecided (exit
	// 3), naming the claim and what the cluster would answer without it,
	// not a guess either way.
	stdout.Reset()
	stderr.Reset()
	empty := filepath.Join(dir, "none.yaml")
	_ = os.WriteFile(empty, []byte("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: other, namespace: paperclip}\n"), 0o644)
	good := filepath.Join(dir, "good.yaml")
	_ = os.WriteFile(good, []byte(strings.Split(string(must(os.ReadFile(jobs))), "---")[0]), 0o644)
	code = Main([]string{"check", "-f", good, "--source", src, "--objects", empty}, nil, &stdout, &stderr)
	want := `job/good: undecided: PersistentVolumeClaim paperclip/paperclip-data was not given (add its manifest with --objects): without it the cluster refuses the Job (spec.template.spec.volumes[0].persistentVolumeClaim.claimName: Not found`
	if code != 3 || !strings.Contains(stdout.String(), want) {
		t.Errorf("missing claim: exit %d, want 3 and %q in:\n%s", code, want, stdout.String())
	}

	// Without the source, what the Job becomes is itself undecided: the
	// cluster would refuse it with a 503 when the source is missing.
	stdout.Reset()
	code = Main([]string{"check", "-f", good}, nil, &stdout, &stderr)
	want = "job/good: undecided: source Deployment paperclip/paperclip was not given (give its manifest with --source): without it the cluster refuses the Job (503 clipjob cannot complete agent Jobs"
	if code != 3 || !strings.Contains(stdout.String(), want) {
		t.Errorf("no source: exit %d, want 3 and %q in:\n%s", code, want, stdout.String())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestDoctorPrintsEachCheckAndItsFix(t *testing.T) {
	results := []doctor.Result{{Check: "ca-bundle", OK: true, Detail: "trusted"},
		{Check: "shared-volume", Detail: "PersistentVolumeClaim paperclip/data is [ReadWriteOnce]", Fix: "recreate it ReadWriteMany"}}
	var text bytes.Buffer
	if err := printResults(&text, results, "text"); err != nil {
		t.Fatal(err)
	}
	want := "ok   ca-bundle              trusted\nFAIL shared-volume          PersistentVolumeClaim paperclip/data is [ReadWriteOnce]\n" +
		"                            fix: recreate it ReadWriteMany\n"
	if text.String() != want {
		t.Errorf("text output:\n%s\nwant:\n%s", text.String(), want)
	}
	var js bytes.Buffer
	if err := printResults(&js, results, "json"); err != nil {
		t.Fatal(err)
	}
	var back []doctor.Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back) != 2 || back[1].OK || back[1].Fix == "" {
		t.Errorf("json output %s: %v", js.String(), err)
	}
	var stderr bytes.Buffer
	if code := Main([]string{"doctor", "-o", "yaml"}, nil, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "want text or json") {
		t.Errorf("doctor -o yaml: exit %d, %q", code, stderr.String())
	}
}

// `clipjob check` judges Pods, and the pods of Jobs that are no agent's,
// by the pod webhook's rule: only agent runs and the source's pods mount
// the shared claim.
func TestCheckJudgesPodsThatMountTheSharedClaim(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(golden.Dir(), "source.yaml")
	f := filepath.Join(dir, "workloads.yaml")
	_ = os.WriteFile(f, []byte(`apiVersion: v1
kind: Pod
metadata: {name: reader, namespace: paperclip, labels: {app: paperclip-server}}
spec:
  containers: [{name: c, image: busybox, volumeMounts: [{name: home, mountPath: /h, subPath: instances/default}]}]
  volumes: [{name: home, persistentVolumeClaim: {claimName: paperclip-data}}]
---
apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: paperclip}
spec:
  containers: [{name: c, image: busybox}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: nightly, namespace: paperclip}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox, volumeMounts: [{name: home, mountPath: /h}]}]
      volumes: [{name: home, persistentVolumeClaim: {claimName: paperclip-data}}]
`), 0o644)
	var stdout, stderr bytes.Buffer
	code := Main([]string{"check", "-f", f, "--source", src}, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s%s", code, out, stderr.String())
	}
	for _, want := range []string{
		`pod/reader: denied by the pod webhook (403 Forbidden): spec.volumes[0].persistentVolumeClaim.claimName: Forbidden: volume "home" mounts the shared claim "paperclip-data"`,
		`job/nightly: denied by the pod webhook (403 Forbidden): spec.volumes[0].persistentVolumeClaim.claimName: Forbidden`,
		"pod/plain: allowed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
