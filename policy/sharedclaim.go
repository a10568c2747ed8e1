package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
)

// ReplicaSetControllers are the users the API server names when the
// ReplicaSet controller creates a pod (see JobControllers).
var ReplicaSetControllers = []string{"system:serviceaccount:kube-system:replicaset-controller", "system:kube-controller-manager"}

// SharedClaimInput is the admission of a pod that is no agent run's, in a
// namespace whose agent runs mount the shared claim.
type SharedClaimInput struct {
	Pod *corev1.Pod
	// Ephemeral: an UPDATE adding ephemeral containers (kubectl debug).
	Ephemeral bool
	// Images: an UPDATE changing these containers' images.
	Images []ImageChange
	// Creator is the user the API server says sent the request.
	Creator string
	// Claim is the shared claim's name (the source's, in every namespace
	// agents run in that is not a tenant's).
	Claim string
	// Deployments are those whose pods may mount it: the source (in its
	// namespace) and those policy.sharedClaim.deployments lists in the
	// pod's namespace, by name.
	Deployments []string
	// CSIDrivers (globs, policy.csiDrivers) are the drivers an inline CSI
	// volume may name; another driver might reach the shared claim's
	// storage unseen (an NFS CSI driver given its server and share).
	CSIDrivers []string
	// Claims looks other claims up (a clone of the shared one);
	// ReplicaSets and DeploymentOf the owners of a pod. A *FactUnknown
	// leaves the verdict undecided.
	Claims       ClaimLookup
	ReplicaSets  func(namespace, name string) (*appsv1.ReplicaSet, error)
	DeploymentOf func(namespace, name string) (*appsv1.Deployment, error)
}

// EvaluateSharedClaim keeps Paperclip's home to agent runs and the
// source's own pods. The shared claim holds the instance's .env (the
// secret that signs every agent's token), secrets/master.key and every
// company's data; a run mounts only its own directories of it, so any
// other pod of the namespace that mounts it — whole, at any subPath, or a
// clone of it (an ephemeral volume or another claim whose data source is
// it) — would read what the runs may not. Such a pod is admitted only as
// the pod of an allowed Deployment: made by the ReplicaSet controller from
// a ReplicaSet that Deployment controls and whose template is the
// Deployment's. Labels and ServiceAccounts prove nothing (any pod may copy
// them); a ReplicaSet's owner reference can be written by hand, but not
// the Deployment's template. Ephemeral containers on such a pod are
// refused: `kubectl debug` would read the home beside the server.
func EvaluateSharedClaim(in SharedClaimInput) (field.ErrorList, []Undecided) {
	reach, errs, undecided := sharedClaimVolumes(in)
	if len(reach) == 0 || len(errs) > 0 {
		return errs, undecided
	}
	if len(in.Images) > 0 {
		for _, c := range in.Images {
			errs = append(errs, field.Forbidden(c.Path, fmt.Sprintf(
				"container %q: this pod mounts the shared claim %q (Paperclip's home), and its images stay those it was admitted with (%q, not %q): "+
					"kubelet would restart the container as the new image beside the home; change its Deployment's template instead", c.Name, in.Claim, c.Old, c.New)))
		}
		return errs, nil
	}
	if in.Ephemeral {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "ephemeralContainers"), fmt.Sprintf(
			"this pod mounts the shared claim %q (Paperclip's home), and takes no ephemeral containers (kubectl debug): one would read the home beside it; "+
				"read the pod through its logs, or set policy.sharedClaim.mode: Disabled in the clipjob config for the time", in.Claim))}, nil
	}
	why, u, err := deploymentPod(in)
	switch {
	case u != nil:
		return nil, append(undecided, *u)
	case err != nil:
		return field.ErrorList{field.InternalError(field.NewPath("metadata", "ownerReferences"), err)}, nil
	case why == "":
		return nil, undecided
	}
	allowed := "no Deployment"
	if len(in.Deployments) > 0 {
		allowed = "Deployment " + strings.Join(in.Deployments, ", ")
	}
	for _, r := range reach {
		errs = append(errs, field.Forbidden(r.path, fmt.Sprintf(
			"%s, and Paperclip's home is on it (the instance's .env, secrets/master.key, every company's data): in a namespace agents run in, only agent runs clipjob completes and the pods of %s mount it, and %s; "+
				"run this as an agent Job labeled paperclip.io/agent-id, or list its Deployment in policy.sharedClaim.deployments in the clipjob config",
			r.what, allowed, why)))
	}
	return errs, nil
}

type sharedReach struct {
	path *field.Path
	what string
}

