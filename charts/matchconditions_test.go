package charts

import (
	"context"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
)

// calls evaluates a webhook's matchConditions as the API server does (its
// CEL environment and matcher, from k8s.io/apiserver) on a CREATE of obj:
// whether the webhook is called.
func calls(t *testing.T, conds []admissionregistrationv1.MatchCondition, gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, obj runtime.Object) bool {
	t.Helper()
	return callsOn(t, conds, gvr, gvk, nil, obj)
}

// callsOn is calls for an UPDATE of old to obj (a CREATE when old is nil).
func callsOn(t *testing.T, conds []admissionregistrationv1.MatchCondition, gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, old, obj runtime.Object) bool {
	t.Helper()
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	var acc []plugincel.ExpressionAccessor
	for i := range conds {
		acc = append(acc, (*matchconditions.MatchCondition)(&conds[i]))
	}
	filter := compiler.CompileCondition(acc, plugincel.OptionalVariableDeclarations{}, environment.StoredExpressions)
	for _, e := range filter.CompilationErrors() {
		t.Fatalf("match condition does not compile: %v", e)
	}
	m := matchconditions.NewMatcher(filter, ptr.To(admissionregistrationv1.Fail), "webhook", "test", "test")
	meta, _ := obj.(metav1.Object)
	op, opts := admission.Create, runtime.Object(&metav1.CreateOptions{})
	if old != nil {
		op, opts = admission.Update, &metav1.UpdateOptions{}
	}
	rec := admission.NewAttributesRecord(obj, old, gvk, meta.GetNamespace(), meta.GetName(), gvr, "", op,
		opts, false, &user.DefaultInfo{Name: "someone"})
	va := &admission.VersionedAttributes{Attributes: rec, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(obj)}
	if old != nil {
		va.VersionedOldObject = admission.NewLazyObject(old)
	}
	res := m.Match(context.Background(), va, nil, nil)
	if res.Error != nil {
		t.Fatalf("match condition %s: %v", res.FailedConditionName, res.Error)
	}
	return res.Matches
}

// With compiled policies, the mutating webhook is not called for a Job a
// policy completed, except, outside Queue mode, one a policy queued: a
// Queue-mode policy the API server still applied after the mode changed
// suspended it, and the webhook runs it instead of leaving it suspended
// with nothing to start it (decide's TestAJobAStaleQueuePolicyCompletedRunsInRejectMode).
func TestTheMutatingWebhookUndoesAStaleQueuePolicy(t *testing.T) {
	gvr, gvk := batchv1.SchemeGroupVersion.WithResource("jobs"), batchv1.SchemeGroupVersion.WithKind("Job")
	job := func(annotations map[string]string) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "run", Namespace: "paperclip", Annotations: annotations,
			Labels: map[string]string{"paperclip.io/agent-id": "a"}}}
		if annotations != nil {
			j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "x"}}
		}
		return j
	}
	bare := job(nil)
	completed := job(map[string]string{"clipjob.paperclip.io/template-hash": "h"})
	queued := job(map[string]string{"clipjob.paperclip.io/template-hash": "h", "clipjob.paperclip.io/queued": "true"})
	for _, tc := range []struct {
		mode string
		job  *batchv1.Job
		want bool
	}{
		{"Reject", bare, true}, {"Reject", completed, false}, {"Reject", queued, true},
		{"Disabled", queued, true},
		{"Queue", bare, true}, {"Queue", completed, false}, {"Queue", queued, false},
	} {
		r := render(t, map[string]any{"compiledPolicies": map[string]any{"enabled": true},
			"config": map[string]any{"policy": map[string]any{"concurrency": map[string]any{"mode": tc.mode}}}})
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		into(t, r, "MutatingWebhookConfiguration", "clipjob-mutating", &mwc)
		if got := calls(t, mwc.Webhooks[0].MatchConditions, gvr, gvk, tc.job); got != tc.want {
			t.Errorf("%s mode, annotations %v: the mutating webhook called %v, want %v", tc.mode, tc.job.Annotations, got, tc.want)
		}
	}
}

