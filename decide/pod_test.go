package decide_test

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/policy"
)

// podCluster is what the pod rule looks up: the source Deployment of the
// fixture, a backup Deployment, their ReplicaSets, one forged ReplicaSet
// that names the source as its controller with a template of its own,
// and two other claims, one a clone of the shared one.
type podCluster struct {
	deployments map[string]*appsv1.Deployment
	replicaSets map[string]*appsv1.ReplicaSet
	pvcs        map[string]*corev1.PersistentVolumeClaim
}

const (
	rsController  = "system:serviceaccount:kube-system:replicaset-controller"
	jobController = "system:serviceaccount:kube-system:job-controller"
	someone       = "system:serviceaccount:paperclip:tenant-ci"
)

func newPodCluster(source *appsv1.Deployment) *podCluster {
	c := &podCluster{deployments: map[string]*appsv1.Deployment{}, replicaSets: map[string]*appsv1.ReplicaSet{}, pvcs: map[string]*corev1.PersistentVolumeClaim{}}
	src := source.DeepCopy()
	src.UID = "uid-deploy-paperclip"
	backup := src.DeepCopy()
	backup.Name, backup.UID = "paperclip-backup", "uid-deploy-backup"
	backup.Spec.Template.Spec.Containers = []corev1.Container{{Name: "restic", Image: "restic/restic:0.17",
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}}}}
	for _, d := range []*appsv1.Deployment{src, backup} {
		c.deployments[d.Name] = d
		c.replicaSets[d.Name+"-abc"] = replicaSetOf(d, d.Name+"-abc", d.Spec.Template)
	}
	evil := src.Spec.Template.DeepCopy()
	evil.Spec.Containers[1].Image = "evil.example.com/reader:1"
	c.replicaSets["paperclip-forged"] = replicaSetOf(src, "paperclip-forged", *evil)
	c.pvcs["scratch"] = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "scratch", Namespace: "paperclip"}}
	c.pvcs["copy"] = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: "paperclip"},
		Spec: corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}}}
	return c
}

// replicaSetOf is the ReplicaSet the Deployment controller makes of d:
// its template with the pod-template-hash label, controlled by d.
func replicaSetOf(d *appsv1.Deployment, name string, tpl corev1.PodTemplateSpec) *appsv1.ReplicaSet {
	tpl = *tpl.DeepCopy()
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	tpl.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = "abc"
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, UID: types.UID("uid-rs-" + name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{Template: tpl}}
}

func (c *podCluster) facts(f decide.Facts) decide.Facts {
	f.PVCs = func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
		if p, ok := c.pvcs[name]; ok {
			return p, nil
		}
		return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
	}
	f.ReplicaSets = func(ns, name string) (*appsv1.ReplicaSet, error) {
		if r, ok := c.replicaSets[name]; ok {
			return r, nil
		}
		return nil, apierrors.NewNotFound(appsv1.Resource("replicasets"), name)
	}
	f.Deployments = func(ns, name string) (*appsv1.Deployment, error) {
		if d, ok := c.deployments[name]; ok {
			return d, nil
		}
		return nil, apierrors.NewNotFound(appsv1.Resource("deployments"), name)
	}
	return f
}

// podOf is the pod the ReplicaSet controller makes of rs.
func (c *podCluster) podOf(rs string) *corev1.Pod {
	r := c.replicaSets[rs]
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: rs + "-x1", Namespace: "paperclip", Labels: r.Spec.Template.Labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: r.Name, UID: r.UID, Controller: ptr.To(true)}}},
		Spec: *r.Spec.Template.Spec.DeepCopy()}
}

// bare is a pod of someone's own with one volume.
func bare(v corev1.Volume, mount corev1.VolumeMount) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: "paperclip"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{v}, Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36", VolumeMounts: []corev1.VolumeMount{mount}}}}}
}