// sharedClaimVolumes are the pod's volumes that reach the shared claim:
// it by name, or a clone of it.
func sharedClaimVolumes(in SharedClaimInput) ([]sharedReach, field.ErrorList, []Undecided) {
	var reach []sharedReach
	var errs field.ErrorList
	var undecided []Undecided
	ns := in.Pod.Namespace
	for i, v := range in.Pod.Spec.Volumes {
		p := field.NewPath("spec", "volumes").Index(i)
		switch {
		case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == in.Claim:
			reach = append(reach, sharedReach{p.Child("persistentVolumeClaim", "claimName"), fmt.Sprintf("volume %q mounts the shared claim %q", v.Name, in.Claim)})
		case v.PersistentVolumeClaim != nil:
			name := v.PersistentVolumeClaim.ClaimName
			if in.Claims == nil {
				undecided = append(undecided, Undecided{Fact: "PersistentVolumeClaim " + ns + "/" + name, Give: "no PersistentVolumeClaim lookup",
					WithoutIt: "the pod is admitted and waits for the claim", WithIt: "refused if it is a clone of the shared claim " + in.Claim, AdmittedWithout: true})
				continue
			}
			pvc, err := in.Claims(ns, name)
			var unknown *FactUnknown
			switch {
			case errors.As(err, &unknown):
				undecided = append(undecided, Undecided{Fact: unknown.Fact, Give: unknown.Give,
					WithoutIt: "the pod is admitted and waits for the claim", WithIt: "refused if it is a clone of the shared claim " + in.Claim, AdmittedWithout: true})
			case apierrors.IsNotFound(err):
			case err != nil:
				errs = append(errs, field.InternalError(p, fmt.Errorf("looking up PersistentVolumeClaim %s/%s: %w", ns, name, err)))
			case ClonesClaim(pvc.Spec, ns, in.Claim):
				reach = append(reach, sharedReach{p.Child("persistentVolumeClaim", "claimName"), fmt.Sprintf("claim %q is a clone of the shared claim %q (its dataSource)", name, in.Claim)})
			}
		case v.CSI != nil && !config.MatchAny(in.CSIDrivers, v.CSI.Driver):
			reach = append(reach, sharedReach{p.Child("csi", "driver"), fmt.Sprintf(
				"inline CSI volume %q of driver %q (not in policy.csiDrivers) may reach the shared claim's storage unseen (an NFS driver given its server and share)", v.Name, v.CSI.Driver)})
		case v.Ephemeral != nil && v.Ephemeral.VolumeClaimTemplate != nil && ClonesClaim(v.Ephemeral.VolumeClaimTemplate.Spec, ns, in.Claim):
			reach = append(reach, sharedReach{p.Child("ephemeral", "volumeClaimTemplate", "spec", "dataSource"),
				fmt.Sprintf("ephemeral volume %q is a clone of the shared claim %q", v.Name, in.Claim)})
		}
	}
	return reach, errs, undecided
}

// clonesClaim: the claim spec starts from the claim named claim.
func ClonesClaim(spec corev1.PersistentVolumeClaimSpec, ns, claim string) bool {
	if ds := spec.DataSource; ds != nil && ds.Kind == "PersistentVolumeClaim" && (ds.APIGroup == nil || *ds.APIGroup == "") && ds.Name == claim {
		return true
	}
	ref := spec.DataSourceRef
	return ref != nil && ref.Kind == "PersistentVolumeClaim" && (ref.APIGroup == nil || *ref.APIGroup == "") && ref.Name == claim &&
		(ref.Namespace == nil || *ref.Namespace == ns)
}