// The pod webhook is called for agent pods anywhere, and, in the
// namespaces agents run in (not tenants'), for a pod created with a claim
// or an ephemeral volume: the shared claim is Paperclip's home
// (decide's TestOnlyAgentRunsAndTheServerMountPaperclipsHome). Other pods
// never wait on clipjob.
func TestThePodWebhookSeesPodsThatMayMountTheSharedClaim(t *testing.T) {
	gvr, gvk := corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod")
	pod := func(ns string, labels map[string]string, vs ...corev1.VolumeSource) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: labels}}
		for _, v := range vs {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "v", VolumeSource: v})
		}
		return p
	}
	claim := corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "paperclip-data"}}
	eph := corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}
	empty := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	agent := map[string]string{"paperclip.io/agent-id": "a"}
	values := map[string]any{"agentNamespaces": []any{"paperclip", "team-a"},
		"config": map[string]any{"source": map[string]any{"namespace": "paperclip"}, "tenantNamespaces": []any{"team-a"}}}
	disabled := map[string]any{"config": map[string]any{"policy": map[string]any{"sharedClaim": map[string]any{"mode": "Disabled"}}}}
	for _, tc := range []struct {
		name   string
		values map[string]any
		pod    *corev1.Pod
		want   bool
	}{
		{"a claim where agents run", values, pod("paperclip", nil, claim), true},
		{"an ephemeral volume where agents run", values, pod("paperclip", nil, empty, eph), true},
		{"an inline CSI volume where agents run", values, pod("paperclip", nil, corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "nfs.csi.k8s.io"}}), true},
		{"no claim", values, pod("paperclip", nil, empty), false},
		{"no volume", values, pod("paperclip", nil), false},
		{"a claim in another namespace", values, pod("databases", nil, claim), false},
		{"a claim in a tenant namespace", values, pod("team-a", nil, claim), false},
		{"an agent pod anywhere", values, pod("databases", agent), true},
		{"a claim, the rule disabled", disabled, pod("paperclip", nil, claim), false},
	} {
		r := render(t, tc.values)
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		into(t, r, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
		if got := calls(t, vwc.Webhooks[1].MatchConditions, gvr, gvk, tc.pod); got != tc.want {
			t.Errorf("%s: the pod webhook called %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An UPDATE that changes a pod's images reaches the pod webhook: an agent
// pod's anywhere, any pod's where agents run (decide's image-change
// refusals); an update that changes nothing clipjob checks does not, nor
// one of a pod in another namespace.
func TestThePodWebhookSeesImageChanges(t *testing.T) {
	gvr, gvk := corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod")
	pod := func(ns string, labels map[string]string, image, initImage string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}, Volumes: []corev1.Volume{{Name: "data",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "paperclip-data"}}}}}}
		if initImage != "" {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: initImage}}
		}
		return p
	}
	agent := map[string]string{"paperclip.io/agent-id": "a"}
	values := map[string]any{"agentNamespaces": []any{"paperclip"}, "config": map[string]any{"source": map[string]any{"namespace": "paperclip"}}}
	r := render(t, values)
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	into(t, r, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
	for _, tc := range []struct {
		name     string
		old, new *corev1.Pod
		want     bool
	}{
		{"an agent pod's image", pod("databases", agent, "a:1", ""), pod("databases", agent, "evil:1", ""), true},
		{"an agent pod's init image", pod("databases", agent, "a:1", "i:1"), pod("databases", agent, "a:1", "evil:1"), true},
		{"the server pod's image", pod("paperclip", nil, "a:1", ""), pod("paperclip", nil, "evil:1", ""), true},
		{"the server pod's init image", pod("paperclip", nil, "a:1", "i:1"), pod("paperclip", nil, "a:1", "evil:1"), true},
		{"an agent pod, images unchanged", pod("databases", agent, "a:1", "i:1"), pod("databases", agent, "a:1", "i:1"), false},
		{"the server pod, images unchanged", pod("paperclip", nil, "a:1", ""), pod("paperclip", nil, "a:1", ""), false},
		{"a pod's image in another namespace", pod("databases", nil, "a:1", ""), pod("databases", nil, "evil:1", ""), false},
	} {
		if got := callsOn(t, vwc.Webhooks[1].MatchConditions, gvr, gvk, tc.old, tc.new); got != tc.want {
			t.Errorf("%s: the pod webhook called %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A claim created from another claim where agents run (not tenants')
// reaches the claim webhook (decide's TestNoClaimStartsFromTheSharedClaim);
// every other claim never waits on clipjob.
func TestTheClaimWebhookSeesClonesWhereAgentsRun(t *testing.T) {
	gvr, gvk := corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim")
	pvc := func(ns string, ds *corev1.TypedLocalObjectReference, ref *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{DataSource: ds, DataSourceRef: ref}}
	}
	fromClaim := &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}
	refClaim := &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}
	fromSnapshot := &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "s"}
	values := map[string]any{"agentNamespaces": []any{"paperclip", "team-a"},
		"config": map[string]any{"source": map[string]any{"namespace": "paperclip"}, "tenantNamespaces": []any{"team-a"}}}
	r := render(t, values)
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	into(t, r, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
	if len(vwc.Webhooks) != 3 || vwc.Webhooks[2].Name != "validate.persistentvolumeclaims.clipjob.paperclip.io" {
		t.Fatalf("no claim webhook: %d webhooks", len(vwc.Webhooks))
	}
	for _, tc := range []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		want bool
	}{
		{"a clone where agents run", pvc("paperclip", fromClaim, nil), true},
		{"a clone by dataSourceRef where agents run", pvc("paperclip", nil, refClaim), true},
		{"an empty claim where agents run", pvc("paperclip", nil, nil), false},
		{"a claim from a snapshot", pvc("paperclip", fromSnapshot, nil), false},
		{"a clone in a tenant namespace", pvc("team-a", fromClaim, nil), false},
		{"a clone elsewhere", pvc("databases", fromClaim, nil), false},
	} {
		if got := calls(t, vwc.Webhooks[2].MatchConditions, gvr, gvk, tc.pvc); got != tc.want {
			t.Errorf("%s: the claim webhook called %v, want %v", tc.name, got, tc.want)
		}
	}
	disabled := render(t, map[string]any{"config": map[string]any{"policy": map[string]any{"sharedClaim": map[string]any{"mode": "Disabled"}}}})
	into(t, disabled, "ValidatingWebhookConfiguration", "clipjob-validating", &vwc)
	if len(vwc.Webhooks) != 2 {
		t.Errorf("the rule disabled, %d validating webhooks", len(vwc.Webhooks))
	}
}