func claimVolume(claim string) corev1.Volume {
	return corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

// Paperclip's home is on the shared claim (the instance's .env with the
// secret that signs every agent's token, secrets/master.key, every
// company's data). A run mounts only its own directories; no other pod of
// the namespace may mount the claim, at any subPath, or a clone of it,
// unless it is the source Deployment's (or a listed Deployment's) pod, as
// the ReplicaSet controller makes it from that Deployment's template.
// Each hostile case names the field it is refused on.
func TestOnlyAgentRunsAndTheServerMountPaperclipsHome(t *testing.T) {
	fx, inh := claudeFixture(t)
	c := newPodCluster(fx.Source)
	facts := c.facts(sourceFacts(inh))
	home := corev1.VolumeMount{Name: "home", MountPath: "/data"}

	copiedLabels := bare(claimVolume("paperclip-data"), home)
	copiedLabels.Labels = c.podOf("paperclip-abc").Labels
	copiedLabels.Spec.ServiceAccountName = "paperclip"
	agentLabeled := bare(claimVolume("paperclip-data"), home)
	agentLabeled.Labels = map[string]string{contract.LabelAgentID: "agent-7f3a", contract.LabelRunID: "run-1"}
	forgedOwner := bare(claimVolume("paperclip-data"), home)
	forgedOwner.OwnerReferences = c.podOf("paperclip-abc").OwnerReferences
	wrongUID := c.podOf("paperclip-abc")
	wrongUID.OwnerReferences[0].UID = "uid-other"
	plainJob := bare(claimVolume("paperclip-data"), home)
	plainJob.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "nightly", UID: "uid-job", Controller: ptr.To(true)}}
	ephemeral := bare(corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
		VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
			DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}}}}}}, home)
	debugged := c.podOf("paperclip-abc")
	debugged.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox:1.36"}}}
	// The ReplicaSet controller made this pod from a version of its
	// ReplicaSet with a sidecar, patched back to the Deployment's template
	// before the webhook read it (hostile review of H1).
	sidecar := c.podOf("paperclip-abc")
	sidecar.Spec.Containers = append(sidecar.Spec.Containers, corev1.Container{Name: "reader", Image: "evil.example.com/home-reader:1",
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/home"}}})
	swapped := c.podOf("paperclip-abc")
	swapped.Spec.Containers[0].Image = "evil.example.com/home-reader:1"
	// The source's pod as admission leaves it: the token's projected
	// volume mounted in every container, the default ServiceAccount, a
	// LimitRange's resources, the default tolerations.
	admitted := c.podOf("paperclip-abc")
	admitted.Spec.Volumes = append(admitted.Spec.Volumes, corev1.Volume{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o644), Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}}}}}})
	for i := range admitted.Spec.Containers {
		admitted.Spec.Containers[i].VolumeMounts = append(admitted.Spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true})
		admitted.Spec.Containers[i].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	}
	if admitted.Spec.ServiceAccountName == "" {
		admitted.Spec.ServiceAccountName = "default"
	}
	admitted.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)}}
	admitted.Spec.Priority, admitted.Spec.PreemptionPolicy = ptr.To[int32](0), ptr.To(corev1.PreemptLowerPriority)
	admitted.Spec.EnableServiceLinks = ptr.To(true) // defaulted on pods, not on templates
	// A volume named as the token's is no licence (second hostile review of
	// H1): one of the tenant's ConfigMap mounted over a file of the home, or
	// the token's own volume mounted elsewhere, is not the template; nor
	// are host names or DNS the template does not set.
	lookalike := admitted.DeepCopy()
	lookalike.Spec.Volumes = append(lookalike.Spec.Volumes, corev1.Volume{Name: "kube-api-access-plugins", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "plugins"}}}}}}})
	lookalike.Spec.Containers[0].VolumeMounts = append(lookalike.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "kube-api-access-plugins", MountPath: "/paperclip/instances/default/adapter-plugins.json", SubPath: "adapter-plugins.json", ReadOnly: true})
	tokenElsewhere := admitted.DeepCopy()
	tokenElsewhere.Spec.Containers[0].VolumeMounts = append(tokenElsewhere.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "kube-api-access-x7k2p", MountPath: "/paperclip/instances/default/.env", SubPath: "namespace", ReadOnly: true})
	aliased := admitted.DeepCopy()
	aliased.Spec.HostAliases = []corev1.HostAlias{{IP: "203.0.113.66", Hostnames: []string{"db"}}}
	redirected := admitted.DeepCopy()
	redirected.Spec.DNSPolicy, redirected.Spec.DNSConfig = corev1.DNSNone, &corev1.PodDNSConfig{Nameservers: []string{"203.0.113.66"}}
	inlineCSI := bare(corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "nfs.csi.k8s.io",
		VolumeAttributes: map[string]string{"server": "nfs.example", "share": "/exports/paperclip"}}}}, home)
	listed, off, tenant, csiListed := *fx.Config, *fx.Config, *fx.Config, *fx.Config // shallow: only these fields change
	csiListed.Policy.CSIDrivers = []string{"nfs.csi.*"}
	listed.Policy.SharedClaim.Deployments = []string{"paperclip/paperclip-backup"}
	// Listed in another namespace: the name alone allows nothing here (a
	// tenant who may create Deployments would take it).
	listedElsewhere := *fx.Config
	listedElsewhere.Policy.SharedClaim.Deployments = []string{"backups/paperclip-backup"}
	off.Policy.SharedClaim.Mode = config.SharedClaimDisabled
	tenant.TenantNamespaces = []string{"paperclip"}

	for _, tc := range []struct {
		name        string
		pod         *corev1.Pod
		creator     string
		subresource string
		cfg         *config.Config
		refusedOn   string // "" admits
	}{
		{"the source Deployment's pod", c.podOf("paperclip-abc"), rsController, "", nil, ""},
		{"the source Deployment's pod as admission leaves it", admitted, rsController, "", nil, ""},
		{"a sidecar from a ReplicaSet since patched back to the Deployment's template", sidecar, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a tenant's ConfigMap in a volume named as the token's, its ReplicaSet patched back", lookalike, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"the token's volume mounted over a file of the home, its ReplicaSet patched back", tokenElsewhere, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"host aliases the template does not have, its ReplicaSet patched back", aliased, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a DNS server the template does not name, its ReplicaSet patched back", redirected, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"another image than the Deployment's, its ReplicaSet patched back", swapped, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a pod with no claim", bare(corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}, home), someone, "", nil, ""},
		{"a pod with another claim", bare(claimVolume("scratch"), home), someone, "", nil, ""},
		{"an inline CSI volume of a driver policy.csiDrivers does not list", inlineCSI, someone, "", nil, "spec.volumes[0].csi.driver"},
		{"an inline CSI volume of a listed driver", inlineCSI, someone, "", &csiListed, ""},
		{"a bare pod with the claim", bare(claimVolume("paperclip-data"), home), someone, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a bare pod with the server's labels and ServiceAccount", copiedLabels, someone, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a bare pod with agent labels", agentLabeled, someone, "", nil, "metadata.ownerReferences"},
		{"a subPath to the instance", bare(claimVolume("paperclip-data"), corev1.VolumeMount{Name: "home", MountPath: "/i", SubPath: "instances/default"}), someone, "", nil,
			"spec.volumes[0].persistentVolumeClaim.claimName"},
		{"an ephemeral clone of the claim", ephemeral, someone, "", nil, "spec.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSource"},
		{"another claim cloned from it", bare(claimVolume("copy"), home), someone, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a Job's pod with no agent label", plainJob, jobController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a bare pod naming the server's ReplicaSet as owner", forgedOwner, someone, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"an owner reference with another UID", wrongUID, rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a ReplicaSet made by hand under the source Deployment", c.podOf("paperclip-forged"), rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"an unlisted Deployment's pod", c.podOf("paperclip-backup-abc"), rsController, "", nil, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"a listed Deployment's pod", c.podOf("paperclip-backup-abc"), rsController, "", &listed, ""},
		{"a Deployment of a name listed in another namespace", c.podOf("paperclip-backup-abc"), rsController, "", &listedElsewhere, "spec.volumes[0].persistentVolumeClaim.claimName"},
		{"kubectl debug on the server's pod", debugged, someone, "ephemeralcontainers", nil, "spec.ephemeralContainers"},
		{"a bare pod with the claim, the rule disabled", bare(claimVolume("paperclip-data"), home), someone, "", &off, ""},
		{"a bare pod with the claim in a tenant namespace", bare(claimVolume("paperclip-data"), home), someone, "", &tenant, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == nil {
				cfg = fx.Config
			}
			op := policy.Create
			if tc.subresource != "" {
				op = policy.Update
			}
			wantRefusedOn(t, decide.Pod(decide.PodInput{Operation: op, Pod: tc.pod, Subresource: tc.subresource, Creator: tc.creator, Config: cfg, Facts: facts}), tc.refusedOn)
		})
	}
	// The message names the claim, what is on it and the fix.
	v := decide.Pod(decide.PodInput{Operation: policy.Create, Pod: bare(claimVolume("paperclip-data"), home), Creator: someone, Config: fx.Config, Facts: facts})
	for _, want := range []string{`"paperclip-data"`, ".env", "secrets/master.key", "Deployment paperclip", "policy.sharedClaim.deployments", "paperclip.io/agent-id"} {
		if v.Refusal == nil || !strings.Contains(v.Refusal.Message, want) {
			t.Errorf("the refusal does not name %s: %+v", want, v.Refusal)
		}
	}
}