// deploymentPod says why the pod is not one of an allowed Deployment's
// ("" when it is one).
func deploymentPod(in SharedClaimInput) (string, *Undecided, error) {
	pod := in.Pod
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "ReplicaSet" || !strings.HasPrefix(ref.APIVersion, "apps/") {
		return fmt.Sprintf("this pod is no Deployment's (made by %q)", in.Creator), nil, nil
	}
	if !slices.Contains(ReplicaSetControllers, in.Creator) {
		return fmt.Sprintf("a Deployment's pods are made by the ReplicaSet controller (%s), not by %q", strings.Join(ReplicaSetControllers, " or "), in.Creator), nil, nil
	}
	rs, why, u, err := lookupOwner(in.ReplicaSets, "ReplicaSet", pod.Namespace, ref)
	if rs == nil {
		return why, u, err
	}
	dref := metav1.GetControllerOf(rs)
	if dref == nil || dref.Kind != "Deployment" || !strings.HasPrefix(dref.APIVersion, "apps/") || !slices.Contains(in.Deployments, dref.Name) {
		return fmt.Sprintf("ReplicaSet %s is controlled by no Deployment allowed here", rs.Name), nil, nil
	}
	d, why, u, err := lookupOwner(in.DeploymentOf, "Deployment", pod.Namespace, dref)
	if d == nil {
		return why, u, err
	}
	tpl := rs.Spec.Template.DeepCopy()
	delete(tpl.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	if len(tpl.Labels) == 0 {
		tpl.Labels = nil
	}
	want := d.Spec.Template.DeepCopy()
	if len(want.Labels) == 0 {
		want.Labels = nil
	}
	if !equality.Semantic.DeepEqual(tpl, want) {
		return fmt.Sprintf("ReplicaSet %s's pod template is not Deployment %s's (a ReplicaSet written by hand, or an older revision of the Deployment)", rs.Name, d.Name), nil, nil
	}
	// The ReplicaSet read now proves nothing of the template the
	// ReplicaSet controller made this pod from: a ReplicaSet written with a
	// sidecar and patched back at once leaves the controller's cache with
	// the sidecar while the live one is the Deployment's. The pod itself
	// must be the Deployment's template.
	if diff := notTheTemplate(pod.Spec, d.Spec.Template.Spec); diff != "" {
		return fmt.Sprintf("the pod is not Deployment %s's template: %s (a ReplicaSet written with other containers)", d.Name, diff), nil, nil
	}
	return "", nil, nil
}

// notTheTemplate says what of the pod's spec is not the template's ("" when
// nothing): every volume, container and init container (image, command,
// args, env, mounts, probes, lifecycle, security context: all of it but
// resources, which a LimitRange fills in), the pod's security context,
// ServiceAccount and host namespaces, and every other setting of the pod
// (host aliases, DNS, hostname, runtime class, restart policy...). What
// admission adds to every pod is left out: the ServiceAccount token's
// projected kube-api-access-* volume as the ServiceAccount admission
// plugin makes it (the token, the cluster's CA, the namespace; told by its
// sources, not its name, which a template may take) and its mounts at the
// token's path, the "default" ServiceAccount, and where the pod may run
// (tolerations, priority, overhead, node selection), which admission
// plugins fill in and no container reads.
func notTheTemplate(pod, tpl corev1.PodSpec) string {
	injected := map[string]bool{}
	for _, v := range pod.Volumes {
		if tokenVolume(v) && !slices.ContainsFunc(tpl.Volumes, func(t corev1.Volume) bool { return t.Name == v.Name }) {
			injected[v.Name] = true
		}
	}
	vols := slices.DeleteFunc(slices.Clone(pod.Volumes), func(v corev1.Volume) bool { return injected[v.Name] })
	if !equality.Semantic.DeepEqual(nilIfEmpty(vols), nilIfEmpty(tpl.Volumes)) {
		return "its volumes differ"
	}
	for _, set := range []struct {
		what     string
		pod, tpl []corev1.Container
	}{{"container", pod.Containers, tpl.Containers}, {"init container", pod.InitContainers, tpl.InitContainers}} {
		if len(set.pod) != len(set.tpl) {
			return fmt.Sprintf("it has %d %ss, the template %d", len(set.pod), set.what, len(set.tpl))
		}
		for i := range set.pod {
			if !equality.Semantic.DeepEqual(asTemplated(set.pod[i], injected), asTemplated(set.tpl[i], nil)) {
				return fmt.Sprintf("%s %q differs", set.what, set.pod[i].Name)
			}
		}
	}
	sa := tpl.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	switch {
	case pod.ServiceAccountName != sa && !(pod.ServiceAccountName == "" && tpl.ServiceAccountName == ""):
		return fmt.Sprintf("its ServiceAccount is %q", pod.ServiceAccountName)
	case !equality.Semantic.DeepEqual(pod.SecurityContext, tpl.SecurityContext):
		return "its securityContext differs"
	case !equality.Semantic.DeepEqual(pod.AutomountServiceAccountToken, tpl.AutomountServiceAccountToken),
		pod.HostNetwork != tpl.HostNetwork, pod.HostPID != tpl.HostPID, pod.HostIPC != tpl.HostIPC,
		!equality.Semantic.DeepEqual(pod.ShareProcessNamespace, tpl.ShareProcessNamespace), !equality.Semantic.DeepEqual(pod.HostUsers, tpl.HostUsers):
		return "its token or host settings differ"
	case len(pod.EphemeralContainers) > 0:
		return "it has ephemeral containers"
	case !equality.Semantic.DeepEqual(podSettings(pod), podSettings(tpl)):
		return "its pod settings differ (host aliases, DNS, hostname, runtime class, restart policy...)"
	}
	return ""
}

// podSettings is the spec less what notTheTemplate compares on its own and
// what admission plugins fill in (placement, priority, overhead).
func podSettings(s corev1.PodSpec) corev1.PodSpec {
	s = *s.DeepCopy()
	s.Volumes, s.Containers, s.InitContainers, s.EphemeralContainers = nil, nil, nil, nil
	s.ServiceAccountName, s.DeprecatedServiceAccount = "", ""
	s.Tolerations, s.NodeSelector, s.Affinity, s.SchedulingGates = nil, nil, nil, nil
	s.Priority, s.PriorityClassName, s.PreemptionPolicy, s.Overhead, s.Resources = nil, "", nil, nil, nil
	if s.EnableServiceLinks == nil { // defaulted on pods, not on templates
		s.EnableServiceLinks = ptr.To(corev1.DefaultEnableServiceLinks)
	}
	return s
}

// tokenVolumePath is where the ServiceAccount admission plugin mounts the
// token volume in every container.
const tokenVolumePath = "/var/run/secrets/kubernetes.io/serviceaccount"

// tokenVolume: v is the ServiceAccount admission plugin's token volume,
// by its name and by what it projects (the pod's own token for the API
// server, the cluster's CA, the namespace), nothing else.
func tokenVolume(v corev1.Volume) bool {
	if !strings.HasPrefix(v.Name, "kube-api-access-") || v.Projected == nil || len(v.Projected.Sources) == 0 {
		return false
	}
	for _, s := range v.Projected.Sources {
		switch {
		case s.Secret != nil || s.ClusterTrustBundle != nil || s.PodCertificate != nil:
			return false
		case s.ServiceAccountToken != nil && s.ConfigMap == nil && s.DownwardAPI == nil:
			if s.ServiceAccountToken.Audience != "" || s.ServiceAccountToken.Path != "token" {
				return false
			}
		case s.ConfigMap != nil && s.DownwardAPI == nil:
			if s.ConfigMap.Name != "kube-root-ca.crt" {
				return false
			}
		case s.DownwardAPI != nil:
			for _, f := range s.DownwardAPI.Items {
				if f.FieldRef == nil || f.FieldRef.FieldPath != "metadata.namespace" || f.ResourceFieldRef != nil {
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}

// tokenMount: m is the token volume's mount as the plugin adds it.
func tokenMount(m corev1.VolumeMount) bool {
	return m.MountPath == tokenVolumePath && m.ReadOnly && m.SubPath == "" && m.SubPathExpr == "" &&
		(m.MountPropagation == nil || *m.MountPropagation == corev1.MountPropagationNone) &&
		(m.RecursiveReadOnly == nil || *m.RecursiveReadOnly == corev1.RecursiveReadOnlyDisabled)
}

// asTemplated is a container less its resources and the mounts of the
// injected token volumes at the token's path (a mount of one elsewhere,
// over a file the container reads, is the container's own).
func asTemplated(c corev1.Container, injected map[string]bool) corev1.Container {
	c = *c.DeepCopy()
	c.Resources, c.ResizePolicy = corev1.ResourceRequirements{}, nil
	c.VolumeMounts = nilIfEmpty(slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return injected[m.Name] && tokenMount(m) }))
	return c
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// lookupOwner finds the owner ref names, or says why not.
func lookupOwner[T metav1.Object](get func(ns, name string) (T, error), kind, ns string, ref *metav1.OwnerReference) (T, string, *Undecided, error) {
	var zero T
	if get == nil {
		return zero, "", &Undecided{Fact: kind + " " + ns + "/" + ref.Name, Give: "no " + kind + " lookup",
			WithoutIt: "the pod is refused", WithIt: "admitted if it is an allowed Deployment's"}, nil
	}
	o, err := get(ns, ref.Name)
	var unknown *FactUnknown
	switch {
	case errors.As(err, &unknown):
		return zero, "", &Undecided{Fact: unknown.Fact, Give: unknown.Give, WithoutIt: "the pod is refused", WithIt: "admitted if it is an allowed Deployment's"}, nil
	case apierrors.IsNotFound(err):
		return zero, fmt.Sprintf("its %s %s does not exist", kind, ref.Name), nil, nil
	case err != nil:
		return zero, "", nil, fmt.Errorf("looking up %s %s/%s: %w", kind, ns, ref.Name, err)
	case o.GetUID() != ref.UID:
		return zero, fmt.Sprintf("its owner reference names %s %s with another UID", kind, ref.Name), nil, nil
	}
	return o, "", nil, nil
}
