package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// ConfigSource returns the configuration in force (a *config.Store).
type ConfigSource interface {
	Current() *config.Config
}

// InheritedSource returns what agent Jobs inherit under cfg, with the memo
// of template hashes that belongs to it (nil computes them on each
// render), or a *templates.SourceError saying why they cannot.
type InheritedSource interface {
	Inherited(ctx context.Context, cfg *config.Config) (*templates.Inherited, *templates.TemplateHashes, error)
}

// Mutator completes bare agent Jobs on CREATE.
type Mutator struct {
	Configs ConfigSource
	Sources InheritedSource
}

var _ admission.Handler = (*Mutator)(nil)

// Outcomes of a mutation, as counted in metrics.
const (
	OutcomePatched   = "patched"
	OutcomeUnchanged = "unchanged"
	OutcomeSkipped   = "skipped"
	OutcomeDenied    = "denied"
	OutcomeErrored   = "errored"
)

// Handle implements admission.Handler; ctx is the HTTP request's context.
func (m *Mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return instrumented(ctx, "mutate", req, func() (admission.Response, string) { return m.mutate(ctx, req) })
}

// instrumented runs one admission, counts its outcome and latency, and
// logs refusals (and completed Jobs at V(1)). The Job's name is parsed only
// when a line is written: it is not free on the hot path.
func instrumented(ctx context.Context, webhook string, req admission.Request, handle func() (admission.Response, string)) admission.Response {
	start := time.Now()
	resp, outcome := handle()
	observe(webhook, outcome, req.DryRun != nil && *req.DryRun, time.Since(start))
	l := log.FromContext(ctx)
	switch {
	case outcome == OutcomeDenied || outcome == OutcomeErrored:
		l.Info("agent Job refused", "webhook", webhook, "job", req.Namespace+"/"+nameOf(req), "operation", req.Operation,
			"code", resp.Result.Code, "reason", resp.Result.Message)
	case outcome == OutcomePatched && l.V(1).Enabled():
		l.V(1).Info("agent Job completed", "job", req.Namespace+"/"+nameOf(req))
	}
	return resp
}

func (m *Mutator) mutate(ctx context.Context, req admission.Request) (admission.Response, string) {
	ar, skipped, outcome := decodeAgentRequest(req, "completes", isAgentJob, admissionv1.Create)
	if skipped != nil {
		return *skipped, outcome
	}
	job := ar.Job
	cfg := m.Configs.Current()
	if job.Namespace == "" {
		job.Namespace = req.Namespace // a tenant namespace inherits nothing
	}
	mu := decide.Mutate(decide.Input{Operation: policy.Create, Job: job, Config: cfg, User: req.UserInfo.Username,
		Facts: decide.Facts{Source: sourceFacts(ctx, m.Sources)}})
	if mu.Refusal != nil {
		return refuse(*mu.Refusal), outcomeOfRefusal(*mu.Refusal)
	}
	res := mu.Result
	if !res.Changed {
		return admission.Allowed("agent Job already complete").WithWarnings(res.Warnings...), OutcomeUnchanged
	}
	rendered, err := json.Marshal(res.Job)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), OutcomeErrored
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, rendered)
	if resp.Patches, err = keepUnknownFields(resp.Patches, req.Object.Raw, job); err != nil {
		return admission.Errored(http.StatusInternalServerError, err), OutcomeErrored
	}
	return resp.WithWarnings(res.Warnings...), OutcomePatched
}

// refuse is the admission answer of a decision's refusal: an error for a
// failed lookup, else a denial with the decision's code and reason.
func refuse(r decide.Refusal) admission.Response {
	if r.Internal {
		return admission.Errored(r.Code, errors.New(r.Message))
	}
	return denial(r.Code, r.Reason, r.Message)
}

func outcomeOfRefusal(r decide.Refusal) string {
	if r.Internal {
		return OutcomeErrored
	}
	return OutcomeDenied
}

// sourceFacts is the decision's view of the source workload: the cache's.
func sourceFacts(ctx context.Context, sources InheritedSource) func(*config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
	return func(cfg *config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
		if sources == nil {
			return nil, nil, errors.New("no source cache")
		}
		return sources.Inherited(ctx, cfg)
	}
}

// keepUnknownFields drops the "remove" operations that only undo decoding:
// fields this build's types do not know (a newer API server), which a diff
// against the raw request would otherwise delete. It is controller-runtime's
// CustomDefaulter rule (dropSchemeRemovals): a removal is the decoder's when
// re-encoding the decoded Job alone removes the same path. Render only adds,
// so a patch rarely has a "remove", and the Job is re-encoded only then.
func keepUnknownFields(ops []jsonpatch.JsonPatchOperation, raw []byte, decoded *batchv1.Job) ([]jsonpatch.JsonPatchOperation, error) {
	isRemove := func(op jsonpatch.JsonPatchOperation) bool { return op.Operation == "remove" }
	if !slices.ContainsFunc(ops, isRemove) {
		return ops, nil
	}
	roundTrip, err := json.Marshal(decoded)
	if err != nil {
		return nil, err
	}
	lost, err := jsonpatch.CreatePatch(raw, roundTrip)
	if err != nil {
		return nil, err
	}
	byDecoding := map[string]bool{}
	for _, op := range lost {
		if isRemove(op) {
			byDecoding[op.Path] = true
		}
	}
	return slices.DeleteFunc(ops, func(op jsonpatch.JsonPatchOperation) bool {
		return isRemove(op) && byDecoding[op.Path]
	}), nil
}

func denial(code int32, reason metav1.StatusReason, msg string) admission.Response {
	resp := admission.Denied(msg)
	resp.Result.Code = code
	resp.Result.Reason = reason
	return resp
}
