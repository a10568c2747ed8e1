package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/policy"
)

// Validator enforces policy on the final Job and claims the agent's run.
type Validator struct {
	Configs ConfigSource
	// Sources supplies the source Deployment's image, which is always
	// allowed. A missing source only narrows the allowlist.
	Sources InheritedSource
	PVCs    PVCGetter
	// Secrets reads a Secret's labels (the run's env Secret). Without it a
	// Job that references a Secret cannot be judged: the request fails
	// (500, "clipjob could not judge the Job") rather than admit it.
	Secrets SecretMetadataGetter
	Claims  *claim.Lock
}

// SecretMetadataGetter returns a Secret's metadata, never its data.
type SecretMetadataGetter func(ctx context.Context, namespace, name string) (*metav1.ObjectMeta, error)

// liveSecretMeta reads a Secret's metadata only (the metadata API), live:
// the webhook never holds a Secret's data.
func liveSecretMeta(mc metadata.Interface) SecretMetadataGetter {
	secrets := corev1.SchemeGroupVersion.WithResource("secrets")
	return func(ctx context.Context, ns, name string) (*metav1.ObjectMeta, error) {
		m, err := mc.Resource(secrets).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return &m.ObjectMeta, nil
	}
}

// PVCGetter looks a PersistentVolumeClaim up.
type PVCGetter func(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)

// livePVCs reads PVCs from the API server.
func livePVCs(cs kubernetes.Interface) PVCGetter {
	return func(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
		return cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	}
}

// cachedPVCs reads PVCs from an informer and asks live only on a miss. A
// live read was an eighth of the validating webhook's time under load
// (docs/design/2026-11-23-admission-performance.md); the check only needs
// the claim to exist and its access modes, which never change. A miss is
// not believed: a PVC created moments before its Job may not have reached
// the cache, and refusing the Job for that would be wrong. A PVC deleted
// moments ago may still be found; its Job is then admitted and its pod
// waits for the claim, as it would had the PVC gone a moment after
// admission.
func cachedPVCs(cached client.Reader, live PVCGetter) PVCGetter {
	return func(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
		var pvc corev1.PersistentVolumeClaim
		if err := cached.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pvc); err == nil {
			return &pvc, nil
		}
		return live(ctx, ns, name)
	}
}

var _ admission.Handler = (*Validator)(nil)

// Handle implements admission.Handler.
func (v *Validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return instrumented(ctx, "validate", req, func() (admission.Response, string) { return v.validate(ctx, req) })
}

// Outcomes specific to validation.
const OutcomeAllowed = "allowed"

func (v *Validator) validate(ctx context.Context, req admission.Request) (admission.Response, string) {
	ar, skipped, outcome := decodeAgentRequest(req, "validates", claimsContract, admissionv1.Create, admissionv1.Update)
	if skipped != nil {
		return *skipped, outcome
	}
	job, old, op := ar.Job, ar.Old, policy.Create
	if req.Operation == admissionv1.Update {
		op = policy.Update
	}
	if job.Namespace == "" {
		job.Namespace = req.Namespace // the claim is keyed by it
	}
	cfg := v.Configs.Current()
	val := decide.Validate(decide.Input{Operation: op, Job: job, Old: old, Config: cfg, User: req.UserInfo.Username,
		Facts: decide.Facts{Source: sourceFacts(ctx, v.Sources), PVCs: v.pvcs(ctx), SecretMeta: v.secretMeta(ctx)}})
	d := val.Decision
	if val.Refusal != nil && d == nil {
		// Refused before any rule ran (the source away, a Job turned into
		// an agent run by an UPDATE).
		return refuse(*val.Refusal), outcomeOfRefusal(*val.Refusal)
	}
	for _, r := range d.Checked {
		policyDecisions.WithLabelValues(r, outcomeOf(slices.Contains(d.Failed, r))).Inc()
	}
	if val.Refusal != nil {
		return refuse(*val.Refusal).WithWarnings(d.Warnings...), outcomeOfRefusal(*val.Refusal)
	}
	if !d.Decided() {
		// The webhook is given every lookup; a verdict without one is a
		// wiring fault, and admitting on it would skip a rule.
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("clipjob could not judge the Job: %s", d.Undecided[0])), OutcomeErrored
	}
	if resp, full := v.queueFull(ctx, op, job, cfg.Policy.Concurrency); full {
		return resp.WithWarnings(d.Warnings...), OutcomeDenied
	}
	if needsClaim(op, job, old, cfg.Policy.Concurrency.Mode) {
		dryRun := req.DryRun != nil && *req.DryRun
		err := v.Claims.Acquire(ctx, job, cfg.Policy.Concurrency, dryRun)
		switch {
		case claim.IsBusy(err):
			claimConflicts.Inc()
			policyDecisions.WithLabelValues(policy.RuleConcurrency, "denied").Inc()
			return busy(job, err).WithWarnings(d.Warnings...), OutcomeDenied
		case err != nil:
			policyDecisions.WithLabelValues(policy.RuleConcurrency, "error").Inc()
			return admission.Errored(http.StatusInternalServerError, err).WithWarnings(d.Warnings...), OutcomeErrored
		}
		policyDecisions.WithLabelValues(policy.RuleConcurrency, "allowed").Inc()
	}
	return admission.Allowed("").WithWarnings(d.Warnings...), OutcomeAllowed
}

