package integration

// The shared claim (Paperclip's home) kept to agent runs and allowed
// Deployments' pods (policy.sharedClaim), against the attacks a hostile
// review of it found on the API server: each test fails without the fix
// it names.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// sharedClaimName is the claim the example Paperclip Deployment mounts.
const sharedClaimName = "paperclip-data"

// tenantClient is a ServiceAccount of the install's namespace holding
// rules there and nothing else: the hostile tenant.
func tenantClient(in *harness.Install, ctx context.Context, t *testing.T, name string, rules ...rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	token, err := harness.ServiceAccountToken(ctx, in.Cluster(), in.Namespace, name, rules)
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(in.Cluster().Config)
	rc.BearerToken = token
	return kubernetes.NewForConfigOrDie(rc)
}

func rule(group, resource string, verbs ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, Verbs: verbs}
}

// restrictedPod is a bare pod meeting Pod Security "restricted" with the
// given volumes mounted under /mnt/<name>.
func restrictedPod(ns, name string, vols ...corev1.Volume) *corev1.Pod {
	c := corev1.Container{Name: "reader", Image: "evil.example.com/reader:1", Command: []string{"cat", "/mnt/home/instances/default/.env"},
		SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}}
	for _, v := range vols {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}, Volumes: vols, RestartPolicy: corev1.RestartPolicyNever}}
}

func claimVolume(claim string) corev1.Volume {
	return corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

// serverPod scales the source Deployment to one replica (as its owner
// would) and returns its pod, made by the ReplicaSet controller and
// admitted by the pod webhook (as admission left it: token volume,
// defaults).
func serverPod(in *harness.Install, ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	if _, err := suite.cs.AppsV1().Deployments(in.Namespace).Patch(ctx, "paperclip", types.MergePatchType, []byte(`{"spec":{"replicas":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := suite.cs.CoreV1().Pods(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			if c := metav1.GetControllerOf(&pods.Items[i]); c != nil && c.Kind == "ReplicaSet" && pods.Items[i].DeletionTimestamp == nil {
				pod = &pods.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the source Deployment's pod was never made (is the pod webhook refusing the server itself?): %v", err)
	}
	return pod
}

// replicaSetPods are the pods the ReplicaSet rs controls, once there are any or
// timeout has passed.
func replicaSetPods(ctx context.Context, cs kubernetes.Interface, ns, rs string, timeout time.Duration) []corev1.Pod {
	var out []corev1.Pod
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		out = nil
		for _, p := range pods.Items {
			if c := metav1.GetControllerOf(&p); c != nil && c.Kind == "ReplicaSet" && c.Name == rs {
				out = append(out, p)
			}
		}
		return len(out) > 0, nil
	})
	return out
}

// A ReplicaSet written under the source Deployment with a sidecar that
// mounts the claim, and patched at once to the Deployment's template: the
// ReplicaSet controller makes pods from the version it cached (the
// sidecar's), so the webhook judges the pod itself against the
// Deployment's template, not the ReplicaSet it reads (3 of 10 admitted
// when it read the ReplicaSet). The source's own pod, as admission leaves
// it, is admitted.
func TestASidecarFromAReplicaSetPatchedBackIsRefused(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	serverPod(in, ctx, t)
	cs := tenantClient(in, ctx, t, "rs-flipper", rule("apps", "deployments", "get"), rule("apps", "replicasets", "create", "get", "update", "patch", "delete"),
		rule("", "pods", "get", "list"))
	sidecar := func(tmpl *corev1.PodTemplateSpec) {
		tmpl.Spec.Containers = append(tmpl.Spec.Containers, corev1.Container{Name: "sidecar", Image: "evil.example.com/home-reader:1",
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/home"}}})
	}
	if p := flipReplicaSets(ctx, t, in, cs, 10, sidecar, func(p *corev1.Pod) bool { return len(p.Spec.Containers) > 1 }); p != nil {
		t.Errorf("pod %s was admitted with the sidecar %s (%s) mounting the shared claim", p.Name, p.Spec.Containers[1].Name, p.Spec.Containers[1].Image)
	}
}

// An update may change a pod's images, and kubelet restarts the container
// as the new image with the pod's mounts and env: on the source
// Deployment's pod (Paperclip's home mounted) it is refused, as kubectl
// debug is.
func TestThePodOfTheSharedClaimKeepsItsImages(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	pod := serverPod(in, ctx, t)
	cs := tenantClient(in, ctx, t, "pod-patcher", rule("", "pods", "get", "list", "patch", "update"), rule("", "pods/ephemeralcontainers", "update", "patch"))
	dbg := pod.DeepCopy()
	dbg.Spec.EphemeralContainers = append(dbg.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox:1.36", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/home"}}}})
	if _, err := cs.CoreV1().Pods(in.Namespace).UpdateEphemeralContainers(ctx, pod.Name, dbg, metav1.UpdateOptions{}); err == nil {
		t.Error("kubectl debug on the server's pod was admitted")
	}
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"image":"evil.example.com/home-reader:1"}]}}`, pod.Spec.Containers[0].Name)
	_, err := cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec.containers[0].image") {
		t.Errorf("swapping the server pod's image: %v; want it refused on spec.containers[0].image", err)
	}
	// Labels still change freely.
	if _, err := cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"seen":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("relabelling the server's pod: %v", err)
	}
}

