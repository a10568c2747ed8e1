package decide

import (
	"errors"
	"fmt"
	"net/http"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// Kind is what clipjob makes of a Job.
type Kind int

const (
	// NotAgent: no paperclip.io/ label on the Job or its pod template;
	// not clipjob's.
	NotAgent Kind = iota
	// AgentRun: the Job carries paperclip.io/agent-id; it is completed
	// and judged.
	AgentRun
	// ClaimsContract: paperclip.io/ labels (on the Job or only on its pod
	// template) but no agent label on the Job. It is judged as an agent
	// run, which refuses it: anything that looks like an agent is treated
	// as one, and an agent Job names its agent on itself.
	ClaimsContract
)

// Classify says what a Job is to clipjob. The API server copies a pod
// template's labels onto a Job that has none before any webhook sees it,
// so a Job labeled only through its template with no labels of its own
// arrives as an AgentRun; one with labels of its own does not.
func Classify(job *batchv1.Job) Kind {
	switch {
	case contract.IsAgentJob(job.Labels):
		return AgentRun
	case contract.HasContractLabel(job.Labels, job.Spec.Template.Labels):
		return ClaimsContract
	}
	return NotAgent
}

// Facts are what a decision knows of the cluster.
type Facts struct {
	// Source is what agent Jobs in the source's namespaces inherit under
	// cfg, with the memo of template hashes that belongs to it (nil
	// computes them). An error says why not: a *templates.SourceError, or
	// a *policy.FactUnknown offline.
	Source func(cfg *config.Config) (*templates.Inherited, *templates.TemplateHashes, error)
	// SecretMeta and PVCs look the objects a Job references up.
	SecretMeta policy.SecretMeta
	PVCs       policy.ClaimLookup
	// ReplicaSets and Deployments look a pod's owners up (the pod rule:
	// which Deployment's pod mounts the shared claim).
	ReplicaSets func(namespace, name string) (*appsv1.ReplicaSet, error)
	Deployments func(namespace, name string) (*appsv1.Deployment, error)
}

// Inherited is what an agent Job in namespace inherits: in a tenant
// namespace (config TenantNamespaces) nothing but a workspace, whatever
// the source; elsewhere the source's values.
func (f Facts) Inherited(cfg *config.Config, namespace string) (*templates.Inherited, *templates.TemplateHashes, error) {
	if cfg.IsTenant(namespace) {
		return templates.TenantInherited(cfg.Source), nil, nil
	}
	if f.Source == nil {
		return nil, nil, &policy.FactUnknown{Fact: "source Deployment " + cfg.Source.Namespace + "/" + cfg.Source.Deployment, Give: "no source given"}
	}
	return f.Source(cfg)
}

// Input is one admission request, as a decision sees it.
type Input struct {
	Operation policy.Operation
	// Job is the object; Old the stored one on UPDATE. Job's namespace
	// must be set (a CREATE may leave it to the request).
	Job, Old *batchv1.Job
	Config   *config.Config
	Facts    Facts
	// User is who makes the request; empty offline.
	User string
}

// Refusal is how a webhook answers a Job it does not admit: the HTTP code
// and reason of the Status and its message. The CLI prints the same.
type Refusal struct {
	Code    int32
	Reason  metav1.StatusReason
	Message string
	// Internal: a lookup failed; the request fails rather than is denied.
	Internal bool
}

// Mutation is the mutating webhook's half of the decision.
type Mutation struct {
	Kind Kind
	// Result is the rendered Job; nil when the Job is not an agent run or
	// is refused.
	Result *templates.Result
	// Refusal, when not nil, is why the Job cannot be completed.
	Refusal *Refusal
	// Undecided: offline, the source was not given.
	Undecided *policy.Undecided
}

// Mutate completes an agent Job on CREATE: the mutating webhook's work.
func Mutate(in Input) Mutation {
	kind := Classify(in.Job)
	if in.Operation != policy.Create || kind != AgentRun {
		return Mutation{Kind: kind}
	}
	inh, hashes, err := in.Facts.Inherited(in.Config, in.Job.Namespace)
	var unknown *policy.FactUnknown
	switch {
	case errors.As(err, &unknown):
		return Mutation{Kind: kind, Undecided: &policy.Undecided{Fact: unknown.Fact, Give: unknown.Give,
			WithoutIt: "503 " + sourceMissing(&templates.SourceError{Source: in.Config.Source.Namespace + "/" + in.Config.Source.Deployment, Reason: "not found"}),
			WithIt:    "the Job is completed from it and then judged"}}
	case err != nil:
		return Mutation{Kind: kind, Refusal: &Refusal{Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable, Message: sourceMissing(err)}}
	}
	job, unqueued := unqueue(in.Job, in.Config.Policy.Concurrency.Mode)
	res, err := templates.Render(templates.Input{Job: job, Inherited: inh, Config: in.Config, Hashes: hashes, Creator: in.User})
	var re *templates.RenderError
	switch {
	case errors.As(err, &re):
		return Mutation{Kind: kind, Refusal: &Refusal{Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Message: err.Error()}}
	case err != nil:
		return Mutation{Kind: kind, Refusal: &Refusal{Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: err.Error(), Internal: true}}
	}
	if unqueued != "" {
		res.Changed = true
		res.Warnings = append([]string{unqueued}, res.Warnings...)
	}
	return Mutation{Kind: kind, Result: res}
}

// unqueue undoes, outside Queue mode, what completing the Job in Queue
// mode did: a Job that reaches the mutating webhook suspended and marked
// queued was completed by a compiled admission policy of Queue mode (the
// API server applies a replaced or deleted policy for a moment after the
// mode changed), or a client forged the mark. Render drops the mark, as it
// drops every annotation of clipjob's, but would keep the suspension: the
// Job would be admitted as a run nothing ever starts (the claim controller
// starts only marked runs). It runs now instead, as the mode in force
// runs it, and the warning says why. A Job suspended without the mark is
// its client's to resume, and stays suspended.
func unqueue(job *batchv1.Job, mode config.ConcurrencyMode) (*batchv1.Job, string) {
	if mode == config.ModeQueue || job.Annotations[contract.AnnotationQueued] != "true" || !contract.Suspended(job) {
		return job, ""
	}
	j := job.DeepCopy()
	j.Spec.Suspend = ptr.To(false)
	return j, fmt.Sprintf("metadata.annotations[%s]: this Job came suspended and marked queued, as clipjob completes runs in Queue mode, "+
		"but policy.concurrency.mode is %s: it is not suspended, and runs now (a compiled admission policy of Queue mode the API server "+
		"still applied after the mode changed; if this recurs, run clipjob doctor)", contract.AnnotationQueued, mode)
}

func sourceMissing(err error) string { return "clipjob cannot complete agent Jobs: " + err.Error() }

// Validation is the validating webhook's half of the decision, before the
// claim (which needs the API server as its arbiter and is the webhook's).
type Validation struct {
	Kind     Kind
	Decision *policy.Decision
	// Refusal, when not nil, is why the Job is not admitted.
	Refusal *Refusal
}

// Validate judges the final Job on CREATE and UPDATE: the validating
// webhook's work. A Job that is not an agent run's, before or after the
// change, is not judged (Decision nil). The UPDATE that starts a queued
// run is also judged as that run's CREATE (validateStart).
func Validate(in Input) Validation {
	if StartsRun(in.Operation, in.Job, in.Old) {
		return validateStart(in)
	}
	return validate(in)
}

func validate(in Input) Validation {
	kind := Classify(in.Job)
	if kind == NotAgent && (in.Old == nil || Classify(in.Old) == NotAgent) {
		return Validation{Kind: kind}
	}
	if in.Operation == policy.Update && in.Old != nil && Classify(in.Old) == NotAgent {
		// The API server lets a suspended Job that never ran change its
		// pod template's labels: a Job no webhook judged at its CREATE
		// would start as an agent run unjudged and unclaimed.
		return Validation{Kind: kind, Refusal: &Refusal{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: "metadata.labels: Forbidden: a Job becomes an agent run only at its CREATE, where clipjob completes, judges and claims it; create a new Job with the paperclip.io/ labels rather than adding them to this one"}}
	}
	cfg := in.Config
	pin := policy.Input{
		Operation: in.Operation, Job: in.Job, Old: in.Old, Config: cfg,
		Claims: in.Facts.PVCs, SecretMeta: in.Facts.SecretMeta, User: in.User,
	}
	// What the source gives agents here, for the rules of a CREATE (an
	// UPDATE checks only what may not change): its image is always
	// allowed, its handed Secrets (and keys) may be referenced, its own are
	// never an agent's. A missing source only narrows the first two.
	if in.Operation == policy.Create {
		inh, hashes, err := in.Facts.Inherited(cfg, in.Job.Namespace)
		var unknown *policy.FactUnknown
		if err != nil && kind == AgentRun && !errors.As(err, &unknown) {
			// Without the source the Job cannot be rendered again, so
			// whether clipjob completed it cannot be told (a client may
			// skip the mutating webhook by making its Job look complete):
			// refused as the mutating webhook refuses it, not let through.
			return Validation{Kind: kind, Refusal: &Refusal{Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
				Message: "clipjob cannot check that this Job is as clipjob completes it: " + err.Error()}}
		}
		if err == nil {
			if kind == AgentRun {
				pin.Rerender = func(j *batchv1.Job) (*batchv1.Job, bool, error) {
					res, err := templates.Render(templates.Input{Job: j, Inherited: inh, Config: cfg, Hashes: hashes, Creator: in.User})
					if err != nil {
						return nil, false, err
					}
					return res.Job, res.Changed, nil
				}
			}
			if inh.Image != "" {
				pin.SourceImages = []string{inh.Image}
			}
			if !inh.Tenant {
				pin.Shared = &policy.SharedVolume{Volume: templates.DataVolume, Claim: inh.DataVolume.PersistentVolumeClaim.ClaimName,
					Mounts: templates.SharedMounts(inh, cfg, in.Job.Labels), Confined: templates.Confined(inh, cfg), FSGroup: ptr.To(templates.FloorGID)}
			}
			prof, _ := cfg.JobProfile(contract.AdapterType(in.Job.Labels))
			ss := inh.SecretsFor(cfg.Source, prof)
			pin.HandedSecrets, pin.HandedKeys, pin.ServerSecrets, pin.SourceSecrets = ss.Whole, ss.Keys, ss.Server, ss.Read
		}
	}
	d := policy.Evaluate(pin)
	v := Validation{Kind: kind, Decision: d}
	if !d.Allowed() {
		if internal := d.Errs.Filter(notInternal); len(internal) > 0 {
			v.Refusal = &Refusal{Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: internal.ToAggregate().Error(), Internal: true}
		} else {
			v.Refusal = &Refusal{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: d.Errs.ToAggregate().Error()}
		}
	}
	return v
}

// StartsRun says whether an UPDATE unsuspends an agent Job (or one whose
// pods alone claim the contract, which its CREATE refuses): the only
// way a Job stored without a judged CREATE (with compiled policies a
// queued run's CREATE skips the validating webhook, and a client may dress
// any Job as one) gets a pod. Every such start is judged as a CREATE,
// whatever the Job's annotations say: an unmarked Job gets no less.
func StartsRun(op policy.Operation, job, old *batchv1.Job) bool {
	return op == policy.Update && old != nil && job != nil && contract.Suspended(old) && !contract.Suspended(job) && Classify(old) != NotAgent
}

// validateStart is the start check: a run is judged when it starts (is
// unsuspended) by every rule of a CREATE, under the config and source in
// force, as its creator, on the Job as it was admitted (suspended, without
// what the claim controller writes while a run waits). With compiled
// admission policies a queued run's CREATE may have been admitted by the
// API server alone — while clipjob was down, or with the validating
// webhook skipping queued runs — so the start is where clipjob's lookups
// and its rendered rule run; no agent pod exists before them. A run that
// was judged at its CREATE is judged again, under what is in force now.
// The UPDATE's own rules come first.
func validateStart(in Input) Validation {
	upd := validate(in)
	if upd.Refusal != nil || upd.Decision == nil {
		return upd
	}
	created := in
	created.Operation, created.Old = policy.Create, nil
	created.Job = asAdmitted(in.Job)
	// Render's only mode-dependent step is queueing: a run clipjob
	// queued was completed in Queue mode, any other in a mode that left
	// its suspension to its client.
	mode := config.ModeReject
	if in.Old.Annotations[contract.AnnotationQueued] == "true" {
		mode = config.ModeQueue
	}
	created.Config = in.Config.InMode(mode)
	// Its creator, recorded at its CREATE (the creator rule, and with
	// compiled policies the agent-runs admission policy, held it to the
	// request's user).
	created.User = in.Old.Annotations[contract.AnnotationCreatedBy]
	v := validate(created)
	if v.Decision != nil {
		v.Decision.Warnings = append(upd.Decision.Warnings, v.Decision.Warnings...)
	}
	if v.Refusal != nil && !v.Refusal.Internal {
		v.Refusal.Message = "this run cannot start (a run is judged again when it is unsuspended, under the config and source in force): " + v.Refusal.Message
	}
	return v
}

// asAdmitted is a starting run's Job as it was admitted: suspended, and
// without the annotations the claim controller writes on a waiting run.
func asAdmitted(job *batchv1.Job) *batchv1.Job {
	j := job.DeepCopy()
	j.Spec.Suspend = ptr.To(true)
	for _, k := range []string{contract.AnnotationQueuePosition, contract.AnnotationQueueHolder, contract.AnnotationStartFailures, contract.AnnotationQueueError} {
		delete(j.Annotations, k)
	}
	return j
}

// notInternal keeps, through Filter, only internal errors (lookups that
// failed), which fail the request as errors rather than denials.
func notInternal(err error) bool {
	var fe *field.Error
	return !errors.As(err, &fe) || fe.Type != field.ErrorTypeInternal
}

// Verdict is what the cluster decides about a CREATE, up to the claim.
type Verdict struct {
	Kind Kind
	// Stage is the webhook that refused ("mutate" or "validate"), or "".
	Stage string
	// Refusal is nil when the Job is admitted (or undecided).
	Refusal *Refusal
	// Job is the Job as it would be stored: rendered, for an agent run
	// that got that far.
	Job *batchv1.Job
	// Warnings are every warning the client would be shown, mutation's
	// first.
	Warnings []string
	// Undecided are verdicts hanging on facts not given (offline only).
	Undecided []policy.Undecided
}

// Stages of a Verdict.
const (
	StageMutate   = "mutate"
	StageValidate = "validate"
)

// Create decides a CREATE the way the cluster does: mutation, then
// validation of the result. (Between the two the API server defaults and
// validates the object; a Job it would refuse is not this package's to
// judge.)
func Create(in Input) Verdict {
	in.Operation = policy.Create
	v := Verdict{Kind: Classify(in.Job), Job: in.Job}
	m := Mutate(in)
	switch {
	case m.Undecided != nil:
		v.Undecided = []policy.Undecided{*m.Undecided}
		return v
	case m.Refusal != nil:
		v.Stage, v.Refusal = StageMutate, m.Refusal
		return v
	case m.Result != nil:
		v.Job, v.Warnings = m.Result.Job, m.Result.Warnings
	}
	in.Job = v.Job
	val := Validate(in)
	if val.Decision == nil {
		return v
	}
	v.Warnings = append(v.Warnings, val.Decision.Warnings...)
	v.Undecided = val.Decision.Undecided
	if val.Refusal != nil {
		v.Stage, v.Refusal = StageValidate, val.Refusal
	}
	return v
}
