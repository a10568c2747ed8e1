package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
	"github.com/paperclipai/clipjob/templates"
)

type staticConfig struct{ cfg *config.Config }

func (s staticConfig) Current() *config.Config { return s.cfg }

// staticSource serves one Inherited; without hashes, the template hash is
// computed on every render.
type staticSource struct {
	inh    *templates.Inherited
	err    error
	hashes *templates.TemplateHashes
}

func (s staticSource) Inherited(context.Context, *config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
	return s.inh, s.hashes, s.err
}

func createRequest(t testing.TB, raw []byte) admission.Request {
	t.Helper()
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "uid-1",
		Operation: admissionv1.Create,
		Kind:      metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"},
		Namespace: "paperclip",
		Object:    runtime.RawExtension{Raw: raw},
	}}
}

func applyPatch(t testing.TB, raw []byte, resp admission.Response) *batchv1.Job {
	t.Helper()
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("applying patch: %v", err)
	}
	job := &batchv1.Job{}
	if err := json.Unmarshal(out, job); err != nil {
		t.Fatal(err)
	}
	return job
}

// TestMutatorGolden runs the webhook path over the render fixtures: the
// stored Job (request plus patch) must equal the golden file the core and
// the CLI are held to; errors must be denials carrying the same message.
func TestMutatorGolden(t *testing.T) {
	for _, c := range golden.Cases(t) {
		t.Run(c.Name, func(t *testing.T) {
			raw, err := json.Marshal(c.Job)
			if err != nil {
				t.Fatal(err)
			}
			inh, inhErr := templates.InheritFromDeployment(c.Source, c.Config.Source)
			m := &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh, err: inhErr}}
			resp := m.Handle(context.Background(), createRequest(t, raw))
			if _, wantErr := c.Render(); wantErr != nil {
				if resp.Allowed {
					t.Fatalf("allowed; want denial %q", wantErr)
				}
				if !strings.Contains(resp.Result.Message, wantErr.Error()) {
					t.Errorf("denial %q does not carry %q", resp.Result.Message, wantErr)
				}
				return
			}
			if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("want an allowed JSON patch, got %+v", resp.Result)
			}
			job := applyPatch(t, raw, resp)
			golden.Compare(t, c.GoldenPath, golden.Format(job.Annotations[contract.AnnotationProfile], job, resp.Warnings, nil))

			// Admitting the stored Job again is a no-op.
			again, _ := json.Marshal(job)
			resp2 := m.Handle(context.Background(), createRequest(t, again))
			if !resp2.Allowed || len(resp2.Patches) != 0 {
				t.Errorf("second admission patched again: %v", resp2.Patches)
			}
		})
	}
}

func TestMutatorSkipsAndRefuses(t *testing.T) {
	cases := golden.Cases(t)
	c := cases[0]
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	m := &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}}
	agent, _ := json.Marshal(c.Job)

	plain := c.Job.DeepCopy()
	delete(plain.Labels, contract.LabelAgentID)
	plainRaw, _ := json.Marshal(plain)

	update := createRequest(t, agent)
	update.Operation = admissionv1.Update
	pod := createRequest(t, []byte(`{"apiVersion":"v1","kind":"Pod"}`))
	pod.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

	missing := &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{err: &templates.SourceError{Source: "paperclip/paperclip", Reason: "not found"}}}

	tests := []struct {
		name        string
		m           *Mutator
		req         admission.Request
		wantAllowed bool
		wantCode    int32
		wantMsg     string
	}{
		{"Job without the agent label", m, createRequest(t, plainRaw), true, http.StatusOK, "not an agent Job"},
		{"UPDATE", m, update, true, http.StatusOK, "on CREATE only"},
		{"another kind", m, pod, true, http.StatusOK, "not /v1, Kind=Pod"},
		{"malformed object", m, createRequest(t, []byte(`{"metadata":`)), false, http.StatusBadRequest, "decoding Job"},
		{"empty object", m, createRequest(t, nil), false, http.StatusBadRequest, "no object"},
		{"wrong type in object", m, createRequest(t, []byte(`{"spec":{"backoffLimit":"six"}}`)), false, http.StatusBadRequest, "decoding Job"},
		{"source missing", missing, createRequest(t, agent), false, http.StatusServiceUnavailable,
			"clipjob cannot complete agent Jobs: source Deployment paperclip/paperclip: not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := tt.m.Handle(context.Background(), tt.req)
			if resp.Allowed != tt.wantAllowed || resp.Result.Code != tt.wantCode {
				t.Errorf("allowed %v code %d, want %v %d (%s)", resp.Allowed, resp.Result.Code, tt.wantAllowed, tt.wantCode, resp.Result.Message)
			}
			if !strings.Contains(resp.Result.Message, tt.wantMsg) {
				t.Errorf("message %q does not contain %q", resp.Result.Message, tt.wantMsg)
			}
			if len(resp.Patches) > 0 {
				t.Errorf("patched: %v", resp.Patches)
			}
		})
	}
}