// An agent pod's images are its Job's, which policy.images.allow judged:
// a pod patch may not change them.
func TestAnAgentPodKeepsItsImages(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "image-swap"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := in.WaitPod(ctx, t, "image-swap", harness.Running)
	cs := tenantClient(in, ctx, t, "agent-pod-patcher", rule("", "pods", "get", "list", "patch", "update"))
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"image":"evil.example.com/miner:1"}]}}`, pod.Spec.Containers[0].Name)
	_, err := cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec.containers[0].image") {
		t.Errorf("swapping an agent pod's image: %v; want it refused on spec.containers[0].image", err)
	}
}

// A pod naming a claim that does not exist yet is admitted (it waits for
// the claim); the claim then made as a clone of the shared claim is
// refused, so the pod never mounts a copy of Paperclip's home. A claim
// of no data source is created as ever.
func TestNoClaimStartsFromTheSharedClaim(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	cs := tenantClient(in, ctx, t, "pvc-maker", rule("", "pods", "create", "get"), rule("", "persistentvolumeclaims", "create", "get", "delete"))
	claim := func(name string, from *corev1.TypedLocalObjectReference, ref *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: in.Namespace},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, StorageClassName: ptr.To("csi-clones"),
				Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}},
				DataSource: from, DataSourceRef: ref}}
	}
	if _, err := cs.CoreV1().Pods(in.Namespace).Create(ctx, restrictedPod(in.Namespace, "clone-later", claimVolume("clone-later")), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a pod of a claim not made yet: %v", err)
	}
	for _, c := range []*corev1.PersistentVolumeClaim{
		claim("clone-later", &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: sharedClaimName}, nil),
		claim("clone-later", nil, &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: sharedClaimName}),
	} {
		if _, err := cs.CoreV1().PersistentVolumeClaims(in.Namespace).Create(ctx, c, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "copy of the shared claim") {
			t.Errorf("a claim cloned from the shared claim (dataSource %v, dataSourceRef %v): %v; want it refused", c.Spec.DataSource, c.Spec.DataSourceRef, err)
		}
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(in.Namespace).Create(ctx, claim("plain", nil, nil), metav1.CreateOptions{}); err != nil {
		t.Errorf("a claim of no data source: %v", err)
	}
}

// An inline CSI volume names its storage by attributes the pod writes (an
// NFS CSI driver given the shared volume's server and share): even at Pod
// Security "restricted", which allows csi volumes, a pod with one of a
// driver policy.csiDrivers does not list is refused where agents run.
// (Inline nfs is Pod Security's: restricted refuses it, baseline does
// not; docs/security.md.)
func TestAnInlineCSIVolumeWhereAgentsRunIsRefused(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	pv, err := suite.cs.CoreV1().PersistentVolumes().Get(ctx, in.Namespace+"-data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := suite.cs.CoreV1().Namespaces().Patch(ctx, in.Namespace, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"restricted"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	cs := tenantClient(in, ctx, t, "inline", rule("", "pods", "create", "get"))
	csi := corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "nfs.csi.k8s.io",
		VolumeAttributes: map[string]string{"server": pv.Spec.NFS.Server, "share": pv.Spec.NFS.Path}}}}
	_, err = cs.CoreV1().Pods(in.Namespace).Create(ctx, restrictedPod(in.Namespace, "inline-csi", csi), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec.volumes[0].csi.driver") {
		t.Errorf("a bare pod with an inline csi volume onto the shared volume's storage: %v; want it refused on spec.volumes[0].csi.driver", err)
	}
	nfs := corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: pv.Spec.NFS.Server, Path: pv.Spec.NFS.Path}}}
	if _, err := cs.CoreV1().Pods(in.Namespace).Create(ctx, restrictedPod(in.Namespace, "inline-nfs", nfs), metav1.CreateOptions{}); err == nil {
		t.Error("a bare pod with an inline nfs volume at Pod Security restricted was admitted")
	}
}

// policy.sharedClaim.deployments names namespace/name: a Deployment of a
// listed name in another namespace agents run in is no listed one, and
// its pods are refused (by name alone, a tenant who may create Deployments
// took it).
func TestASharedClaimDeploymentIsNamedWithItsNamespace(t *testing.T) {
	in := newInstall(t, harness.InstallOptions{Config: "policy:\n  sharedClaim:\n    deployments: [backups/paperclip-backup]\n"})
	ctx := ctxT(t)
	cs := tenantClient(in, ctx, t, "deployer", rule("apps", "deployments", "create", "get"))
	labels := map[string]string{"app": "paperclip-backup"}
	tpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: restrictedPod(in.Namespace, "x", claimVolume(sharedClaimName)).Spec}
	tpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "paperclip-backup", Namespace: in.Namespace},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tpl}}
	if _, err := cs.AppsV1().Deployments(in.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var refused string
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ev, err := suite.cs.CoreV1().Events(in.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate"})
		if err != nil {
			return false, nil
		}
		for _, e := range ev.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, "paperclip-backup-") && strings.Contains(e.Message, "shared claim") {
				refused = e.Message
			}
		}
		return refused != "", nil
	})
	pods, err := suite.cs.CoreV1().Pods(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-backup"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) > 0 || refused == "" {
		t.Errorf("a Deployment named as one listed in another namespace: %d pods mount Paperclip's home (refusal seen: %q)", len(pods.Items), refused)
	}
}
