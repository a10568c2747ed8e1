package webhook

import (
	"context"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/policy"
)

// PodPath is where the pod webhook configuration points.
const PodPath = "/validate-v1-pod"

var podKind = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

// PodValidator admits agent pods (pods with paperclip.io/ labels) only as
// the Job controller's copies of admitted agent Jobs, and refuses
// ephemeral containers on them. See policy.EvaluatePod.
type PodValidator struct{}

var _ admission.Handler = (*PodValidator)(nil)

// Handle implements admission.Handler.
func (v *PodValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return instrumented(ctx, "validate-pod", req, func() (admission.Response, string) { return v.validate(req) })
}

func (v *PodValidator) validate(req admission.Request) (admission.Response, string) {
	if gvk := schema.GroupVersionKind(req.Kind); gvk != podKind {
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
	var old *corev1.Pod
	if req.Operation == admissionv1.Update && req.SubResource != "ephemeralcontainers" {
		old = &corev1.Pod{}
		if err := decodePod(req.OldObject.Raw, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err), OutcomeErrored
		}
	}
	if !contract.HasContractLabel(pod.Labels) && (old == nil || !contract.HasContractLabel(old.Labels)) {
		return admission.Allowed("not an agent pod: no paperclip.io/ label"), OutcomeSkipped
	}
	errs := policy.EvaluatePod(policy.PodInput{Pod: pod, Old: old, Creator: req.UserInfo.Username, Subresource: req.SubResource})
	if len(errs) > 0 {
		return denial(http.StatusForbidden, metav1.StatusReasonForbidden, errs.ToAggregate().Error()), OutcomeDenied
	}
	return admission.Allowed(""), OutcomeAllowed
}

func decodePod(raw []byte, pod *corev1.Pod) error {
	if len(raw) == 0 {
		return errNoObject
	}
	return sigsjson.UnmarshalCaseSensitivePreserveInts(raw, pod)
}
