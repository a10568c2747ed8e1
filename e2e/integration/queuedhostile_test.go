package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// A hostile review of Queue mode with compiled policies (design (b)): the
// attacker may create, update and patch Jobs in the agent namespace, but
// is not clipjob's ServiceAccount. Each test either shows a refusal
// clipjob holds, or (failing) the break it found.

const serverAccount = "system:serviceaccount:paperclip:paperclip"

// hostile is a client with create, get, list, patch and update on Jobs
// in the suite's namespace, and its user name.
func hostile(in *harness.Install, ctx context.Context, t *testing.T, name string) (kubernetes.Interface, string) {
	t.Helper()
	return in.ClientAs(ctx, t, name, "create", "get", "list", "patch", "update"), "system:serviceaccount:" + in.Namespace + ":" + name
}

// evil makes a completed Job's agent container one clipjob refuses: an
// image outside the allowlist, privileged.
func evil(j *batchv1.Job) {
	c := &j.Spec.Template.Spec.Containers[0]
	c.Image = "evil.example.com/miner:1"
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	c.SecurityContext.Privileged = ptr.To(true)
	c.SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
}

func patchJob(in *harness.Install, ctx context.Context, cs kubernetes.Interface, name, patch string) (*batchv1.Job, error) {
	return cs.BatchV1().Jobs(in.Namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
}

// podsOf lists the pods the Job controller made for Job name.
func podsOf(in *harness.Install, ctx context.Context, t *testing.T, name string) []corev1.Pod {
	t.Helper()
	pods, err := suite.cs.CoreV1().Pods(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// podsAfterStart returns the pods of Job name once a client tried to
// start it (startErr: the API server's answer). Refused, and stored still
// suspended, the Job controller makes no pod for it: the pods it has now
// are all it will have, and nothing is gained by watching for more.
// Admitted (or no longer suspended), its pods are waited for, as a
// condition: the controller makes them within seconds on a quiet machine.
func podsAfterStart(in *harness.Install, ctx context.Context, t *testing.T, name string, startErr error) []corev1.Pod {
	t.Helper()
	if startErr != nil && harness.Suspended(getJob(in, ctx, t, name)) {
		return podsOf(in, ctx, t, name)
	}
	var pods []corev1.Pod
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		pods = podsOf(in, ctx, t, name)
		return len(pods) > 0, nil
	})
	return pods
}

func getJob(in *harness.Install, ctx context.Context, t *testing.T, name string) *batchv1.Job {
	t.Helper()
	j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// runningAgentPods lists the pods carrying agent's label that have not
// finished: what the relay, the egress policies and Paperclip count as
// the agent's runs.
func runningAgentPods(in *harness.Install, ctx context.Context, t *testing.T, agent string) []string {
	t.Helper()
	pods, err := suite.cs.CoreV1().Pods(in.Namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelAgentID + "=" + agent})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil {
			out = append(out, p.Name+" ("+p.Spec.Containers[0].Image+")")
		}
	}
	return out
}

