package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

// The pod webhook, wired as Run wires it (live lookups of a pod's
// ReplicaSet and Deployment): the source Deployment's pod mounts the
// shared claim, a bare pod of the namespace may not, and a pod with no
// claim is not judged.
func TestPodWebhookKeepsTheSharedClaimToTheServer(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Source.DeepCopy()
	d.UID = "uid-deploy"
	tpl := d.Spec.Template.DeepCopy()
	tpl.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = "abc"
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: d.Name + "-abc", Namespace: d.Namespace, UID: "uid-rs",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{Template: *tpl}}
	cs := fake.NewClientset(d, rs)
	v := &PodValidator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}, PVCs: livePVCs(cs),
		ReplicaSets: func(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
			return cs.AppsV1().ReplicaSets(ns).Get(ctx, name, metav1.GetOptions{})
		},
		Deployments: func(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
			return cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		}}
	server := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: rs.Name + "-x", Labels: tpl.Labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}},
		Spec: tpl.Spec}
	copycat := server.DeepCopy()
	copycat.OwnerReferences = nil
	noClaim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	req := func(pod *corev1.Pod, user string) admission.Request {
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create,
			Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Namespace: "paperclip",
			Object: runtime.RawExtension{Raw: mustJSON(pod)}, UserInfo: authenticationv1.UserInfo{Username: user}}}
	}
	const rsController = "system:serviceaccount:kube-system:replicaset-controller"
	if resp := v.Handle(context.Background(), req(server, rsController)); !resp.Allowed {
		t.Errorf("the source Deployment's pod refused: %s", resp.Result.Message)
	}
	resp := v.Handle(context.Background(), req(copycat, "alice"))
	if resp.Allowed || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, `spec.volumes[0].persistentVolumeClaim.claimName: Forbidden: volume "data" mounts the shared claim "paperclip-data"`) {
		t.Errorf("a copy of the server's pod made by hand: allowed %v, %d %q", resp.Allowed, resp.Result.Code, resp.Result.Message)
	}
	if resp := v.Handle(context.Background(), req(noClaim, "alice")); !resp.Allowed {
		t.Errorf("a pod with no claim refused: %s", resp.Result.Message)
	}
	// The same validator at ClaimPath: a claim made as a copy of the
	// shared one (after a pod naming it) is refused.
	clone := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "later"},
		Spec: corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}}}
	resp = v.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create,
		Kind: metav1.GroupVersionKind{Version: "v1", Kind: "PersistentVolumeClaim"}, Namespace: "paperclip",
		Object: runtime.RawExtension{Raw: mustJSON(clone)}, UserInfo: authenticationv1.UserInfo{Username: "alice"}}})
	if resp.Allowed || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, `spec.dataSource: Forbidden: claim "later" would be a copy of the shared claim "paperclip-data"`) {
		t.Errorf("a clone of the shared claim: allowed %v, %d %q", resp.Allowed, resp.Result.Code, resp.Result.Message)
	}
}
