package decide

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

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
	claim, stop := sharedClaim(cfg, in.Facts, in.Pod.Namespace, hasClaimVolume(in.Pod))
	if stop != nil {
		return *stop
	}
	var allowed []string
	if in.Pod.Namespace == cfg.Source.Namespace {
		allowed = append(allowed, cfg.Source.Deployment)
	}
	for _, d := range cfg.Policy.SharedClaim.Deployments {
		if ns, name, _ := strings.Cut(d, "/"); ns == in.Pod.Namespace {
			allowed = append(allowed, name)
		}
	}
	errs, undecided := policy.EvaluateSharedClaim(policy.SharedClaimInput{
		Pod: in.Pod, Ephemeral: ephemeral, Images: images, CSIDrivers: cfg.Policy.CSIDrivers, Creator: in.Creator, Claim: claim,
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

// sharedClaim is the name of the shared claim in namespace, "" when the
// rule does not apply there (Disabled, a tenant's namespace, a source
// without a claim); or the verdict when clipjob cannot tell, which judges
// only an object that may reach a claim (mayReach).
func sharedClaim(cfg *config.Config, facts Facts, namespace string, mayReach bool) (string, *PodVerdict) {
	none := &PodVerdict{}
	if cfg.Policy.SharedClaim.Mode == config.SharedClaimDisabled || cfg.IsTenant(namespace) {
		return "", none
	}
	inh, _, err := facts.Inherited(cfg, namespace)
	var unknown *policy.FactUnknown
	switch {
	case (errors.As(err, &unknown) || err != nil) && !mayReach:
		return "", none
	case errors.As(err, &unknown):
		return "", &PodVerdict{Judged: true, Undecided: []policy.Undecided{{Fact: unknown.Fact, Give: unknown.Give,
			WithoutIt: "503: clipjob cannot tell which claim is Paperclip's home", WithIt: "judged against its shared claim"}}}
	case err != nil:
		return "", &PodVerdict{Judged: true, Refusal: &Refusal{Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
			Message: "clipjob cannot tell which claim is Paperclip's home, which only agent runs and the source's pods may mount (policy.sharedClaim): " + err.Error()}}
	case inh.Tenant || inh.DataVolume.PersistentVolumeClaim == nil:
		return "", none
	}
	return inh.DataVolume.PersistentVolumeClaim.ClaimName, nil
}

// ClaimInput is the CREATE of a PersistentVolumeClaim.
type ClaimInput struct {
	Claim  *corev1.PersistentVolumeClaim
	Config *config.Config
	Facts  Facts
}

// Claim refuses, in a namespace agents run in, a claim that starts from
// the shared claim (its dataSource or dataSourceRef): a copy of
// Paperclip's home. A pod is judged when it is created, with the claims
// it names as they are then; a claim made after its pod would otherwise
// pass unseen (hostile review of H1).
func Claim(in ClaimInput) PodVerdict {
	pvc := in.Claim
	clones := pvc.Spec.DataSource != nil || pvc.Spec.DataSourceRef != nil
	shared, stop := sharedClaim(in.Config, in.Facts, pvc.Namespace, clones)
	switch {
	case stop != nil:
		return *stop
	case !policy.ClonesClaim(pvc.Spec, pvc.Namespace, shared):
		return PodVerdict{}
	}
	path := field.NewPath("spec", "dataSourceRef")
	if ds := pvc.Spec.DataSource; ds != nil && ds.Kind == "PersistentVolumeClaim" && ds.Name == shared {
		path = field.NewPath("spec", "dataSource")
	}
	return PodVerdict{Judged: true, Refusal: forbidden(field.ErrorList{field.Forbidden(path, fmt.Sprintf(
		"claim %q would be a copy of the shared claim %q, and Paperclip's home is on it (the instance's .env, secrets/master.key, every company's data): "+
			"in a namespace agents run in no claim starts from it; back it up from the source Deployment's storage instead, or set policy.sharedClaim.mode: Disabled in the clipjob config",
		pvc.Name, shared))})}
}

// hasClaimVolume: the pod has a volume that could reach a claim (or its
// storage: an inline CSI volume).
func hasClaimVolume(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil {
			return true
		}
	}
	return false
}
