package policy

import (
	"strings"
	"testing"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
)

func TestEvaluatePod(t *testing.T) {
	job := jobs.MakeJob("run-1", "paperclip").Agent("a").Obj()
	owned := jobs.MakePod("run-1-x", "paperclip").OwnedBy(job).Obj()
	bare := jobs.MakePod("bare", "paperclip").Label(contract.LabelAgentID, "a").Obj()
	for _, tc := range []struct {
		name string
		in   PodInput
		want string
	}{
		{name: "the Job controller's pod", in: PodInput{Pod: owned, Creator: "system:serviceaccount:kube-system:job-controller"}},
		{name: "the controller manager's own identity", in: PodInput{Pod: owned, Creator: "system:kube-controller-manager"}},
		{name: "a bare pod", in: PodInput{Pod: bare, Creator: "system:serviceaccount:kube-system:job-controller"}, want: "metadata.ownerReferences: Forbidden: a pod labeled paperclip.io/ is an agent pod"},
		{name: "an owner reference written by hand", in: PodInput{Pod: owned, Creator: "paperclip-adapter"}, want: `not by "paperclip-adapter"`},
		{name: "kubectl debug", in: PodInput{Pod: owned, Creator: "kubernetes-admin", Subresource: "ephemeralcontainers"}, want: "spec.ephemeralContainers: Forbidden"},
		{name: "another subresource", in: PodInput{Pod: owned, Creator: "kubelet", Subresource: "status"}},
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
