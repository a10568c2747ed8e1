package decide

import (
	"errors"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/policy"
)

// PodInput is one admission of a pod, as a decision sees it.
type PodInput struct {
	Operation policy.Operation
	// Pod is the object; Old the stored one on an UPDATE (nil for one of
	// the ephemeralcontainers subresource, judged as it is).
	Pod, Old *corev1.Pod
	// Subresource is "ephemeralcontainers" for `kubectl debug`, else "".
	Subresource string
	// Creator is the user the API server says sent the request.
	Creator string
	Config  *config.Config
	Facts   Facts
}

// PodVerdict is the pod webhook's answer.
type PodVerdict struct {
	// Judged: the pod is an agent pod, or one that mounts the shared
	// claim; otherwise clipjob leaves it alone.
	Judged    bool
	Refusal   *Refusal
	Undecided []policy.Undecided
}

// Pod judges a pod: an agent pod only as the Job controller's copy of an
// admitted agent Job (policy.EvaluatePod); any other pod of a namespace
// agents run in only if it does not reach the shared claim, or is the pod
// of an allowed Deployment (policy.EvaluateSharedClaim).
func Pod(in PodInput) PodVerdict {
	if contract.HasContractLabel(in.Pod.Labels) || (in.Old != nil && contract.HasContractLabel(in.Old.Labels)) {
		errs := policy.EvaluatePod(policy.PodInput{Pod: in.Pod, Old: in.Old, Creator: in.Creator, Subresource: in.Subresource})
		return PodVerdict{Judged: true, Refusal: forbidden(errs)}
	}
	ephemeral := in.Subresource == "ephemeralcontainers"
	var images []policy.ImageChange
	if in.Operation == policy.Update && in.Subresource == "" && in.Old != nil {
		images = policy.ImagesChanged(in.Old, in.Pod)
	}
	cfg := in.Config
	if (in.Operation != policy.Create || in.Subresource != "") && !ephemeral && len(images) == 0 {
		return PodVerdict{} // a pod's volumes and owner chain are fixed at its CREATE; its images are not
	}
	if cfg.Policy.SharedClaim.Mode == config.SharedClaimDisabled || cfg.IsTenant(in.Pod.Namespace) {
		return PodVerdict{}
	}
	inh, _, err := in.Facts.Inherited(cfg, in.Pod.Namespace)
	var unknown *policy.FactUnknown
	switch {
	case errors.As(err, &unknown):
		if !hasClaimVolume(in.Pod) {
			return PodVerdict{}
		}
		return PodVerdict{Judged: true, Undecided: []policy.Undecided{{Fact: unknown.Fact, Give: unknown.Give,
			WithoutIt: "503: clipjob cannot tell which claim is Paperclip's home", WithIt: "the pod is judged against its shared claim"}}}
	case err != nil:
		if !hasClaimVolume(in.Pod) {
			return PodVerdict{}
		}
		return PodVerdict{Judged: true, Refusal: &Refusal{Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
			Message: "clipjob cannot tell which claim is Paperclip's home, which only agent runs and the source's pods may mount (policy.sharedClaim): " + err.Error()}}
	case inh.Tenant || inh.DataVolume.PersistentVolumeClaim == nil:
		return PodVerdict{}
	}
	allowed := cfg.Policy.SharedClaim.Deployments
	if in.Pod.Namespace == cfg.Source.Namespace {
		allowed = append([]string{cfg.Source.Deployment}, allowed...)
	}
	errs, undecided := policy.EvaluateSharedClaim(policy.SharedClaimInput{
		Pod: in.Pod, Ephemeral: ephemeral, Images: images, Creator: in.Creator, Claim: inh.DataVolume.PersistentVolumeClaim.ClaimName,
		Deployments: allowed, Claims: in.Facts.PVCs, ReplicaSets: in.Facts.ReplicaSets, DeploymentOf: in.Facts.Deployments,
	})
	v := PodVerdict{Judged: len(errs) > 0 || len(undecided) > 0, Undecided: undecided}
	if internal := errs.Filter(notInternal); len(internal) > 0 {
		v.Refusal = &Refusal{Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: internal.ToAggregate().Error(), Internal: true}
		return v
	}
	v.Refusal = forbidden(errs)
	return v
}

func forbidden(errs field.ErrorList) *Refusal {
	if len(errs) == 0 {
		return nil
	}
	return &Refusal{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: errs.ToAggregate().Error()}
}

// hasClaimVolume: the pod has a volume that could reach a claim.
func hasClaimVolume(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return true
		}
	}
	return false
}
