package claim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

// A run holds its agent from admission until its Job ends. A run whose pod
// can never start (an image that cannot be pulled, a pod no node takes, a
// Secret that is missing) would hold it forever unless the profile set a
// deadline, and agent runs may rightly last hours. So the controller bounds
// the start alone, as Kueue's waitForPodsReady does: a run none of whose
// containers ever ran by its profile's startTimeoutSeconds after the Job
// started is ended through the Job's own activeDeadlineSeconds. The Job
// controller then fails it with reason DeadlineExceeded and removes its
// pods, the claim is freed the usual way, and the Job stays for
// inspection, marked with what its pods were waiting for.

// startTimeouts ends the agent's runs that did not start in time, and
// returns how long until the next one still waiting must be looked at (0:
// none is).
func (r *Controller) startTimeouts(ctx context.Context, cfg *config.Config, jobs []*batchv1.Job) (time.Duration, error) {
	now := r.now()
	var next time.Duration
	later := func(wait time.Duration) {
		if next == 0 || wait < next {
			next = wait
		}
	}
	for _, job := range jobs {
		if !mayBeUnstarted(job) || deadlinePassed(job, now) {
			continue
		}
		timeout := startTimeout(cfg, job)
		if wait := job.Status.StartTime.Add(timeout).Sub(now); wait > 0 {
			later(wait)
			continue
		}
		pods, err := r.Client.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: batchv1.ControllerUidLabel + "=" + string(job.UID)})
		if err != nil {
			return 0, fmt.Errorf("listing the pods of Job %s/%s: %w", job.Namespace, job.Name, err)
		}
		started, waitingFor := startState(pods.Items)
		if started {
			continue
		}
		// Timed from the newest pod: a pod made after a pause (parallelism
		// 0, then 1) gets its own start timeout.
		if newest := newestPod(pods.Items); newest != nil {
			if wait := newest.CreationTimestamp.Add(timeout).Sub(now); wait > 0 {
				later(wait)
				continue
			}
		}
		if err := r.endUnstarted(ctx, job, now, timeout, waitingFor); err != nil {
			return 0, err
		}
	}
	return next, nil
}

// deadlinePassed reports whether the Job's own deadline (or the one this
// controller set) has passed: the Job controller is failing it.
func deadlinePassed(job *batchv1.Job, now time.Time) bool {
	d := job.Spec.ActiveDeadlineSeconds
	return d != nil && !now.Before(job.Status.StartTime.Add(time.Duration(*d)*time.Second))
}

func newestPod(pods []corev1.Pod) *corev1.Pod {
	var newest *corev1.Pod
	for i := range pods {
		if newest == nil || pods[i].CreationTimestamp.After(newest.CreationTimestamp.Time) {
			newest = &pods[i]
		}
	}
	return newest
}

// mayBeUnstarted reports whether job is a run that started, is not paused
// (parallelism 0) and has no pod ready, which is all the cache tells:
// whether a container ever ran takes the pods. Nothing a client writes on
// the Job turns the check off: the annotation this controller writes is a
// record, not a switch.
func mayBeUnstarted(job *batchv1.Job) bool {
	return Running(job) && job.Status.StartTime != nil && ptr.Deref(job.Status.Ready, 0) == 0 &&
		ptr.Deref(job.Spec.Parallelism, 1) != 0
}

// startTimeout is the start bound of job's profile (by its adapter-type
// label, which is fixed once admitted), by the config in force; a profile
// since removed from the config falls back to the default profile.
func startTimeout(cfg *config.Config, job *batchv1.Job) time.Duration {
	seconds := int64(config.DefaultStartTimeoutSeconds)
	if prof, _ := cfg.JobProfile(contract.AdapterType(job.Labels)); prof.StartTimeoutSeconds != nil {
		seconds = *prof.StartTimeoutSeconds
	}
	return time.Duration(seconds) * time.Second
}

// startState reports whether any container of the pods ever ran, and if
// none did, what they wait for, as `kubectl describe` would say it.
func startState(pods []corev1.Pod) (started bool, waitingFor string) {
	var reasons []string
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return true, ""
		}
		for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
			if ran(cs.State) || ran(cs.LastTerminationState) {
				return true, ""
			}
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				reasons = append(reasons, describe(pod.Name+"/"+cs.Name, w.Reason, w.Message))
			}
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				reasons = append(reasons, describe(pod.Name, c.Reason, c.Message))
			}
		}
	}
	switch {
	case len(pods) == 0:
		return false, "no pod was created (see the Job's events)"
	case len(reasons) == 0:
		return false, "pod " + pods[0].Name + " is " + string(pods[0].Status.Phase)
	}
	return false, strings.Join(reasons, "; ")
}

func ran(s corev1.ContainerState) bool {
	return s.Running != nil || (s.Terminated != nil && !s.Terminated.StartedAt.IsZero())
}

// describe shortens a status message so the annotation stays readable.
func describe(what, reason, msg string) string {
	const max = 300
	if len(msg) > max {
		msg = msg[:max] + "..."
	}
	if msg == "" {
		return what + ": " + reason
	}
	return what + ": " + reason + ": " + msg
}

// endUnstarted sets the Job's activeDeadlineSeconds to the time it has had,
// so the Job controller fails it now (a deadline of the Job's own that was
// shorter has passed already, and the Job is not here), and says why in
// AnnotationStartTimeout.
func (r *Controller) endUnstarted(ctx context.Context, job *batchv1.Job, now time.Time, timeout time.Duration, waitingFor string) error {
	had := int64(now.Sub(job.Status.StartTime.Time) / time.Second)
	if had < 1 {
		had = 1
	}
	why := fmt.Sprintf("no container ran within %s of the start: %s", timeout, waitingFor)
	// The UID makes the patch fail on another Job recreated under the name.
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": job.UID, "annotations": map[string]string{contract.AnnotationStartTimeout: why}},
		"spec":     map[string]any{"activeDeadlineSeconds": had},
	})
	if _, err := r.Client.BatchV1().Jobs(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("ending run %s/%s that did not start: %w", job.Namespace, job.Name, err)
	}
	startTimeoutsTotal.Inc()
	r.Log.Info("run ended: it did not start in time", "job", job.Namespace+"/"+job.Name,
		"agent", job.Labels[contract.LabelAgentID], "timeout", timeout, "waitingFor", waitingFor)
	return nil
}