// An update may change a pod's images, and kubelet restarts the container
// as the new image with the pod's mounts and env (hostile review of H1): a
// pod that reaches the shared claim, or an agent pod (whose images the
// allowlist judged on its Job), keeps the images it was admitted with.
// Another pod's images are not clipjob's business.
func TestAPodThatReachesTheSharedClaimKeepsItsImages(t *testing.T) {
	fx, inh := claudeFixture(t)
	c := newPodCluster(fx.Source)
	facts := c.facts(sourceFacts(inh))
	swap := func(p *corev1.Pod, init bool) *corev1.Pod {
		p = p.DeepCopy()
		if init {
			p.Spec.InitContainers[0].Image = "evil.example.com/home-reader:1"
		} else {
			p.Spec.Containers[0].Image = "evil.example.com/home-reader:1"
		}
		return p
	}
	server := c.podOf("paperclip-abc")
	withInit := server.DeepCopy()
	withInit.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox:1.36"}}
	agent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "run-1-x", Namespace: "paperclip",
		Labels:          map[string]string{contract.LabelAgentID: "agent-7f3a", contract.LabelRunID: "run-1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "run-1", UID: "uid-job", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "ghcr.io/paperclipai/agent:1"}}}}
	plain := bare(corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}, corev1.VolumeMount{Name: "home", MountPath: "/data"})
	relabelled := server.DeepCopy()
	relabelled.Labels = map[string]string{"extra": "x"}
	for _, tc := range []struct {
		name      string
		old, pod  *corev1.Pod
		refusedOn string
	}{
		{"the server pod's image", server, swap(server, false), "spec.containers[0].image"},
		{"the server pod's init container's image", withInit, swap(withInit, true), "spec.initContainers[0].image"},
		{"an agent pod's image", agent, swap(agent, false), "spec.containers[0].image"},
		{"a pod without the claim", plain, swap(plain, false), ""},
		{"the server pod relabelled", server, relabelled, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRefusedOn(t, decide.Pod(decide.PodInput{Operation: policy.Update, Pod: tc.pod, Old: tc.old, Creator: someone, Config: fx.Config, Facts: facts}), tc.refusedOn)
		})
	}
}

