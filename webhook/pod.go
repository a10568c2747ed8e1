package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/policy"
)

// PodPath is where the pod webhook configuration points.
const PodPath = "/validate-v1-pod"

// ClaimPath is where the claim webhook configuration points (the same
// validator: claims that start from the shared claim).
const ClaimPath = "/validate-v1-persistentvolumeclaim"

var (
	podKind   = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	claimKind = schema.GroupVersionKind{Version: "v1", Kind: "PersistentVolumeClaim"}
)

// PodValidator admits agent pods (pods with paperclip.io/ labels) only as
// the Job controller's copies of admitted agent Jobs, and refuses
// ephemeral containers on them (policy.EvaluatePod); any other pod of a
// namespace agents run in may mount the shared claim only as the pod of
// the source Deployment or one policy.sharedClaim lists
// (policy.EvaluateSharedClaim). Both through decide.Pod.
type PodValidator struct {
	Configs ConfigSource
	Sources InheritedSource
	PVCs    PVCGetter
	// ReplicaSets and Deployments read a pod's owners, live.
	ReplicaSets func(ctx context.Context, namespace, name string) (*appsv1.ReplicaSet, error)
	Deployments func(ctx context.Context, namespace, name string) (*appsv1.Deployment, error)
}

var _ admission.Handler = (*PodValidator)(nil)

// Handle implements admission.Handler.
func (v *PodValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return instrumented(ctx, "validate-pod", req, func() (admission.Response, string) { return v.validate(ctx, req) })
}

func (v *PodValidator) validate(ctx context.Context, req admission.Request) (admission.Response, string) {
	if gvk := schema.GroupVersionKind(req.Kind); gvk == claimKind && req.Operation == admissionv1.Create {
		pvc := &corev1.PersistentVolumeClaim{}
		if len(req.Object.Raw) == 0 {
			return admission.Errored(http.StatusBadRequest, errNoObject), OutcomeErrored
		}
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(req.Object.Raw, pvc); err != nil {
			return admission.Errored(http.StatusBadRequest, err), OutcomeErrored
		}
		if pvc.Namespace == "" {
			pvc.Namespace = req.Namespace
		}
		return respond(decide.Claim(decide.ClaimInput{Claim: pvc, Config: v.Configs.Current(), Facts: v.facts(ctx)}), "the claim", "the claim does not start from the shared claim")
	} else if gvk != podKind {
		return admission.Allowed("clipjob validates Pods here, not " + gvk.String()), OutcomeSkipped
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("clipjob validates pods on CREATE and UPDATE only"), OutcomeSkipped
	}
	// An ephemeral-container update is refused whatever it carries: judge
	// the pod as it is. Any other UPDATE compares the pod with the stored one.
	raw := req.Object.Raw
	if req.SubResource == "ephemeralcontainers" {
		raw = req.OldObject.Raw
	}
	pod := &corev1.Pod{}
	if err := decodePod(raw, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err), OutcomeErrored
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	var old *corev1.Pod
	if req.Operation == admissionv1.Update && req.SubResource != "ephemeralcontainers" {
		old = &corev1.Pod{}
		if err := decodePod(req.OldObject.Raw, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err), OutcomeErrored
		}
	}
	op := policy.Create
	if req.Operation == admissionv1.Update {
		op = policy.Update
	}
	cfg := v.Configs.Current()
	verdict := decide.Pod(decide.PodInput{Operation: op, Pod: pod, Old: old, Subresource: req.SubResource, Creator: req.UserInfo.Username,
		Config: cfg, Facts: v.facts(ctx)})
	return respond(verdict, "the pod", "neither an agent pod nor one that reaches the shared claim")
}

// respond is the answer to a verdict on what.
func respond(verdict decide.PodVerdict, what, skipped string) (admission.Response, string) {
	switch {
	case verdict.Refusal != nil:
		return refuse(*verdict.Refusal), outcomeOfRefusal(*verdict.Refusal)
	case len(verdict.Undecided) > 0:
		// Every lookup is given; a verdict without one is a wiring fault.
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("clipjob could not judge %s: %s", what, verdict.Undecided[0])), OutcomeErrored
	case !verdict.Judged:
		return admission.Allowed(skipped), OutcomeSkipped
	}
	return admission.Allowed(""), OutcomeAllowed
}

func (v *PodValidator) facts(ctx context.Context) decide.Facts {
	f := decide.Facts{Source: sourceFacts(ctx, v.Sources)}
	if v.PVCs != nil {
		f.PVCs = func(ns, name string) (*corev1.PersistentVolumeClaim, error) { return v.PVCs(ctx, ns, name) }
	}
	if v.ReplicaSets != nil {
		f.ReplicaSets = func(ns, name string) (*appsv1.ReplicaSet, error) { return v.ReplicaSets(ctx, ns, name) }
	}
	if v.Deployments != nil {
		f.Deployments = func(ns, name string) (*appsv1.Deployment, error) { return v.Deployments(ctx, ns, name) }
	}
	return f
}

func decodePod(raw []byte, pod *corev1.Pod) error {
	if len(raw) == 0 {
		return errNoObject
	}
	return sigsjson.UnmarshalCaseSensitivePreserveInts(raw, pod)
}
