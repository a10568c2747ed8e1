package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/replicas"
)

// The relay's replicas attacked again: a replica paused past its Lease,
// a tenant forging a pod's controller, and the relay's own token against
// its Lease policy. (Tenants naming their Jobs for one replica:
// replicas.TestRunNamesChosenWithoutTheSecretSpread.)

// TestHostileRelayReview2PausedReplicaLosesNoLine: a replica frozen
// (SIGSTOP, as a node under pressure or a debugger freezes it) mid-flood
// for longer than its Lease lasts twice over. The others take its runs
// over and delete its Lease as left behind; thawed, it goes on for a
// moment with the runs it believed its own, from the cursors it read
// before, then renews (recreating its Lease) and rejoins. Every line of
// every run is stored once, in order, read through each replica.
func TestHostileRelayReview2PausedReplicaLosesNoLine(t *testing.T) {
	in := newInstall(t)
	ctx, rs := readyReplicas(in, t)
	const paused = 1
	// A flood one run of which at least the frozen replica owns.
	prefix := ""
	for i := 0; prefix == ""; i++ {
		p := fmt.Sprintf("e2e-review2-paused%d", i)
		for j := range 3 {
			if rs.owner(fmt.Sprintf("%s-%d", p, j)) == paused {
				prefix = p
			}
		}
	}
	f := startFlood(in, ctx, t, prefix, 3)
	owned := 0
	for _, r := range f.runs {
		if rs.owner(r) == paused {
			owned++
		}
	}
	t.Logf("the paused replica %s owns %d of the flood's %d runs", rs.ids[paused], owned, len(f.runs))
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, f.beyond(100), "before the pause")
	refusedBefore := refusals(t, rs.relays[paused])
	pid := rs.relays[paused].PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer thaw()
	leases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	name := replicas.LeaseName(rs.group, rs.ids[paused])
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := leases.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the frozen replica's Lease %s was not deleted as left behind: %v", name, err)
	}
	t.Logf("the frozen replica's Lease deleted by the others %s after the freeze (lease %s)", time.Since(stopped).Round(100*time.Millisecond), relay.DefaultOptions().Replicas.LeaseDuration)
	// The others collect its runs meanwhile.
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, f.beyond(100), "with the replica frozen")
	thaw()
	rs.waitMembers(ctx, t, 0, 1, 2)
	if _, err := leases.Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the thawed replica rejoined without its Lease: %v", err)
	}
	waitEach(ctx, t, rs.relays[0], rs.token, f.runs, f.beyond(100), "after the thaw")
	f.end(ctx, t, rs)
	t.Logf("the thawed replica had %d commits refused after the thaw", refusals(t, rs.relays[paused])-refusedBefore)
}

// relayLeaseClient is a Lease client holding the chart relay's
// ServiceAccount token, with the chart's Lease policy applied (removed at
// the end of the test); it returns once the API server enforces it.
func relayLeaseClient(ctx context.Context, t *testing.T) (asRelay, admin coordinationclient.LeaseInterface) {
	t.Helper()
	t.Cleanup(func() {
		if err := deleteRelayLeasePolicy(context.Background()); err != nil {
			t.Error(err)
		}
	})
	chartRBAC := func(ctx context.Context) error { return harness.ApplyChartRBAC(ctx, suite.cs) }
	for _, apply := range []func(context.Context) error{chartRBAC, applyRelayLeaseRBAC, applyRelayLeasePolicy} {
		if err := apply(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	rc := rest.AnonymousClientConfig(suite.cluster.Config)
	if rc.BearerToken, err = harness.ServiceAccountToken(ctx, suite.cluster, harness.Release.Namespace, relaySA, nil); err != nil {
		t.Fatal(err)
	}
	relayLeases := kubernetes.NewForConfigOrDie(rc).CoordinationV1().Leases(harness.Release.Namespace)
	adminLeases := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	probe := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "e2e-review2-probe"}}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := relayLeases.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the API server does not enforce the relay Lease policy: %v", err)
	}
	return relayLeases, adminLeases
}

// TestHostileRelayReview2RelayCannotDeleteLeasesWholesale: the relay's
// token, under the chart's Role and Lease policy, cannot delete the
// namespace's Leases as a collection (the Role grants no deletecollection),
// not even those of its group, dry run or not; every Lease stays.
func TestHostileRelayReview2RelayCannotDeleteLeasesWholesale(t *testing.T) {
	// Alone (not in parallel): the chart's relay Lease policy confines
	// every relay of the cluster, the other tests' too.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A webhook electing its claim controller in the release namespace,
	// as the chart's does, whose Lease the relay must not touch.
	in := addInstall(t, harness.InstallOptions{WebhookFlags: []string{"--leader-election-namespace", harness.SystemNamespace}})
	in.WaitElection(ctx, t, harness.SystemNamespace)
	asRelay, admin := relayLeaseClient(ctx, t)
	mine := replicas.LeaseName(relayGroup, "e2e-review2-wholesale")
	_ = admin.Delete(ctx, mine, metav1.DeleteOptions{})
	t.Cleanup(func() { _ = admin.Delete(context.Background(), mine, metav1.DeleteOptions{}) })
	if _, err := admin.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: mine, Labels: map[string]string{replicas.LabelGroup: relayGroup}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("e2e-review2-wholesale")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []metav1.DeleteOptions{{DryRun: []string{metav1.DryRunAll}}, {}} {
		for _, sel := range []string{"", replicas.LabelGroup + "=" + relayGroup} {
			err := asRelay.DeleteCollection(ctx, opts, metav1.ListOptions{LabelSelector: sel})
			if !apierrors.IsForbidden(err) {
				t.Errorf("the relay deleting Leases as a collection (selector %q, dry run %v): want 403, got %v", sel, opts.DryRun, err)
			}
		}
	}
	if _, err := admin.Get(ctx, "clipjob-claim-controller", metav1.GetOptions{}); err != nil {
		t.Errorf("the webhook's election Lease: %v", err)
	}
	if _, err := admin.Get(ctx, mine, metav1.GetOptions{}); err != nil {
		t.Errorf("the group's Lease %s: %v", mine, err)
	}
}

// forgedPod is a pod in namespace named run, with the labels of vpod's
// run (but run's id and agent), whose controller is vpod's Job, on
// vpod's node; a spec of one container of vpod's image.
func forgedPod(vpod *corev1.Pod, namespace, run string) *corev1.Pod {
	labels := map[string]string{}
	for k, v := range vpod.Labels {
		if !strings.Contains(k, "job-name") && !strings.Contains(k, "controller-uid") {
			labels[k] = v
		}
	}
	labels[contract.LabelRunID] = run
	labels[contract.LabelAgentID] = "agent-" + run
	job := metav1.GetControllerOf(vpod)
	c := vpod.Spec.Containers[0]
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: run, Namespace: namespace, Labels: labels, Annotations: vpod.Annotations,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: vpod.Spec.NodeName, Tolerations: vpod.Spec.Tolerations, RestartPolicy: corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: c.Name, Image: c.Image, Command: c.Command}}}}
}
