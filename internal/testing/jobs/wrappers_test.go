package jobs

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/paperclipai/clipjob/contract"
)

func TestMakeJob(t *testing.T) {
	j := MakeJob("run-1", "paperclip").Agent("a").Adapter("claude_local").Queued().Obj()
	if !contract.IsAgentJob(j.Labels) || j.Labels[contract.LabelRunID] != "run-1" {
		t.Errorf("labels = %v, want agent a and run run-1", j.Labels)
	}
	if j.Spec.Suspend == nil || !*j.Spec.Suspend || j.Annotations[contract.AnnotationQueued] != "true" {
		t.Errorf("Queued did not suspend and mark the Job: suspend=%v annotations=%v", j.Spec.Suspend, j.Annotations)
	}
	if j.UID != "uid-run-1" {
		t.Errorf("UID = %q", j.UID)
	}
	if got := MakeJob("x", "ns").Run("r").Agent("a").Obj().Labels[contract.LabelRunID]; got != "r" {
		t.Errorf("Agent overwrote an explicit run id: %q", got)
	}
}

func TestMakePodOwnedBy(t *testing.T) {
	j := MakeJob("run-1", "paperclip").Agent("a").Condition(batchv1.JobComplete).Obj()
	p := MakePod("run-1-x", "paperclip").OwnedBy(j).Obj()
	ref := p.OwnerReferences[0]
	if ref.UID != j.UID || ref.Controller == nil || !*ref.Controller {
		t.Errorf("owner reference = %+v, want controller %s", ref, j.UID)
	}
	if p.Labels[contract.LabelAgentID] != "a" {
		t.Errorf("contract labels not copied: %v", p.Labels)
	}
}
