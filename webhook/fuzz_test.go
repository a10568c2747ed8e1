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

	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

func fuzzMutator(f *testing.F) *Mutator {
	c := golden.Case(f, "alias-adapter-label")
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		f.Fatal(err)
	}
	return &Mutator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}}
}

// FuzzMutateObject feeds arbitrary bytes as the Job of a CREATE request to
// the handler directly (no panic recovery in between): it must answer, and
// an allowed answer's patch must apply to the request.
func FuzzMutateObject(f *testing.F) {
	m := fuzzMutator(f)
	for _, c := range golden.Cases(f) {
		raw, _ := json.Marshal(c.Job)
		f.Add(raw)
	}
	f.Add([]byte(`{"metadata":{"labels":{"paperclip.io/agent-id":"a"}},"spec":{"template":{"spec":{"containers":[{}]}}}}`))
	f.Add([]byte(`{"metadata":{"labels":{"paperclip.io/agent-id":"a"}},"spec":{"template":{"metadata":{"annotations":{"paperclip.io/prompt-secret":"/"}}}}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		resp := m.Handle(context.Background(), createRequest(t, raw))
		if resp.Allowed && len(resp.Patches) > 0 {
			applyPatch(t, raw, resp)
		}
		if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
			t.Fatalf("denial without a message")
		}
	})
}

// FuzzAdmissionReview feeds arbitrary bytes as the HTTP body the API server
// would send: the server must answer with a well-formed AdmissionReview or
// an HTTP error, never panic.
func FuzzAdmissionReview(f *testing.F) {
	m := fuzzMutator(f)
	hook := (&admission.Webhook{Handler: m}).WithRecoverPanic(false)
	for _, name := range []string{"alias-adapter-label", "apiserver-defaulted", "client-resources-kept"} {
		c := golden.Case(f, name)
		raw, _ := json.Marshal(c.Job)
		ar := createRequest(f, raw).AdmissionRequest
		review, _ := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request:  &ar,
		})
		f.Add(review)
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		hook.ServeHTTP(w, req)
		if w.Code == http.StatusOK {
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
				t.Fatalf("HTTP 200 with a malformed review: %v %q", err, w.Body.String())
			}
		}
	})
}

// FuzzValidateObject feeds arbitrary bytes as the Job, and as the stored
// Job on UPDATE, to the validating handler directly: it must answer, and a
// refusal must say why. The claim is written to a fake API.
func FuzzValidateObject(f *testing.F) {
	job, v, _ := renderedCase(f)
	raw := mustJSON(job)
	f.Add(raw, []byte(nil), false)
	f.Add(raw, raw, true)
	f.Add([]byte(`{"metadata":{"labels":{"paperclip.io/agent-id":"a"}},"spec":{"parallelism":6}}`), raw, true)
	f.Add([]byte(`{"metadata":{"labels":{"paperclip.io/agent-id":""}}}`), []byte(`null`), true)
	f.Add([]byte(`null`), []byte(`{`), true)
	f.Fuzz(func(t *testing.T, obj, old []byte, update bool) {
		req := validateRequest(t, admissionv1.Create, job, nil, false)
		req.Object.Raw = obj
		if update {
			req.Operation, req.OldObject.Raw = admissionv1.Update, old
		}
		resp := v.Handle(context.Background(), req)
		if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
			t.Fatalf("refusal without a message")
		}
	})
}