// TestHostileQueuedForgedRunStartsOnceUnmarked: a Job dressed as
// completed and queued (any container, here a privileged one with an
// image outside the allowlist) skips the validating webhook at its CREATE.
// The agent-runs admission policy forbids its creator to unsuspend it
// while it is marked clipjob.paperclip.io/queued=true; annotation changes
// (other than created-by) reach no webhook. The attack: drop or rewrite
// the mark (null, "false", "TRUE"; also with the pods labeled as a running
// victim agent's), then unsuspend. Found working on the first build of
// design (b): the unsuspend was judged as an ordinary UPDATE and the
// forged privileged pod ran (beside the victim's, with its labels). It
// must be refused: the mark changed only by clipjob, and every unsuspend
// judged as the Job's CREATE.
func TestHostileQueuedForgedRunStartsOnceUnmarked(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	_, completed := in.CompiledQueueMode(ctx, t)
	cs, me := hostile(in, ctx, t, "e2e-hostile-unmark")

	// Held: the unsuspend and the unmarking in one request are judged on
	// the stored (marked) Job.
	both := harness.DressedAsComplete(completed, "e2e-hostile-unmark-both")
	both.Annotations[contract.AnnotationCreatedBy] = me
	evil(both)
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, both, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Job dressed as queued, stored suspended, is what design (b) stores without a webhook call: %v", err)
	}
	_, err := patchJob(in, ctx, cs, both.Name, `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":null}},"spec":{"suspend":false}}`)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "a queued run is started by clipjob") {
		t.Errorf("unmarking and starting a queued run in one patch: want 403 from the agent-runs policy, got %v", err)
	}

	// A victim agent's run, going.
	victim := in.BareJob(t, "e2e-hostile-unmark-victim")
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitStarted(ctx, t, victim.Name)
	in.WaitPod(ctx, t, victim.Name, harness.Running)
	victimAgent := victim.Labels[contract.LabelAgentID]

	for _, unmark := range []struct{ name, patch string }{
		{"e2e-hostile-unmark-null", `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":null}}}`},
		{"e2e-hostile-unmark-false", `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":"false"}}}`},
		{"e2e-hostile-unmark-upper", `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":"TRUE"}}}`},
		// Its pods labeled as the victim agent's (the Job's own agent label
		// is its own): the claim taken is its own agent's.
		{"e2e-hostile-unmark-podlabels", `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":null}}}`},
	} {
		forged := harness.DressedAsComplete(completed, unmark.name)
		forged.Annotations[contract.AnnotationCreatedBy] = me
		evil(forged)
		if unmark.name == "e2e-hostile-unmark-podlabels" {
			forged.Spec.Template.Labels[contract.LabelAgentID] = victimAgent
			forged.Spec.Template.Labels[contract.LabelRunID] = victim.Labels[contract.LabelRunID]
		}
		if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
			t.Logf("%s: the forged queued Job was refused at create (held): %v", unmark.name, err)
			continue
		}
		_, unmarkErr := patchJob(in, ctx, cs, forged.Name, unmark.patch)
		_, startErr := patchJob(in, ctx, cs, forged.Name, `{"spec":{"suspend":false}}`)
		pods := podsAfterStart(in, ctx, t, forged.Name, startErr)
		j := getJob(in, ctx, t, forged.Name)
		if len(pods) > 0 || !harness.Suspended(j) {
			images := []string{}
			for _, p := range pods {
				images = append(images, p.Spec.Containers[0].Image)
			}
			t.Errorf("BREAK %s: a Job clipjob never judged started: created dressed as queued by %s (its CREATE skipped the validating webhook), "+
				"annotation patch %s (err %v), then spec.suspend=false by the same client (err %v): suspended=%v, pods %d with images %v, privileged %v",
				unmark.name, me, unmark.patch, unmarkErr, startErr, harness.Suspended(j), len(pods), images,
				ptr.Deref(j.Spec.Template.Spec.Containers[0].SecurityContext.Privileged, false))
			if running := runningAgentPods(in, ctx, t, victimAgent); len(running) > 1 {
				t.Errorf("BREAK %s: two pods of agent %s running at once: %v", unmark.name, victimAgent, running)
			}
			continue
		}
		if startErr == nil {
			t.Errorf("%s: the start of an unmarked forged run was admitted, yet it did not run", unmark.name)
		} else {
			t.Logf("%s: held: %v / %v", unmark.name, unmarkErr, startErr)
		}
	}
}

// TestHostileQueuedOwnContainerStartsOnceUnmarked: the same without
// dressing anything up. A Job with a container of its own (no template
// hash) goes to the mutating webhook, which completes and queues it; the
// validating webhook then skips it as a queued run. Its creator may not
// unmark it and start it: it never gets a pod.
func TestHostileQueuedOwnContainerStartsOnceUnmarked(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	in.CompiledQueueMode(ctx, t)
	cs, me := hostile(in, ctx, t, "e2e-hostile-own")
	own := in.BareJob(t, "e2e-hostile-own")
	own.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	own.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "evil.example.com/miner:1", Command: []string{"mine"}}}
	stored, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, own, metav1.CreateOptions{})
	if err != nil {
		requireAdmissionRefusal(t, err)
		t.Logf("held: a Job with its own container outside the allowlist is refused at create: %v", err)
		return
	}
	_, unmarkErr := patchJob(in, ctx, cs, own.Name, `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":null}}}`)
	_, startErr := patchJob(in, ctx, cs, own.Name, `{"spec":{"suspend":false}}`)
	pods := podsAfterStart(in, ctx, t, own.Name, startErr)
	if len(pods) > 0 {
		t.Errorf("BREAK: %s created Job %s with a container of its own (image %s; stored suspended %v, queued %q: the validating webhook never judged it), "+
			"dropped the queue mark (err %v) and started it (err %v): its pod runs image %s",
			me, own.Name, stored.Spec.Template.Spec.Containers[0].Image, harness.Suspended(stored), stored.Annotations[contract.AnnotationQueued],
			unmarkErr, startErr, pods[0].Spec.Containers[0].Image)
	} else if startErr == nil {
		t.Errorf("its start was admitted, yet it has no pod")
	}
}

