package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

func benchCase(b *testing.B) (golden.Fixture, *Mutator, []byte) {
	c := golden.Case(b, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal(c.Job)
	return c, &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh, hashes: &templates.TemplateHashes{}}}, raw
}

// BenchmarkMutate is the mutating handler without HTTP: decode, render,
// marshal, JSON patch.
func BenchmarkMutate(b *testing.B) {
	_, m, raw := benchCase(b)
	req := createRequest(b, raw)
	b.ReportAllocs()
	for b.Loop() {
		if resp := m.Handle(context.Background(), req); !resp.Allowed || len(resp.Patches) == 0 {
			b.Fatal("not patched")
		}
	}
}

// BenchmarkMutateHTTP adds what the API server's call costs inside the
// process: the AdmissionReview decode and encode of controller-runtime.
func BenchmarkMutateHTTP(b *testing.B) {
	_, m, raw := benchCase(b)
	ar := createRequest(b, raw).AdmissionRequest
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: &ar})
	hook := &admission.Webhook{Handler: m}
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		hook.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatal(w.Code)
		}
	}
}

// benchValidator is the validating handler over a rendered claude_local
// Job, with the claim switched off (Disabled): what it costs besides the
// Lease write, which the API server's time dominates
// (docs/design/2026-11-23-admission-performance.md).
func benchValidator(b *testing.B) (*Validator, *batchv1.Job) {
	c, m, raw := benchCase(b)
	job := applyPatch(b, raw, m.Handle(context.Background(), createRequest(b, raw)))
	job.UID = "3f1d2c4e-0000-4000-8000-000000000001"
	cfg, err := config.Parse([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\npolicy: {concurrency: {mode: Disabled}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	inh, _, _ := m.Sources.Inherited(context.Background(), c.Config)
	pvc := &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}}}
	return &Validator{Configs: staticConfig{cfg}, Sources: staticSource{inh: inh},
		PVCs:    func(context.Context, string, string) (*corev1.PersistentVolumeClaim, error) { return pvc, nil },
		Secrets: func(context.Context, string, string) (*metav1.ObjectMeta, error) { return &metav1.ObjectMeta{}, nil }}, job
}

// BenchmarkValidate is the validating handler on CREATE, without HTTP.
func BenchmarkValidate(b *testing.B) {
	v, job := benchValidator(b)
	req := validateRequest(b, admissionv1.Create, job, nil, false)
	b.ReportAllocs()
	for b.Loop() {
		if resp := v.Handle(context.Background(), req); !resp.Allowed {
			b.Fatal(resp.Result.Message)
		}
	}
}

// BenchmarkValidateUpdate is an UPDATE of an admitted agent Job (the claim
// controller's and the Job controller's patches): the common call.
func BenchmarkValidateUpdate(b *testing.B) {
	v, job := benchValidator(b)
	updated := job.DeepCopy()
	updated.Finalizers = append(updated.Finalizers, "example.com/keep")
	req := validateRequest(b, admissionv1.Update, updated, job, false)
	b.ReportAllocs()
	for b.Loop() {
		if resp := v.Handle(context.Background(), req); !resp.Allowed {
			b.Fatal(resp.Result.Message)
		}
	}
}
