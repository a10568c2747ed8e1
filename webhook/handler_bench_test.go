package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/internal/golden"
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