// TestHostileQueuedLookalikesAreJudgedAtCreate: only a Job exactly
// suspended and marked queued="true" skips the webhook at CREATE; every
// look-alike (not suspended, no mark, "TRUE", " true") is judged then, and
// one clipjob refuses is not stored. A Job recording another creator is
// refused by the agent-runs policy.
func TestHostileQueuedLookalikesAreJudgedAtCreate(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, completed := in.CompiledQueueMode(ctx, t)
	cs, me := hostile(in, ctx, t, "e2e-hostile-lookalike")
	for _, c := range []struct {
		name string
		set  func(*batchv1.Job)
		want string
	}{
		{"e2e-hostile-running", func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(false) }, "evil.example.com/miner:1"},
		{"e2e-hostile-suspend-nil", func(j *batchv1.Job) { j.Spec.Suspend = nil }, "evil.example.com/miner:1"},
		{"e2e-hostile-unmarked", func(j *batchv1.Job) { delete(j.Annotations, contract.AnnotationQueued) }, "evil.example.com/miner:1"},
		{"e2e-hostile-upper", func(j *batchv1.Job) { j.Annotations[contract.AnnotationQueued] = "TRUE" }, "evil.example.com/miner:1"},
		{"e2e-hostile-space", func(j *batchv1.Job) { j.Annotations[contract.AnnotationQueued] = " true" }, "evil.example.com/miner:1"},
		{"e2e-hostile-server", func(j *batchv1.Job) { j.Annotations[contract.AnnotationCreatedBy] = serverAccount }, "clipjob.paperclip.io/created-by"},
		{"e2e-hostile-nocreator", func(j *batchv1.Job) { delete(j.Annotations, contract.AnnotationCreatedBy) }, "clipjob.paperclip.io/created-by"},
	} {
		j := harness.DressedAsComplete(completed, c.name)
		j.Annotations[contract.AnnotationCreatedBy] = me
		evil(j)
		c.set(j)
		_, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, j, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want 403 naming %q, got %v", c.name, c.want, err)
		}
		in.AssertNoJob(ctx, t, c.name)
	}

	// Without the template hash the mutating webhook completes it (a Job
	// with containers of its own), which marks it queued and hashes it: so
	// the validating webhook skips it as a queued run, and it is stored.
	// The start check is then where clipjob refuses it: marked, no pod.
	nohash := harness.DressedAsComplete(completed, "e2e-hostile-nohash")
	nohash.Annotations[contract.AnnotationCreatedBy] = me
	delete(nohash.Annotations, contract.AnnotationTemplateHash)
	evil(nohash)
	stored, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, nohash, metav1.CreateOptions{})
	if err != nil {
		requireAdmissionRefusal(t, err)
		t.Logf("a queued Job without the template hash was refused at create: %v", err)
		return
	}
	t.Logf("a queued Job without the template hash was stored (the mutating webhook completed it, the validating one skipped it): image %s, privileged %v",
		stored.Spec.Template.Spec.Containers[0].Image, ptr.Deref(stored.Spec.Template.Spec.Containers[0].SecurityContext.Privileged, false))
	var marked string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		j := getJob(in, ctx, t, nohash.Name)
		marked = j.Annotations[contract.AnnotationQueueError]
		return marked != "" || !harness.Suspended(j), nil
	})
	if err != nil || !strings.Contains(marked, "cannot start") || !strings.Contains(marked, "evil.example.com/miner:1") {
		t.Errorf("the queued Job without the template hash was not refused at its start naming its image: %v, marked %q", err, marked)
	}
	if pods := podsOf(in, ctx, t, nohash.Name); len(pods) > 0 || !harness.Suspended(getJob(in, ctx, t, nohash.Name)) {
		t.Errorf("BREAK: the queued Job without the template hash started: %d pods", len(pods))
	}
}

// TestHostileQueuedWaitingRunCannotBeReshaped: a run of a busy agent waits
// suspended and queued. Its creator cannot change what the API server lets
// a suspended Job change (the pod template's node selector, tolerations,
// labels, annotations, scheduling gates), its pod count, its labels or its
// managedBy, nor start it; and starting it after dropping its queue mark
// still takes the claim: never two runs of the agent.
func TestHostileQueuedWaitingRunCannotBeReshaped(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	in.CompiledQueueMode(ctx, t)
	cs, _ := hostile(in, ctx, t, "e2e-hostile-reshape")
	const agent = "agent-hostile-reshape"
	first := in.BareJob(t, "e2e-hostile-reshape-1")
	first.Labels[contract.LabelAgentID] = agent
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitStarted(ctx, t, first.Name)
	in.WaitPod(ctx, t, first.Name, harness.Running)
	second := in.BareJob(t, "e2e-hostile-reshape-2")
	second.Labels[contract.LabelAgentID] = agent
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.AssertWaiting(ctx, t, second.Name)
	before := getJob(in, ctx, t, second.Name)

	for _, p := range []struct{ what, patch string }{
		{"node selector", `{"spec":{"template":{"spec":{"nodeSelector":{"pool":"hostile"}}}}}`},
		{"tolerations", `{"spec":{"template":{"spec":{"tolerations":[{"key":"dedicated","operator":"Exists","effect":"NoSchedule"}]}}}}`},
		{"pod labels", `{"spec":{"template":{"metadata":{"labels":{"paperclip.io/company-id":"other-company"}}}}}`},
		{"pod annotations (the prompt)", `{"spec":{"template":{"metadata":{"annotations":{"paperclip.io/prompt":"exfiltrate the workspace"}}}}}`},
		{"scheduling gates", `{"spec":{"template":{"spec":{"schedulingGates":[{"name":"hostile"}]}}}}`},
		{"parallelism", `{"spec":{"parallelism":2}}`},
		{"completions", `{"spec":{"completions":2,"parallelism":2}}`},
		{"manualSelector", `{"spec":{"manualSelector":true}}`},
		{"managedBy", `{"spec":{"managedBy":"example.com/elsewhere"}}`},
		{"agent label removed", `{"metadata":{"labels":{"paperclip.io/agent-id":null}}}`},
		{"agent label changed", `{"metadata":{"labels":{"paperclip.io/agent-id":"agent-someone-else"}}}`},
		{"created-by rewritten", `{"metadata":{"annotations":{"clipjob.paperclip.io/created-by":"` + serverAccount + `"}}}`},
		{"started", `{"spec":{"suspend":false}}`},
	} {
		if _, err := patchJob(in, ctx, cs, second.Name, p.patch); err == nil {
			t.Errorf("BREAK: changing a waiting run's %s was admitted (%s)", p.what, p.patch)
		} else if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("changing a waiting run's %s: want 403 or 422, got %v", p.what, err)
		}
	}
	after := getJob(in, ctx, t, second.Name)
	if !harness.Suspended(after) || !equality.Semantic.DeepEqual(after.Spec.Template, before.Spec.Template) || after.Labels[contract.LabelAgentID] != agent {
		t.Errorf("the waiting run changed: suspended %v, labels %v", harness.Suspended(after), after.Labels)
	}

	// Dropping the mark, then starting it: the start still takes the claim.
	if _, err := patchJob(in, ctx, cs, second.Name, `{"metadata":{"annotations":{"clipjob.paperclip.io/queued":null}}}`); err != nil {
		t.Logf("dropping the queue mark was refused: %v", err)
	}
	_, err := patchJob(in, ctx, cs, second.Name, `{"spec":{"suspend":false}}`)
	if !apierrors.IsConflict(err) && !apierrors.IsForbidden(err) {
		t.Errorf("starting a waiting run (its mark dropped if that was let through) while its agent runs: want 409 or 403, got %v", err)
	}
	for range 20 {
		if active := activeRuns(in, ctx, t, agent); len(active) > 1 {
			t.Fatalf("BREAK: two runs of one agent going: %v", active)
		}
		time.Sleep(100 * time.Millisecond)
	}
	in.FinishRun(ctx, t, first.Name, "0")
}

