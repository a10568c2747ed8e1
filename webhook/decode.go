package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/decide"
)

var jobKind = schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}

// agentRequest is an admission request about an agent Job, decoded.
type agentRequest struct {
	Job *batchv1.Job
	// Old is the stored Job on UPDATE, else nil.
	Old *batchv1.Job
}

// isAgentJob is what the mutator completes: a Job labeled as an agent run.
func isAgentJob(j *batchv1.Job) bool { return decide.Classify(j) == decide.AgentRun }

// claimsContract is what the validator checks: a Job carrying any
// paperclip.io/ label, on itself or on its pods (decide.Classify).
func claimsContract(j *batchv1.Job) bool { return decide.Classify(j) != decide.NotAgent }

// decodeAgentRequest is the first step of both handlers: it answers, with
// the outcome to count, every request that is not theirs (an operation
// outside ops, another kind, a Job that agent does not match) and every
// one that cannot be decoded. The webhook configurations already narrow
// what is sent; this is what makes a too-wide configuration harmless. On
// UPDATE the stored version counts too, so removing a label is itself
// checked.
func decodeAgentRequest(req admission.Request, verb string, agent func(*batchv1.Job) bool, ops ...admissionv1.Operation) (*agentRequest, *admission.Response, string) {
	skip := func(msg string) (*agentRequest, *admission.Response, string) {
		resp := admission.Allowed(msg)
		return nil, &resp, OutcomeSkipped
	}
	fail := func(err error) (*agentRequest, *admission.Response, string) {
		resp := admission.Errored(http.StatusBadRequest, err)
		return nil, &resp, OutcomeErrored
	}
	if !slices.Contains(ops, req.Operation) {
		names := make([]string, len(ops))
		for i, op := range ops {
			names[i] = string(op)
		}
		return skip(fmt.Sprintf("clipjob %s agent Jobs on %s only", verb, strings.Join(names, " and ")))
	}
	if gvk := schema.GroupVersionKind(req.Kind); gvk != jobKind {
		return skip(fmt.Sprintf("clipjob %s %s only, not %s", verb, jobKind, gvk))
	}
	ar := &agentRequest{}
	var err error
	if ar.Job, err = decodeJob(req.Object.Raw); err != nil {
		return fail(err)
	}
	if req.Operation == admissionv1.Update {
		if ar.Old, err = decodeJob(req.OldObject.Raw); err != nil {
			return fail(fmt.Errorf("old object: %w", err))
		}
	}
	if !agent(ar.Job) && (ar.Old == nil || !agent(ar.Old)) {
		return skip("not an agent Job: no label " + contract.LabelAgentID)
	}
	return ar, nil, ""
}

var errNoObject = errors.New("request has no object")

// decodeJob decodes a Job as the API server encodes it.
func decodeJob(raw []byte) (*batchv1.Job, error) {
	if len(raw) == 0 {
		return nil, errNoObject
	}
	job := &batchv1.Job{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, job); err != nil {
		return nil, fmt.Errorf("decoding Job: %w", err)
	}
	return job, nil
}

// nameOf names the Job of a request for a log line, parsing the object
// only then: it is not free on the hot path.
func nameOf(req admission.Request) string {
	if req.Name != "" {
		return req.Name
	}
	var meta struct {
		Metadata struct {
			Name         string `json:"name"`
			GenerateName string `json:"generateName"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(req.Object.Raw, &meta)
	if meta.Metadata.Name != "" {
		return meta.Metadata.Name
	}
	return meta.Metadata.GenerateName + "*"
}
