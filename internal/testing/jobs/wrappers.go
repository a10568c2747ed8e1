package jobs

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
)

// JobWrapper builds a batch/v1 Job.
type JobWrapper struct{ batchv1.Job }

// MakeJob starts a Job named name in namespace ns with the UID "uid-<name>"
// and empty label and annotation maps. It is not an agent run until Agent
// is called.
func MakeJob(name, ns string) *JobWrapper {
	return &JobWrapper{batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name),
			Labels: map[string]string{}, Annotations: map[string]string{}},
	}}
}

// Obj returns the Job built so far.
func (w *JobWrapper) Obj() *batchv1.Job { return &w.Job }

// Agent marks the Job as a run of agent, with the run id defaulting to the
// Job's name.
func (w *JobWrapper) Agent(agent string) *JobWrapper {
	w.Labels[contract.LabelAgentID] = agent
	if w.Labels[contract.LabelRunID] == "" {
		w.Labels[contract.LabelRunID] = w.Name
	}
	return w
}

// Run sets the run id.
func (w *JobWrapper) Run(run string) *JobWrapper {
	w.Labels[contract.LabelRunID] = run
	return w
}

// Company sets the company id.
func (w *JobWrapper) Company(company string) *JobWrapper {
	w.Labels[contract.LabelCompanyID] = company
	return w
}

// Adapter names the adapter type (the profile).
func (w *JobWrapper) Adapter(adapter string) *JobWrapper {
	w.Labels[contract.LabelAdapterType] = adapter
	return w
}

// Label sets any label on the Job.
func (w *JobWrapper) Label(k, v string) *JobWrapper {
	w.Labels[k] = v
	return w
}

// Annotation sets any annotation on the Job.
func (w *JobWrapper) Annotation(k, v string) *JobWrapper {
	w.Annotations[k] = v
	return w
}

// UID replaces the UID derived from the name.
func (w *JobWrapper) UID(uid string) *JobWrapper {
	w.Job.UID = types.UID(uid)
	return w
}

// Created sets the creation timestamp.
func (w *JobWrapper) Created(t time.Time) *JobWrapper {
	w.CreationTimestamp = metav1.NewTime(t)
	return w
}

// Suspend sets spec.suspend.
func (w *JobWrapper) Suspend(s bool) *JobWrapper {
	w.Spec.Suspend = ptr.To(s)
	return w
}

// Queued marks the Job as admitted suspended in Queue mode, waiting for
// its agent's claim.
func (w *JobWrapper) Queued() *JobWrapper {
	w.Annotations[contract.AnnotationQueued] = "true"
	return w.Suspend(true)
}

// Container adds a container to the pod template.
func (w *JobWrapper) Container(name, image string) *JobWrapper {
	w.Spec.Template.Spec.Containers = append(w.Spec.Template.Spec.Containers, corev1.Container{Name: name, Image: image})
	return w
}

// PodLabel sets a label on the pod template.
func (w *JobWrapper) PodLabel(k, v string) *JobWrapper {
	if w.Spec.Template.Labels == nil {
		w.Spec.Template.Labels = map[string]string{}
	}
	w.Spec.Template.Labels[k] = v
	return w
}

// Prompt sets the inline prompt annotation on the pod template.
func (w *JobWrapper) Prompt(prompt string) *JobWrapper {
	if w.Spec.Template.Annotations == nil {
		w.Spec.Template.Annotations = map[string]string{}
	}
	w.Spec.Template.Annotations[contract.AnnotationPrompt] = prompt
	return w
}

// Condition adds a true status condition, e.g. batchv1.JobComplete.
func (w *JobWrapper) Condition(t batchv1.JobConditionType) *JobWrapper {
	w.Status.Conditions = append(w.Status.Conditions, batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue})
	return w
}

// Active sets how many pods are running.
func (w *JobWrapper) Active(n int32) *JobWrapper {
	w.Status.Active = n
	return w
}

// Deleting sets a deletion timestamp, as for a Job being deleted.
func (w *JobWrapper) Deleting(t time.Time) *JobWrapper {
	w.DeletionTimestamp = ptr.To(metav1.NewTime(t))
	return w
}

// PodWrapper builds a Pod of an agent run.
type PodWrapper struct{ corev1.Pod }

// MakePod starts a Pod named name in namespace ns with the UID "uid-<name>".
func MakePod(name, ns string) *PodWrapper {
	return &PodWrapper{corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name),
			Labels: map[string]string{}},
	}}
}

// Obj returns the Pod built so far.
func (w *PodWrapper) Obj() *corev1.Pod { return &w.Pod }

// OwnedBy makes the Pod controlled by job and copies its contract labels,
// as the Job controller does.
func (w *PodWrapper) OwnedBy(job *batchv1.Job) *PodWrapper {
	w.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name,
		UID: job.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	for k, v := range job.Labels {
		w.Labels[k] = v
	}
	w.Labels["batch.kubernetes.io/job-name"] = job.Name
	w.Labels["batch.kubernetes.io/controller-uid"] = string(job.UID)
	return w
}

// Label sets a label on the Pod.
func (w *PodWrapper) Label(k, v string) *PodWrapper {
	w.Labels[k] = v
	return w
}

// Container adds a container.
func (w *PodWrapper) Container(name, image string) *PodWrapper {
	w.Spec.Containers = append(w.Spec.Containers, corev1.Container{Name: name, Image: image})
	return w
}

// Phase sets the Pod's phase.
func (w *PodWrapper) Phase(p corev1.PodPhase) *PodWrapper {
	w.Status.Phase = p
	return w
}

// Started marks the Job started at t, as the Job controller does when it
// creates the first pod of an unsuspended Job.
func (w *JobWrapper) Started(t time.Time) *JobWrapper {
	w.Spec.Suspend = ptr.To(false)
	w.Status.StartTime = ptr.To(metav1.NewTime(t))
	return w
}

// Ready sets how many pods are ready.
func (w *JobWrapper) Ready(n int32) *JobWrapper {
	w.Status.Ready = ptr.To(n)
	return w
}

// Unschedulable marks the Pod pending with the scheduler's refusal.
func (w *PodWrapper) Unschedulable(msg string) *PodWrapper {
	w.Status.Phase = corev1.PodPending
	w.Status.Conditions = append(w.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled,
		Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg})
	return w
}

// Waiting marks the Pod pending with container name waiting for reason
// (ImagePullBackOff, CreateContainerConfigError, ...).
func (w *PodWrapper) Waiting(name, reason, msg string) *PodWrapper {
	w.Status.Phase = corev1.PodPending
	w.Status.ContainerStatuses = append(w.Status.ContainerStatuses, corev1.ContainerStatus{Name: name,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}})
	return w
}

// RunningContainer marks the Pod running with container name running
// since t.
func (w *PodWrapper) RunningContainer(name string, t time.Time) *PodWrapper {
	w.Status.Phase = corev1.PodRunning
	w.Status.ContainerStatuses = append(w.Status.ContainerStatuses, corev1.ContainerStatus{Name: name,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t)}}})
	return w
}