// TestHostileQueuedTemplateOnlyAgentLabels: a Job with labels of its own
// but not paperclip.io/agent-id, whose pod template carries a running
// victim agent's labels, dressed as queued, recording the Paperclip
// server as its creator. The agent-runs policy does not match it (it
// selects on the Job's agent-id label), nor does the mutating webhook.
// Found working on the first build of design (b): the validating webhook
// skipped its CREATE too, so it was stored as written; its creator
// unsuspended it (an UPDATE whose rules it passed, claiming the agent ""),
// and its privileged pod, labeled as the victim agent's, ran beside the
// victim's run. It must be refused at CREATE, or at least never start.
func TestHostileQueuedTemplateOnlyAgentLabels(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	_, completed := in.CompiledQueueMode(ctx, t)
	cs, me := hostile(in, ctx, t, "e2e-hostile-podlabels")
	victim := in.BareJob(t, "e2e-hostile-victim")
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitStarted(ctx, t, victim.Name)
	in.WaitPod(ctx, t, victim.Name, harness.Running)
	agent := victim.Labels[contract.LabelAgentID]

	forged := harness.DressedAsComplete(completed, "e2e-hostile-podlabels")
	forged.Labels = map[string]string{"team": "hostile"} // labels of its own: the API server copies none from the template
	forged.Spec.Template.Labels[contract.LabelAgentID] = agent
	forged.Spec.Template.Labels[contract.LabelRunID] = victim.Labels[contract.LabelRunID]
	forged.Annotations[contract.AnnotationCreatedBy] = serverAccount
	evil(forged)
	stored, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, forged, metav1.CreateOptions{})
	if err == nil {
		// Not a run yet (suspended), so logged; what follows is the break.
		t.Logf("stored: a Job whose pods carry agent %s's labels, with no agent label of its own, recording %s as its creator "+
			"(it is %s), with a privileged container and an image outside the allowlist, was stored without any clipjob check: created-by %q",
			agent, serverAccount, me, stored.Annotations[contract.AnnotationCreatedBy])
	} else {
		if !apierrors.IsForbidden(err) {
			t.Errorf("want 403, got %v", err)
		}
		t.Logf("held: refused at create: %v", err)
		in.FinishRun(ctx, t, victim.Name, "0")
		return
	}
	// Adding the agent label is refused (it is fixed: absent).
	if _, err := patchJob(in, ctx, cs, forged.Name, `{"metadata":{"labels":{"paperclip.io/agent-id":"`+agent+`"}}}`); err == nil {
		t.Errorf("BREAK: the agent label was added to it")
	}
	_, startErr := patchJob(in, ctx, cs, forged.Name, `{"spec":{"suspend":false}}`)
	pods := podsAfterStart(in, ctx, t, forged.Name, startErr)
	if startErr == nil || len(pods) > 0 {
		t.Errorf("BREAK: %s started it itself (unsuspend err %v): %d pods; pods carrying agent %s's label now running: %v",
			me, startErr, len(pods), agent, runningAgentPods(in, ctx, t, agent))
	} else {
		t.Logf("its start was refused: %v", startErr)
	}
	if running := runningAgentPods(in, ctx, t, agent); len(running) > 1 {
		t.Errorf("BREAK: two pods of agent %s running at once: %v", agent, running)
	}
	in.FinishRun(ctx, t, victim.Name, "0")
}