// TestMutatorKeepsUnknownFields: a field this build's types do not know
// (a newer API server) must survive the patch.
func TestMutatorKeepsUnknownFields(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	inh, _ := templates.InheritFromDeployment(c.Source, c.Config.Source)
	m := &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}}
	raw, _ := json.Marshal(c.Job)
	var obj map[string]any
	_ = json.Unmarshal(raw, &obj)
	obj["spec"].(map[string]any)["futureField"] = map[string]any{"x": 1.0}
	raw, _ = json.Marshal(obj)
	resp := m.Handle(context.Background(), createRequest(t, raw))
	if !resp.Allowed {
		t.Fatal(resp.Result.Message)
	}
	for _, op := range resp.Patches {
		if op.Operation == "remove" || strings.Contains(op.Path, "futureField") {
			t.Errorf("patch touches what it did not render: %+v", op)
		}
	}
}

func TestMutatorDryRunSameAnswer(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	inh, _ := templates.InheritFromDeployment(c.Source, c.Config.Source)
	m := &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}}
	raw, _ := json.Marshal(c.Job)
	req := createRequest(t, raw)
	wet := m.Handle(context.Background(), req)
	req.DryRun = ptr.To(true)
	dry := m.Handle(context.Background(), req)
	if len(wet.Patches) == 0 {
		t.Fatal("no patch")
	}
	if diff := cmp.Diff(applyPatch(t, raw, wet), applyPatch(t, raw, dry)); diff != "" {
		t.Errorf("dry-run result differs from a real one (-real +dry):\n%s", diff)
	}
}

// In a tenant namespace a Job inherits nothing from the server: it is
// completed even with the source Deployment missing, with an emptyDir
// workspace, no pull secrets, DNS, env or secret volumes of the server's,
// its image from the profile; the claim and policy apply as anywhere.
func TestMutatorTenantNamespaceInheritsNothing(t *testing.T) {
	cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\nsource: {namespace: paperclip, deployment: paperclip, container: paperclip}\n" +
		"tenantNamespaces: [paperclip-*]\nprofiles:\n  claude_local:\n    image: ghcr.io/paperclipai/agent-runtime-claude:v1\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := &Mutator{Configs: staticConfig{cfg}, Sources: staticSource{err: &templates.SourceError{Source: "paperclip/paperclip", Reason: "not found"}}}
	job := jobs.MakeJob("run-t", "paperclip-acme").Agent("a").Run("run-t").Adapter("claude_local").Prompt("hi").Obj()
	raw, _ := json.Marshal(job)
	req := createRequest(t, raw)
	req.Namespace = "paperclip-acme"
	resp := m.Handle(context.Background(), req)
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("a tenant Job with the source missing: allowed %v, %s", resp.Allowed, resp.Result.Message)
	}
	got := applyPatch(t, raw, resp)
	spec := got.Spec.Template.Spec
	if len(spec.ImagePullSecrets) != 0 || spec.DNSConfig != nil || spec.Containers[0].Image != "ghcr.io/paperclipai/agent-runtime-claude:v1" {
		t.Errorf("tenant pod inherited: pull secrets %v, dns %v, image %s", spec.ImagePullSecrets, spec.DNSConfig, spec.Containers[0].Image)
	}
	workspace := false
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("tenant pod mounts the server's PVC %s", v.PersistentVolumeClaim.ClaimName)
		}
		workspace = workspace || (v.Name == templates.WorkspaceVolume && v.EmptyDir != nil)
	}
	if !workspace {
		t.Errorf("tenant pod volumes %v: want an emptyDir workspace", spec.Volumes)
	}
	if got.Annotations[contract.AnnotationSource] != "none (tenant namespace) " {
		t.Errorf("source annotation %q", got.Annotations[contract.AnnotationSource])
	}
	if want := `container "agent": profile "claude_local" expects env ANTHROPIC_API_KEY, which the Job does not set (a tenant namespace inherits nothing)`; !slices.Contains(resp.Warnings, want) {
		t.Errorf("warnings %q, want %q", resp.Warnings, want)
	}
}

// TestMutatorRecordsTheCreatingUser: the stored Job names the user the API
// server authenticated, whatever the client wrote there, and a
// re-invocation over the completed Job changes nothing.
func TestMutatorRecordsTheCreatingUser(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	inh, _ := templates.InheritFromDeployment(c.Source, c.Config.Source)
	m := &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}}
	job := c.Job.DeepCopy()
	if job.Annotations == nil {
		job.Annotations = map[string]string{}
	}
	job.Annotations[contract.AnnotationCreatedBy] = "system:serviceaccount:paperclip:paperclip"
	raw, _ := json.Marshal(job)
	req := createRequest(t, raw)
	req.UserInfo.Username = "system:serviceaccount:tenant:ci"
	resp := m.Handle(context.Background(), req)
	if !resp.Allowed {
		t.Fatal(resp.Result.Message)
	}
	stored := applyPatch(t, raw, resp)
	if got := stored.Annotations[contract.AnnotationCreatedBy]; got != "system:serviceaccount:tenant:ci" {
		t.Fatalf("created-by = %q, want the requesting user", got)
	}
	again, _ := json.Marshal(stored)
	req.Object.Raw = again
	if resp := m.Handle(context.Background(), req); len(resp.Patches) != 0 {
		t.Errorf("re-invocation over the completed Job patched it: %+v", resp.Patches)
	}
}