func outcomeOf(failed bool) string {
	if failed {
		return "denied"
	}
	return "allowed"
}

// needsClaim says whether this admission must hold the agent's claim: a
// run that starts now. A run created suspended waits without one, in every
// mode: in Queue mode for its turn, in Reject mode for whoever resumes it
// (a claim taken at its CREATE would make the agent busy with a run that
// may never start: one a stale Queue-mode policy suspended, say). In both,
// unsuspending a run (decide.StartsRun, the start the start check judged)
// claims, so nobody starts a run while another goes, or a queued run out
// of turn.
func needsClaim(op policy.Operation, job, old *batchv1.Job, mode config.ConcurrencyMode) bool {
	switch {
	case mode == config.ModeDisabled:
		return false
	case op == policy.Create:
		return !contract.Suspended(job)
	default:
		return decide.StartsRun(op, job, old)
	}
}

// busy is the 409 for a run whose agent has an active one, with the holder
// in the Status causes (contract.CauseHolderJob and the rest).
func busy(job *batchv1.Job, err error) admission.Response {
	var b *claim.BusyError
	if !errors.As(err, &b) {
		return conflict(job, err.Error())
	}
	since := ""
	if !b.Holder.Since.IsZero() {
		since = b.Holder.Since.UTC().Format(time.RFC3339)
	}
	return conflict(job, err.Error(),
		metav1.StatusCause{Type: contract.CauseAgentBusy, Message: "agent " + b.Agent + " has an active run"},
		metav1.StatusCause{Type: contract.CauseHolderJob, Message: b.Holder.Namespace + "/" + b.Holder.Name},
		metav1.StatusCause{Type: contract.CauseHolderRunID, Message: b.Holder.RunID},
		metav1.StatusCause{Type: contract.CauseHolderSince, Message: since})
}

// conflict is a 409 refusing job, with causes a client reads instead of
// the message, each on the agent label.
func conflict(job *batchv1.Job, msg string, causes ...metav1.StatusCause) admission.Response {
	resp := denial(http.StatusConflict, metav1.StatusReasonConflict, msg)
	if len(causes) == 0 {
		return resp
	}
	for i := range causes {
		causes[i].Field = "metadata.labels[" + contract.LabelAgentID + "]"
	}
	resp.Result.Details = &metav1.StatusDetails{Group: "batch", Kind: "jobs", Name: job.Name, Causes: causes}
	return resp
}

func (v *Validator) secretMeta(ctx context.Context) policy.SecretMeta {
	if v.Secrets == nil {
		return nil
	}
	return func(ns, name string) (*metav1.ObjectMeta, error) { return v.Secrets(ctx, ns, name) }
}

func (v *Validator) pvcs(ctx context.Context) policy.ClaimLookup {
	if v.PVCs == nil {
		return nil
	}
	return func(ns, name string) (*corev1.PersistentVolumeClaim, error) { return v.PVCs(ctx, ns, name) }
}

// queueFull refuses, in Queue mode with maxQueued, a new run of an agent
// that already has that many waiting: a 409 with cause
// contract.CauseQueueFull.
func (v *Validator) queueFull(ctx context.Context, op policy.Operation, job *batchv1.Job, cc config.Concurrency) (admission.Response, bool) {
	if op != policy.Create || cc.Mode != config.ModeQueue || cc.MaxQueued <= 0 || v.Claims == nil || v.Claims.Active == nil {
		return admission.Response{}, false
	}
	runs, err := v.Claims.Active(ctx, claim.KeyFor(job, cc), cc)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), true
	}
	waiting := 0
	for i := range runs {
		if runs[i].UID != job.UID && claim.Queued(&runs[i]) {
			waiting++
		}
	}
	if waiting < int(cc.MaxQueued) {
		return admission.Response{}, false
	}
	agent := job.Labels[contract.LabelAgentID]
	msg := fmt.Sprintf("agent %q already has %d runs waiting (policy.concurrency.maxQueued %d); a new run is admitted once one starts", agent, waiting, cc.MaxQueued)
	return conflict(job, msg, metav1.StatusCause{Type: contract.CauseQueueFull, Message: strconv.Itoa(waiting)}), true
}