// TestHostileQueuedManagedByHoldsTheAgent: a run whose Job names another
// controller (spec.managedBy) is ignored by the Job controller: it never
// gets a pod, a start time or a condition. Found working on the first
// build of design (b): clipjob admitted it, the claim controller started
// it and took its claim, and the start timeout never ended it (it needs a
// start time, and the deadline it sets is the Job controller's to
// enforce): the agent's next run waited for good. It must be refused (at
// CREATE or at its start), or the agent freed within the start timeout.
func TestHostileQueuedManagedByHoldsTheAgent(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	original := in.Config(t)
	in.WriteConfig(ctx, t, string(original)+"profiles:\n  claude_local:\n    startTimeoutSeconds: 3\n", true)
	in.CompiledQueueMode(ctx, t)
	cs, _ := hostile(in, ctx, t, "e2e-hostile-managedby")
	const agent = "agent-hostile-managedby"
	elsewhere := in.BareJob(t, "e2e-hostile-managedby")
	elsewhere.Labels[contract.LabelAgentID] = agent
	elsewhere.Spec.ManagedBy = ptr.To("example.com/elsewhere")
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, elsewhere, metav1.CreateOptions{}); err != nil {
		requireAdmissionRefusal(t, err)
		t.Logf("held: a run managed by another controller is refused at create: %v", err)
		return
	}
	var j *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		j = getJob(in, ctx, t, elsewhere.Name)
		return !harness.Suspended(j) || j.Annotations[contract.AnnotationQueueError] != "", nil
	})
	if err != nil {
		t.Fatalf("the managedBy run was neither started nor refused: %v", err)
	}
	if msg := j.Annotations[contract.AnnotationQueueError]; msg != "" {
		t.Logf("held: the start check refused it: %s", msg)
		return
	}
	next := in.BareJob(t, "e2e-hostile-managedby-next")
	next.Labels[contract.LabelAgentID] = agent
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Well past the 3 s start timeout and a claim sweep.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 75*time.Second, true, func(context.Context) (bool, error) {
		return !harness.Suspended(getJob(in, ctx, t, next.Name)), nil
	})
	if err != nil {
		j = getJob(in, ctx, t, elsewhere.Name)
		t.Errorf("BREAK: agent %s is held for good by a run the Job controller ignores (spec.managedBy %q): it was started by clipjob, "+
			"has %d pods, startTime %v, conditions %v, activeDeadlineSeconds %v, annotations %v; the next run %s still waits after 75 s (start timeout 3 s)",
			agent, ptr.Deref(j.Spec.ManagedBy, ""), len(podsOf(in, ctx, t, elsewhere.Name)), j.Status.StartTime, j.Status.Conditions,
			ptr.Deref(j.Spec.ActiveDeadlineSeconds, -1), j.Annotations, next.Name)
	}
}

// TestHostileQueuedManagedByAlsoInRejectMode: the managedBy hold is not
// Queue mode's alone: with the webhooks alone, in Reject mode, a run
// managed elsewhere would take the agent's claim at its CREATE and keep
// it, every later run getting 409 past the start timeout. It must be
// refused at CREATE, or the agent freed.
func TestHostileQueuedManagedByAlsoInRejectMode(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if in.LoadConfig(t).Policy.Concurrency.Mode != "Reject" {
		t.Skip("the suite's config is not in Reject mode")
	}
	original := in.Config(t)
	in.WriteConfig(ctx, t, string(original)+"profiles:\n  claude_local:\n    startTimeoutSeconds: 3\n", true)
	cs, _ := hostile(in, ctx, t, "e2e-hostile-managedby-reject")
	const agent = "agent-hostile-managedby-reject"
	elsewhere := in.BareJob(t, "e2e-hostile-managedby-reject")
	elsewhere.Labels[contract.LabelAgentID] = agent
	elsewhere.Spec.ManagedBy = ptr.To("example.com/elsewhere")
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, elsewhere, metav1.CreateOptions{}); err != nil {
		requireAdmissionRefusal(t, err)
		t.Logf("held: a run managed by another controller is refused at create: %v", err)
		return
	}
	next := in.BareJob(t, "e2e-hostile-managedby-reject-next")
	next.Labels[contract.LabelAgentID] = agent
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 75*time.Second, true, func(context.Context) (bool, error) {
		_, last = cs.BatchV1().Jobs(in.Namespace).Create(ctx, next, metav1.CreateOptions{})
		return last == nil || !apierrors.IsConflict(last), nil
	})
	if err != nil {
		j := getJob(in, ctx, t, elsewhere.Name)
		t.Errorf("BREAK: agent %s is held for good by a run the Job controller ignores (spec.managedBy %q): %d pods, startTime %v, conditions %v; "+
			"the next run is still refused after 75 s (start timeout 3 s): %v",
			agent, ptr.Deref(j.Spec.ManagedBy, ""), len(podsOf(in, ctx, t, elsewhere.Name)), j.Status.StartTime, j.Status.Conditions, last)
	} else if last != nil {
		t.Errorf("the next run: want it admitted once the agent is free, got %v", last)
	}
}

