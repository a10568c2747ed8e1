package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay/replicas"
)

// For the suite's release: the chart's relay ServiceAccount, its
// --lease-group, and the name of its relay Lease policy and binding.
var (
	relaySA          = harness.Release.Name + "-relay"
	relayGroup       = harness.Release.Name + "-relay"
	relayLeasePolicy = harness.Release.Name + "-relay-leases"
)

// renderRelayOnPostgres renders the chart for the suite's release with
// the relay on PostgreSQL, as an install with several replicas is.
func renderRelayOnPostgres() (*charts.Rendered, error) {
	return charts.Render(harness.Release, map[string]any{"relay": map[string]any{"store": "postgres", "replicas": 3,
		"postgres": map[string]any{"existingSecret": "relay-postgres"}}})
}

// TestRelayLeasePolicyConfinesTheRelayToItsGroup: with the chart's relay
// Lease policy and binding as the chart renders them, a client holding a
// token of the relay's ServiceAccount (and the chart's Lease Role) is
// refused, with the policy's message, updating or deleting the webhook's
// election Lease (clipjob-claim-controller) or any Lease outside its
// group, creating a Lease without its group's label or name, and taking
// its own Lease out of the group; it may still create, renew and delete a
// Lease of its group, as the relays do.
func TestRelayLeasePolicyConfinesTheRelayToItsGroup(t *testing.T) {
	// Alone (not in parallel): the chart's relay Lease policy confines
	// every relay of the cluster, the other tests' too.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A webhook electing its claim controller in the release namespace,
	// as the chart's does, whose Lease the relay must not touch.
	in := addInstall(t, harness.InstallOptions{WebhookFlags: []string{"--leader-election-namespace", harness.SystemNamespace}})
	in.WaitElection(ctx, t, harness.SystemNamespace)
	if err := harness.ApplyChartRBAC(ctx, suite.cs); err != nil {
		t.Fatal(err)
	}
	if err := applyRelayLeaseRBAC(ctx); err != nil {
		t.Fatal(err)
	}
	admin := suite.cs.CoordinationV1().Leases(harness.Release.Namespace)
	mine := replicas.LeaseName(relayGroup, "e2e-policy")
	for _, name := range []string{mine, "e2e-not-a-relay-lease", "e2e-squat"} {
		if err := admin.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := deleteRelayLeasePolicy(ctx); err != nil {
			t.Error(err)
		}
		for _, name := range []string{mine, "e2e-not-a-relay-lease", "e2e-squat"} {
			_ = admin.Delete(ctx, name, metav1.DeleteOptions{})
		}
	})
	if err := applyRelayLeasePolicy(ctx); err != nil {
		t.Fatal(err)
	}
	token, err := harness.ServiceAccountToken(ctx, suite.cluster, harness.Release.Namespace, relaySA, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(suite.cluster.Config)
	rc.BearerToken = token
	asRelay := kubernetes.NewForConfigOrDie(rc).CoordinationV1().Leases(harness.Release.Namespace)

	refused := func(what string, err error, want ...string) {
		t.Helper()
		want = append(want, "ValidatingAdmissionPolicy '"+relayLeasePolicy+"'", replicas.LabelGroup+"="+relayGroup, relayGroup+".<replica id>")
		if !apierrors.IsForbidden(err) {
			t.Errorf("the relay %s: want 403 from the policy, got %v", what, err)
			return
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the relay %s: refused with %q, which does not say %q", what, err, w)
			}
		}
	}
	lease := func(name string, labels map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("e2e-policy"), LeaseDurationSeconds: ptr.To[int32](10)}}
	}

	// A Lease with no group label, created as the relay: refused once the
	// API server enforces the new policy (shortly after its creation).
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = asRelay.Create(ctx, lease("e2e-squat", nil), metav1.CreateOptions{})
		if last == nil {
			return false, admin.Delete(ctx, "e2e-squat", metav1.DeleteOptions{})
		}
		return apierrors.IsForbidden(last), nil
	})
	if err != nil {
		t.Fatalf("the relay may still create a Lease with no group label: %v (last: %v)", err, last)
	}
	refused("creating a Lease with no group label", last, "Lease e2e-squat as written is not", "--lease-group="+relayGroup)
	_, err = asRelay.Create(ctx, lease("e2e-squat", map[string]string{replicas.LabelGroup: relayGroup}), metav1.CreateOptions{})
	refused("creating a Lease of its group's label not named for the group", err, "Lease e2e-squat as written is not")
	_, err = asRelay.Create(ctx, lease(replicas.LeaseName(relayGroup, "x"), map[string]string{replicas.LabelGroup: "e2e-other-group"}), metav1.CreateOptions{})
	refused("creating a Lease named for its group of another group", err)
	// Another release's relay group in this namespace whose name begins
	// with this one's: its replica's Lease name cannot be taken first
	// under this group's label (with '-' between group and replica, the
	// name began with this group's prefix; a hostile review).
	_, err = asRelay.Create(ctx, lease(replicas.LeaseName(relayGroup+"-b", "relay-0"), map[string]string{replicas.LabelGroup: relayGroup}),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused("creating the Lease name of group "+relayGroup+"-b's replica", err, "as written is not")

	// The webhook's election Lease: in dry runs, so that the suite's
	// webhook keeps its leadership whatever the outcome.
	election, err := admin.Get(ctx, "clipjob-claim-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the suite's webhook holds no election Lease: %v", err)
	}
	dry := []string{metav1.DryRunAll}
	taken := election.DeepCopy()
	taken.Spec.HolderIdentity = ptr.To("the-relay")
	_, err = asRelay.Update(ctx, taken, metav1.UpdateOptions{DryRun: dry})
	refused("updating the webhook's election Lease", err, "may update only", "Lease clipjob-claim-controller is not a relay Lease")
	err = asRelay.Delete(ctx, election.Name, metav1.DeleteOptions{DryRun: dry, Preconditions: &metav1.Preconditions{UID: &election.UID}})
	refused("deleting the webhook's election Lease", err, "may delete only", "Lease clipjob-claim-controller is not a relay Lease")

	// A Lease of someone else's, for real: the relay can neither take it
	// into its group nor delete it.
	other, err := admin.Create(ctx, lease("e2e-not-a-relay-lease", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	adopted := other.DeepCopy()
	adopted.Labels = map[string]string{replicas.LabelGroup: relayGroup}
	_, err = asRelay.Update(ctx, adopted, metav1.UpdateOptions{})
	refused("labeling another's Lease as its group's", err, "may update only", "Lease e2e-not-a-relay-lease is not a relay Lease")
	err = asRelay.Delete(ctx, other.Name, metav1.DeleteOptions{})
	refused("deleting another's Lease", err, "may delete only", "Lease e2e-not-a-relay-lease is not a relay Lease")
	if got, err := admin.Get(ctx, other.Name, metav1.GetOptions{}); err != nil || got.ResourceVersion != other.ResourceVersion {
		t.Errorf("the Lease %s the relay was refused is changed or gone: %v", other.Name, err)
	}

	// Its own Lease, as a relay writes it: created, renewed, deleted; but
	// not taken out of its group.
	own, err := asRelay.Create(ctx, lease(mine, map[string]string{replicas.LabelGroup: relayGroup}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the relay creating its own Lease %s: %v", mine, err)
	}
	own.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if own, err = asRelay.Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the relay renewing its own Lease %s: %v", mine, err)
	}
	out := own.DeepCopy()
	delete(out.Labels, replicas.LabelGroup)
	_, err = asRelay.Update(ctx, out, metav1.UpdateOptions{})
	refused("taking its own Lease out of its group", err, "Lease "+mine+" as written is not")
	if err := asRelay.Delete(ctx, mine, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &own.UID, ResourceVersion: &own.ResourceVersion}}); err != nil {
		t.Errorf("the relay deleting its own Lease %s: %v", mine, err)
	}
}

// applyRelayLeasePolicy creates the chart's relay Lease policy and its
// binding as the chart renders them for a relay on PostgreSQL.
func applyRelayLeasePolicy(ctx context.Context) error {
	r, err := renderRelayOnPostgres()
	if err != nil {
		return err
	}
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := r.Into("ValidatingAdmissionPolicy", relayLeasePolicy, &vap); err != nil {
		return err
	}
	if err := r.Into("ValidatingAdmissionPolicyBinding", relayLeasePolicy, &binding); err != nil {
		return err
	}
	ar := suite.cs.AdmissionregistrationV1()
	if _, err := ar.ValidatingAdmissionPolicies().Create(ctx, &vap, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err = ar.ValidatingAdmissionPolicyBindings().Create(ctx, &binding, metav1.CreateOptions{})
	return err
}

// deleteRelayLeasePolicy deletes the chart's relay Lease policy and its
// binding, if they exist.
func deleteRelayLeasePolicy(ctx context.Context) error {
	ar := suite.cs.AdmissionregistrationV1()
	if err := ar.ValidatingAdmissionPolicyBindings().Delete(ctx, relayLeasePolicy, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := ar.ValidatingAdmissionPolicies().Delete(ctx, relayLeasePolicy, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
