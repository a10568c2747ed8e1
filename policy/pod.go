package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/paperclipai/clipjob/contract"
)

// JobControllers are the users the API server names when the Job
// controller creates a pod: its own ServiceAccount when the controller
// manager runs with --use-service-account-credentials (kind, most
// distributions), else the controller manager's identity.
var JobControllers = []string{"system:serviceaccount:kube-system:job-controller", "system:kube-controller-manager"}

// PodInput is the admission of a pod that carries paperclip.io/ labels.
type PodInput struct {
	Pod *corev1.Pod
	// Old is the stored pod on an UPDATE, else nil.
	Old *corev1.Pod
	// Creator is the user the API server says sent the request.
	Creator string
	// Subresource is "ephemeralcontainers" for `kubectl debug`, else "".
	Subresource string
}

// EvaluatePod admits an agent pod only as the Job controller's copy of an
// agent Job's template. Every rule was checked on that template when the
// Job was admitted (a Job whose pods carry paperclip.io/ labels goes
// through clipjob), so a pod made any other way would skip them all: a
// bare pod, or one whose owner reference is written by hand. Ephemeral
// containers are refused outright: `kubectl debug` would add a container
// of any image, with any security context, beside the agent and its
// shared volume, after admission; agents are read through their logs.
func EvaluatePod(in PodInput) field.ErrorList {
	if in.Subresource == "ephemeralcontainers" {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "ephemeralContainers"),
			"agent pods take no ephemeral containers (kubectl debug): one would run beside the agent unchecked; read the run through its logs or the relay")}
	}
	if in.Old != nil {
		// An update of the pod or of its status: either can carry labels.
		// A pod's images are the one thing of its containers an update may
		// change: the allowlist judged the Job's, so they stay.
		errs := checkPodIdentityUnchanged(in.Old, in.Pod)
		for _, c := range ImagesChanged(in.Old, in.Pod) {
			errs = append(errs, field.Forbidden(c.Path, fmt.Sprintf(
				"container %q: an agent pod's image is the one its Job was admitted with (%q), not %q: policy.images.allow judged that one; create another run instead", c.Name, c.Old, c.New)))
		}
		return errs
	}
	if in.Subresource != "" {
		return nil
	}
	ref := metav1.GetControllerOf(in.Pod)
	if ref == nil || ref.Kind != "Job" || !strings.HasPrefix(ref.APIVersion, "batch/") {
		return field.ErrorList{field.Forbidden(field.NewPath("metadata", "ownerReferences"),
			"a pod labeled paperclip.io/ is an agent pod, and agent pods are made by the Job controller from an agent Job clipjob admitted; create a Job labeled paperclip.io/agent-id instead")}
	}
	if !slices.Contains(JobControllers, in.Creator) {
		return field.ErrorList{field.Forbidden(field.NewPath("metadata", "ownerReferences"),
			fmt.Sprintf("agent pods are made by the Job controller (%s), not by %q; create a Job labeled paperclip.io/agent-id instead",
				strings.Join(JobControllers, " or "), in.Creator))}
	}
	return nil
}

// identityLabel reports whether a pod label says which run, agent or Job
// the pod belongs to: the contract's, and the Job controller's own.
func identityLabel(key string) bool {
	return strings.HasPrefix(key, contract.Prefix) || strings.HasPrefix(key, "batch.kubernetes.io/") ||
		key == "controller-uid" || key == "job-name"
}

// checkPodIdentityUnchanged keeps an agent pod the Job controller's copy
// after admission: which agent, run and Job it belongs to is fixed. A
// relabelled pod could pass as another run to the relay (and forge its log
// and result), or leave its Job, which would make another pod beside it
// while the claim no longer counts it. Owner references may only be
// removed, as the garbage collector does when a Job is deleted orphaning
// its pods.
func checkPodIdentityUnchanged(old, pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	labels := field.NewPath("metadata", "labels")
	keys := map[string]bool{}
	for k := range old.Labels {
		keys[k] = true
	}
	for k := range pod.Labels {
		keys[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		oldV, hadOld := old.Labels[k]
		newV, hasNew := pod.Labels[k]
		if identityLabel(k) && (hadOld != hasNew || oldV != newV) {
			errs = append(errs, field.Forbidden(labels.Key(k), fmt.Sprintf(
				"is fixed on an agent pod (was %q): which agent, run and Job a pod belongs to does not change", oldV)))
		}
	}
	for i, ref := range pod.OwnerReferences {
		if !slices.ContainsFunc(old.OwnerReferences, func(o metav1.OwnerReference) bool { return equality.Semantic.DeepEqual(o, ref) }) {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "ownerReferences").Index(i),
				"an agent pod's owner references may only be removed, not added or changed"))
		}
	}
	return errs
}

// ImageChange is a container whose image an UPDATE of its pod changed.
type ImageChange struct {
	Path           *field.Path
	Name, Old, New string
}

// ImagesChanged are the containers and init containers whose image differs
// between the stored pod and the updated one (the API server lets an
// update change images and little else of a pod's spec, and kubelet then
// restarts the container as the new image, with its mounts and env).
func ImagesChanged(old, pod *corev1.Pod) []ImageChange {
	var out []ImageChange
	for _, set := range []struct {
		path     *field.Path
		old, new []corev1.Container
	}{{field.NewPath("spec", "initContainers"), old.Spec.InitContainers, pod.Spec.InitContainers},
		{field.NewPath("spec", "containers"), old.Spec.Containers, pod.Spec.Containers}} {
		for i, c := range set.new {
			if i < len(set.old) && set.old[i].Image != c.Image {
				out = append(out, ImageChange{set.path.Index(i).Child("image"), c.Name, set.old[i].Image, c.Image})
			}
		}
	}
	return out
}