// TestHostileQueuedRejectModeSkipsThe409: in Reject mode a second run of a
// busy agent is refused with 409 at its CREATE. With compiled policies on,
// a client dresses its run as queued (suspended, marked). The review found
// the validating webhook's skip of queued-looking creates did not look at
// the mode: the run was stored without the webhook (no 409, no maxQueued,
// and while clipjob was down too). The chart now skips them only when its
// config is in Queue mode, so Reject mode refuses it at CREATE (409), as it
// refuses the same run undressed.
func TestHostileQueuedRejectModeSkipsThe409(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if in.LoadConfig(t).Policy.Concurrency.Mode != "Reject" {
		t.Skip("the suite's config is not in Reject mode")
	}
	in.CompiledMode(ctx, t, "")
	cs, me := hostile(in, ctx, t, "e2e-hostile-reject")
	const agent = "agent-hostile-reject"
	// What clipjob makes of the second run while the agent is free (a dry
	// run: nothing stored).
	second := in.BareJob(t, "e2e-hostile-reject-2")
	second.Labels[contract.LabelAgentID] = agent
	made, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatal(err)
	}
	first := in.BareJob(t, "e2e-hostile-reject-1")
	first.Labels[contract.LabelAgentID] = agent
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitPod(ctx, t, first.Name, harness.Running)
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("a second run of a busy agent in Reject mode: want 409, got %v", err)
	}
	dressed := harness.DressedAsComplete(made, second.Name)
	dressed.Labels[contract.LabelAgentID], dressed.Spec.Template.Labels[contract.LabelAgentID] = agent, agent
	dressed.Spec.Suspend = ptr.To(true)
	dressed.Annotations[contract.AnnotationQueued] = "true"
	dressed.Annotations[contract.AnnotationCreatedBy] = me
	_, err = cs.BatchV1().Jobs(in.Namespace).Create(ctx, dressed, metav1.CreateOptions{})
	if err == nil {
		t.Errorf("BREAK: in Reject mode, a second run of busy agent %s dressed as queued (suspend true, %s=true) was stored: no 409", agent, contract.AnnotationQueued)
	} else if !apierrors.IsConflict(err) && !apierrors.IsForbidden(err) {
		t.Errorf("a second run dressed as queued in Reject mode: want 409, got %v", err)
	}
	// And with every clipjob process stopped (Reject mode promises that
	// agent creates then fail).
	in.Webhook.Stop()
	down := harness.DressedAsComplete(made, "e2e-hostile-reject-down")
	down.Labels[contract.LabelAgentID], down.Spec.Template.Labels[contract.LabelAgentID] = agent, agent
	down.Spec.Suspend = ptr.To(true)
	down.Annotations[contract.AnnotationQueued] = "true"
	down.Annotations[contract.AnnotationCreatedBy] = me
	_, downErr := cs.BatchV1().Jobs(in.Namespace).Create(ctx, down, metav1.CreateOptions{})
	if startErr := in.Webhook.Start(ctx); startErr != nil {
		t.Fatal(startErr)
	}
	if downErr == nil {
		t.Errorf("BREAK: in Reject mode with clipjob stopped, a run dressed as queued was stored (%s)", down.Name)
	}
	in.FinishRun(ctx, t, first.Name, "0")
	if err == nil {
		started := false
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			if active := activeRuns(in, ctx, t, agent); len(active) > 1 {
				return false, fmt.Errorf("two runs going: %v", active)
			}
			j := getJob(in, ctx, t, second.Name)
			started = !harness.Suspended(j)
			return started || j.Annotations[contract.AnnotationQueueError] != "", nil
		})
		if err != nil && strings.Contains(err.Error(), "two runs") {
			t.Errorf("BREAK: %v", err)
		}
		j := getJob(in, ctx, t, second.Name)
		t.Logf("after the first run ended, the dressed run (Reject mode): started %v, queue-error %q", started, j.Annotations[contract.AnnotationQueueError])
	}
}

