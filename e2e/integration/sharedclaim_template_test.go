package integration

// The shared claim rule (policy.sharedClaim), attacked through what a pod
// of an allowed Deployment may differ from its template in.
// The webhook judges the pod itself against the Deployment's template
// (the ReplicaSet read live proves nothing of the copy the ReplicaSet
// controller made it from), leaving out "what admission adds"; each test
// here has the ReplicaSet controller make a pod from a ReplicaSet written
// under the source Deployment with one such difference, the ReplicaSet
// patched back to the Deployment's template at once
// (TestASidecarFromAReplicaSetPatchedBackIsRefused).

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// flipReplicaSets writes up to tries ReplicaSets under the source
// Deployment, each with the Deployment's template as bend leaves it, and
// patches each back to the Deployment's template at once. It returns the
// first pod the ReplicaSet controller got admitted from a bent template
// (found tells one), or nil when none was in tries.
func flipReplicaSets(ctx context.Context, t *testing.T, in *harness.Install, cs kubernetes.Interface, tries int,
	bend func(*corev1.PodTemplateSpec), found func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	d, err := cs.AppsV1().Deployments(in.Namespace).Get(ctx, "paperclip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}
	good := *d.Spec.Template.DeepCopy()
	bad := *good.DeepCopy()
	bend(&bad)
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template", "value": good}})
	if err != nil {
		t.Fatal(err)
	}
	var admitted *corev1.Pod
	for i := 0; i < tries && admitted == nil; i++ {
		name := fmt.Sprintf("bent-%d", i)
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: in.Namespace, Labels: d.Spec.Template.Labels, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](2), Selector: d.Spec.Selector, Template: bad}}
		if _, err := cs.AppsV1().ReplicaSets(in.Namespace).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.AppsV1().ReplicaSets(in.Namespace).Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, p := range replicaSetPods(ctx, cs, in.Namespace, name, 5*time.Second) {
			if found(&p) {
				admitted = p.DeepCopy()
				t.Logf("try %d: pod %s of ReplicaSet %s admitted from the bent template", i, p.Name, name)
				break
			}
		}
		_ = cs.AppsV1().ReplicaSets(in.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	}
	return admitted
}

// A projected volume named kube-api-access-*, like the ServiceAccount
// admission plugin's token volume, is left out of the comparison only
// when it is that volume (what it projects, where it is mounted). A
// ReplicaSet's template can name a volume so,
// of any projected sources (a ConfigMap the tenant writes, any Secret of
// the namespace), and mount it anywhere in the server's container: over
// a file of Paperclip's home (here adapter-plugins.json, which the server
// imports at start, so the tenant's code runs as the server beside the
// whole home), over /etc/ssl, over the server's own code: refused.
func TestAVolumeNamedLikeTheTokensIsNoLicenceToMountAnything(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	serverPod(in, ctx, t)
	cs := tenantClient(in, ctx, t, "rs-token-lookalike", rule("apps", "deployments", "get"), rule("apps", "replicasets", "create", "get", "update", "patch", "delete"),
		rule("", "pods", "get", "list"), rule("", "configmaps", "create"))
	if _, err := cs.CoreV1().ConfigMaps(in.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plugins"},
		Data: map[string]string{"adapter-plugins.json": `[{"package":"evil-plugin","path":"/paperclip/instances/default/projects/x/evil.js"}]`}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const vol = "kube-api-access-plugins"
	target := "/paperclip/instances/default/adapter-plugins.json"
	admitted := flipReplicaSets(ctx, t, in, cs, 10, func(tpl *corev1.PodTemplateSpec) {
		tpl.Spec.Volumes = append(tpl.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "plugins"}}}}}}})
		c := &tpl.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: target, SubPath: "adapter-plugins.json", ReadOnly: true})
	}, func(p *corev1.Pod) bool {
		for _, m := range p.Spec.Containers[0].VolumeMounts {
			if m.Name == vol {
				return true
			}
		}
		return false
	})
	if admitted != nil {
		t.Errorf("pod %s of the source Deployment was admitted with the tenant's ConfigMap mounted over %s in its container %q (a volume named %s): "+
			"not the Deployment's template", admitted.Name, target, admitted.Spec.Containers[0].Name, vol)
	}
}

// A pod's host aliases and DNS settings are compared with its template's
// too: a ReplicaSet's template can point the server's host names (here
// `db`, which the example server's DATABASE_URL reaches in clear,
// password and all) at the tenant's address, and the pod would run the
// server's image with its env and Paperclip's home while the tenant
// answers as its database. Refused.
func TestTheServersPodKeepsItsTemplatesHostNames(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	serverPod(in, ctx, t)
	cs := tenantClient(in, ctx, t, "rs-host-aliases", rule("apps", "deployments", "get"), rule("apps", "replicasets", "create", "get", "update", "patch", "delete"),
		rule("", "pods", "get", "list"))
	admitted := flipReplicaSets(ctx, t, in, cs, 10, func(tpl *corev1.PodTemplateSpec) {
		tpl.Spec.HostAliases = append(tpl.Spec.HostAliases, corev1.HostAlias{IP: "203.0.113.66", Hostnames: []string{"db", "api.anthropic.com"}})
		tpl.Spec.DNSPolicy = corev1.DNSNone
		tpl.Spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"203.0.113.66"}}
	}, func(p *corev1.Pod) bool { return len(p.Spec.HostAliases) > 0 || p.Spec.DNSConfig != nil })
	if admitted != nil {
		t.Errorf("pod %s of the source Deployment was admitted with host aliases %v and DNS %v its template does not have: "+
			"the server's database and API hosts answered by the tenant", admitted.Name, admitted.Spec.HostAliases, admitted.Spec.DNSConfig)
	}
}
