package policy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
)

func TestEvaluatePod(t *testing.T) {
	job := jobs.MakeJob("run-1", "paperclip").Agent("a").Obj()
	owned := jobs.MakePod("run-1-x", "paperclip").OwnedBy(job).Obj()
	bare := jobs.MakePod("bare", "paperclip").Label(contract.LabelAgentID, "a").Obj()
	// The pod agent-sandbox's controller makes for a Sandbox of Paperclip's
	// Kubernetes plugin (its default backend): the plugin's labels, owned
	// by the Sandbox, not by a Job (docs/paperclip.md).
	sandboxPod := jobs.MakePod("pc-01jd8xacc0sandbox00000000", "paperclip-co-1").Label(contract.LabelRunID, "run-1").
		Label(contract.LabelAgentID, "run-1").Label("paperclip.io/role", "agent").Obj()
	isController := true
	sandboxPod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox",
		Name: sandboxPod.Name, UID: "7d3c1a52-0000-4000-8000-000000000001", Controller: &isController}}
	for _, tc := range []struct {
		name string
		in   PodInput
		want string
	}{
		{name: "the Job controller's pod", in: PodInput{Pod: owned, Creator: "system:serviceaccount:kube-system:job-controller"}},
		{name: "the controller manager's own identity", in: PodInput{Pod: owned, Creator: "system:kube-controller-manager"}},
		{name: "a bare pod", in: PodInput{Pod: bare, Creator: "system:serviceaccount:kube-system:job-controller"}, want: "metadata.ownerReferences: Forbidden: a pod labeled paperclip.io/ is an agent pod"},
		{name: "the pod of the plugin's Sandbox", in: PodInput{Pod: sandboxPod, Creator: "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller"},
			want: "metadata.ownerReferences: Forbidden: a pod labeled paperclip.io/ is an agent pod"},
		{name: "an owner reference written by hand", in: PodInput{Pod: owned, Creator: "paperclip-adapter"}, want: `not by "paperclip-adapter"`},
		{name: "kubectl debug", in: PodInput{Pod: owned, Creator: "kubernetes-admin", Subresource: "ephemeralcontainers"}, want: "spec.ephemeralContainers: Forbidden"},
		{name: "another subresource", in: PodInput{Pod: owned, Creator: "kubelet", Subresource: "status"}},
		// After admission, what the pod belongs to is fixed.
		{name: "an update that leaves its identity", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) {
			p.Labels["team"] = "x"
			p.Finalizers = nil
		}), Creator: "anyone"}},
		{name: "another run id", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) { p.Labels[contract.LabelRunID] = "victim" }), Creator: "anyone"},
			want: "metadata.labels[paperclip.io/run-id]: Forbidden: is fixed on an agent pod"},
		{name: "the Job controller's label removed", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) { delete(p.Labels, "batch.kubernetes.io/controller-uid") }), Creator: "anyone"},
			want: "metadata.labels[batch.kubernetes.io/controller-uid]: Forbidden"},
		{name: "agent labels added to a plain pod", in: PodInput{Old: jobs.MakePod("plain", "paperclip").Obj(), Pod: with(owned, func(*corev1.Pod) {}), Creator: "anyone"},
			want: "metadata.labels[paperclip.io/agent-id]: Forbidden"},
		{name: "an owner reference added", in: PodInput{Old: with(owned, func(p *corev1.Pod) { p.OwnerReferences = nil }), Pod: owned, Creator: "anyone"},
			want: "metadata.ownerReferences[0]: Forbidden: an agent pod's owner references may only be removed"},
		{name: "the owner reference changed", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) { p.OwnerReferences[0].UID = "another" }), Creator: "anyone"},
			want: "metadata.ownerReferences[0]: Forbidden"},
		{name: "relabelled through the status subresource", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) { p.Labels[contract.LabelCompanyID] = "evilcorp" }), Creator: "anyone", Subresource: "status"},
			want: "metadata.labels[paperclip.io/company-id]: Forbidden"},
		{name: "a status update by the kubelet", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }), Creator: "system:node:n1", Subresource: "status"}},
		{name: "orphaned by the garbage collector", in: PodInput{Old: owned, Pod: with(owned, func(p *corev1.Pod) { p.OwnerReferences = nil }), Creator: "system:serviceaccount:kube-system:generic-garbage-collector"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := EvaluatePod(tc.in)
			if tc.want == "" {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs)
				}
				return
			}
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("got %v, want %q", errs, tc.want)
			}
		})
	}
}

func with(p *corev1.Pod, change func(*corev1.Pod)) *corev1.Pod {
	c := p.DeepCopy()
	change(c)
	return c
}