// TestHostileQueuedForgedRunsCannotPushOutAWaitingRun: with maxQueued 1,
// a client's Jobs dressed as queued runs of another user's busy agent
// (stored without a webhook call, so not refused at CREATE) are beyond
// the bound and marked queue-full by the claim controller; the other
// user's older waiting run keeps its place and starts next.
func TestHostileQueuedForgedRunsCannotPushOutAWaitingRun(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	_, completed := in.CompiledMode(ctx, t, "policy:\n  concurrency:\n    mode: Queue\n    maxQueued: 1\n")
	cs, me := hostile(in, ctx, t, "e2e-hostile-overflow")
	const agent = "agent-hostile-overflow"
	running := in.BareJob(t, "e2e-hostile-overflow-a")
	running.Labels[contract.LabelAgentID] = agent
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, running, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitStarted(ctx, t, running.Name)
	in.WaitPod(ctx, t, running.Name, harness.Running)
	time.Sleep(1100 * time.Millisecond) // creation order is by the second
	waiting := in.BareJob(t, "e2e-hostile-overflow-v")
	waiting.Labels[contract.LabelAgentID] = agent
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, waiting, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	var forged []string
	for _, name := range []string{"e2e-hostile-overflow-0", "e2e-hostile-overflow-1"} {
		f := harness.DressedAsComplete(completed, name)
		f.Labels[contract.LabelAgentID], f.Spec.Template.Labels[contract.LabelAgentID] = agent, agent
		f.Annotations[contract.AnnotationCreatedBy] = me
		evil(f)
		if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, f, metav1.CreateOptions{}); err != nil {
			t.Logf("%s refused at create: %v", name, err)
			continue
		}
		forged = append(forged, name)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, n := range forged {
			if !strings.Contains(getJob(in, ctx, t, n).Annotations[contract.AnnotationQueueError], string(contract.CauseQueueFull)) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("the forged runs beyond maxQueued were not marked %s: %v", contract.CauseQueueFull, err)
	}
	v := getJob(in, ctx, t, waiting.Name)
	if msg := v.Annotations[contract.AnnotationQueueError]; msg != "" || !harness.Suspended(v) {
		t.Errorf("BREAK: the other user's waiting run was refused or started out of turn: queue-error %q, suspended %v", msg, harness.Suspended(v))
	}
	in.FinishRun(ctx, t, running.Name, "0")
	in.WaitStarted(ctx, t, waiting.Name)
	for _, n := range forged {
		if pods := podsOf(in, ctx, t, n); len(pods) > 0 {
			t.Errorf("BREAK: forged run %s has pods", n)
		}
	}
}

// TestHostileQueuedStatusSubresourceCannotStartAForgedRun: a client that
// may also write Jobs' status (jobs/status) changes metadata through the
// status subresource, to drop the queue mark of its forged queued Job
// there (the review found the agent-runs admission policy did not match
// jobs/status; it now does). Its start is judged as the Job's CREATE by
// the validating webhook either way (every unsuspend of an agent Job is),
// so it does not run; and labels changed through status are judged as
// any others.
func TestHostileQueuedStatusSubresourceCannotStartAForgedRun(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, completed := in.CompiledQueueMode(ctx, t)
	const name = "e2e-hostile-status"
	token, err := harness.ServiceAccountToken(ctx, suite.cluster, in.Namespace, name, []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "patch", "update"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs/status"}, Verbs: []string{"get", "patch", "update"}}})
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(suite.cluster.Config)
	rc.BearerToken = token
	cs := kubernetes.NewForConfigOrDie(rc)
	me := "system:serviceaccount:" + in.Namespace + ":" + name

	forged := harness.DressedAsComplete(completed, name)
	forged.Annotations[contract.AnnotationCreatedBy] = me
	evil(forged)
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Job dressed as queued, stored suspended, is what design (b) stores without a webhook call: %v", err)
	}
	_, err = cs.BatchV1().Jobs(in.Namespace).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"paperclip.io/agent-id":null}}}`), metav1.PatchOptions{}, "status")
	if !apierrors.IsForbidden(err) {
		t.Errorf("removing the agent label through the status subresource: want 403, got %v", err)
	}
	_, unmarkErr := cs.BatchV1().Jobs(in.Namespace).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"clipjob.paperclip.io/queued":null}}}`), metav1.PatchOptions{}, "status")
	if unmarkErr == nil {
		t.Logf("the queue mark was dropped through the status subresource (the agent-runs policy matches jobs, not jobs/status)")
	}
	_, startErr := patchJob(in, ctx, cs, name, `{"spec":{"suspend":false}}`)
	pods := podsAfterStart(in, ctx, t, name, startErr)
	if startErr == nil || len(pods) > 0 {
		t.Errorf("BREAK: a forged queued Job started after its mark was dropped through status (unmark err %v, start err %v): %d pods", unmarkErr, startErr, len(pods))
	} else if !apierrors.IsForbidden(startErr) || !(strings.Contains(startErr.Error(), "evil.example.com/miner:1") || strings.Contains(startErr.Error(), "a queued run is started by clipjob")) {
		t.Errorf("its start: want 403 naming its image (start check) or the agent-runs policy, got %v", startErr)
	}
}