// wantRefusedOn: the verdict is decided, and a 403 naming the field
// refusedOn, or (refusedOn "") no refusal.
func wantRefusedOn(t *testing.T, v decide.PodVerdict, refusedOn string) {
	t.Helper()
	switch {
	case len(v.Undecided) > 0:
		t.Fatalf("undecided: %v", v.Undecided)
	case refusedOn == "" && v.Refusal != nil:
		t.Errorf("refused: %s", v.Refusal.Message)
	case refusedOn != "" && v.Refusal == nil:
		t.Errorf("BREAK: admitted; want it refused on %s", refusedOn)
	case refusedOn != "" && (v.Refusal.Code != 403 || !strings.HasPrefix(v.Refusal.Message, refusedOn+": Forbidden")):
		t.Errorf("refused %d %q; want 403 on %s", v.Refusal.Code, v.Refusal.Message, refusedOn)
	}
}

// A claim may not start from the shared claim where agents run: a pod is
// judged with the claims it names as they are when it is created, so a
// pod naming a claim not made yet, then the claim made as a clone of the
// shared one, would mount a copy of Paperclip's home (hostile review of
// H1). Other claims, tenants' namespaces and Disabled are not judged.
func TestNoClaimStartsFromTheSharedClaim(t *testing.T) {
	fx, inh := claudeFixture(t)
	facts := newPodCluster(fx.Source).facts(sourceFacts(inh))
	pvc := func(ds *corev1.TypedLocalObjectReference, ref *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: "paperclip"},
			Spec: corev1.PersistentVolumeClaimSpec{DataSource: ds, DataSourceRef: ref}}
	}
	off, tenant := *fx.Config, *fx.Config
	off.Policy.SharedClaim.Mode = config.SharedClaimDisabled
	tenant.TenantNamespaces = []string{"paperclip"}
	for _, tc := range []struct {
		name      string
		pvc       *corev1.PersistentVolumeClaim
		cfg       *config.Config
		refusedOn string
	}{
		{"a clone of the shared claim", pvc(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}, nil), nil, "spec.dataSource"},
		{"a clone by dataSourceRef", pvc(nil, &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}), nil, "spec.dataSourceRef"},
		{"a clone of another claim", pvc(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "scratch"}, nil), nil, ""},
		{"an empty claim", pvc(nil, nil), nil, ""},
		{"a clone, the rule disabled", pvc(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}, nil), &off, ""},
		{"a clone in a tenant namespace", pvc(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}, nil), &tenant, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == nil {
				cfg = fx.Config
			}
			wantRefusedOn(t, decide.Claim(decide.ClaimInput{Claim: tc.pvc, Config: cfg, Facts: facts}), tc.refusedOn)
		})
	}
}