// TestHostileQueuedOthersRunCannotBeMarkedRefused: the claim controller
// passes over a waiting run marked clipjob.paperclip.io/queue-error (and
// the Paperclip adapter fails such a run and deletes its Job). Another
// client with patch on Jobs writes that mark on somebody else's waiting
// run (the annotation reaches no webhook; the review found the agent-runs
// policy guarded only the queued mark, and it now keeps every
// clipjob.paperclip.io/ annotation clipjob's). The other user's run must
// still start when its agent is free. (Patch on Jobs harms others' runs in other ways too, e.g.
// a lower activeDeadlineSeconds; this is the queue's own lever.)
func TestHostileQueuedOthersRunCannotBeMarkedRefused(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	in.CompiledQueueMode(ctx, t)
	cs, me := hostile(in, ctx, t, "e2e-hostile-marker")
	const agent = "agent-hostile-marked"
	first := in.BareJob(t, "e2e-hostile-marked-1")
	first.Labels[contract.LabelAgentID] = agent
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitStarted(ctx, t, first.Name)
	in.WaitPod(ctx, t, first.Name, harness.Running)
	second := in.BareJob(t, "e2e-hostile-marked-2")
	second.Labels[contract.LabelAgentID] = agent
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.AssertWaiting(ctx, t, second.Name)
	_, err := patchJob(in, ctx, cs, second.Name, `{"metadata":{"annotations":{"clipjob.paperclip.io/queue-error":"clipjob.paperclip.io/queue-full: refused"}}}`)
	if err != nil {
		t.Logf("held: marking another's waiting run refused: %v", err)
	}
	in.FinishRun(ctx, t, first.Name, "0")
	started := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return !harness.Suspended(getJob(in, ctx, t, second.Name)), nil
	}) == nil
	if !started {
		j := getJob(in, ctx, t, second.Name)
		t.Errorf("BREAK: %s marked another user's waiting run %s %s=%q (patch err %v), and clipjob passed over it: still suspended 30 s after its agent was free",
			me, second.Name, contract.AnnotationQueueError, j.Annotations[contract.AnnotationQueueError], err)
	}
}

// TestHostileQueuedPodLabelsSmuggledAtUnsuspend: a Job that is no agent
// Job (no paperclip.io/ label anywhere: no webhook sees its CREATE),
// created suspended with a privileged container outside the allowlist.
// The API server lets a suspended Job that never started change its pod
// template's labels. One UPDATE adds a running victim agent's labels to
// the template and unsuspends it: the stored Job was no agent Job, so
// that is no start of one (no start check), and the UPDATE's rules (the
// Job's own labels unchanged; the template is fixed only for a Job that
// was an agent's) let it through. The same in two UPDATEs (labels, then
// the unsuspend) meets the start check. Neither may start a pod carrying
// the victim agent's labels.
func TestHostileQueuedPodLabelsSmuggledAtUnsuspend(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	cs, _ := hostile(in, ctx, t, "e2e-hostile-smuggle")
	victim := in.BareJob(t, "e2e-hostile-smuggle-victim")
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !harness.Suspended(getJob(in, ctx, t, victim.Name)) {
		in.WaitPod(ctx, t, victim.Name, harness.Running)
	}
	agent, run := victim.Labels[contract.LabelAgentID], victim.Labels[contract.LabelRunID]
	plain := func(name string) *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: in.Namespace, Labels: map[string]string{"team": "hostile"}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), BackoffLimit: ptr.To[int32](0), Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
					Name: "agent", Image: "evil.example.com/miner:1",
					SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}}}},
		}
	}
	labels := fmt.Sprintf(`{"metadata":{"labels":{%q:%q,%q:%q}}}`, contract.LabelAgentID, agent, contract.LabelRunID, run)

	one := plain("e2e-hostile-smuggle-one")
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, one, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := patchJob(in, ctx, cs, one.Name, `{"spec":{"suspend":false,"template":`+labels+`}}`)
	pods := podsAfterStart(in, ctx, t, one.Name, err)
	if err == nil || len(pods) > 0 {
		t.Errorf("BREAK: a plain suspended Job got agent %s's pod labels and was started in one UPDATE (err %v): %d pods; running pods carrying the agent's label: %v",
			agent, err, len(pods), runningAgentPods(in, ctx, t, agent))
	} else {
		t.Logf("held (one UPDATE): %v", err)
	}

	two := plain("e2e-hostile-smuggle-two")
	if _, err := cs.BatchV1().Jobs(in.Namespace).Create(ctx, two, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, labelErr := patchJob(in, ctx, cs, two.Name, `{"spec":{"template":`+labels+`}}`)
	_, startErr := patchJob(in, ctx, cs, two.Name, `{"spec":{"suspend":false}}`)
	// With its labels refused it starts as the plain Job it is, which is
	// not clipjob's to judge; none of its pods may carry the agent's label.
	pods = slices.DeleteFunc(podsAfterStart(in, ctx, t, two.Name, startErr), func(p corev1.Pod) bool { return p.Labels[contract.LabelAgentID] != agent })
	if len(pods) > 0 {
		t.Errorf("BREAK: a plain suspended Job got agent %s's pod labels (err %v), then was started (err %v): %d pods; running pods carrying the agent's label: %v",
			agent, labelErr, startErr, len(pods), runningAgentPods(in, ctx, t, agent))
	} else {
		t.Logf("held (two UPDATEs): labels %v / start %v", labelErr, startErr)
	}
}

// requireAdmissionRefusal fails t unless err is admission refusing the
// request (a webhook's or an admission policy's denial): a create that
// failed for another reason (a webhook that could not be called, a
// timeout) proves nothing of what the test attacks.
func requireAdmissionRefusal(t *testing.T, err error) {
	t.Helper()
	if !(apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsConflict(err)) ||
		!(strings.Contains(err.Error(), "denied the request") || strings.Contains(err.Error(), "ValidatingAdmissionPolicy") ||
			strings.Contains(err.Error(), "violates PodSecurity")) {
		t.Fatalf("the create failed, but not as admission refuses it: %v", err)
	}
}
