package admissionpolicies

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

type staticConfigs struct{ cfg *config.Config }

func (s *staticConfigs) Current() *config.Config { return s.cfg }

// source answers with inh (the same pointer while unchanged, as the
// webhook's source cache does) or err.
type source struct {
	inh *templates.Inherited
	err error
}

func (s *source) Inherited(context.Context, *config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
	return s.inh, nil, s.err
}

func setup(t *testing.T) (*Syncer, *fake.Clientset, *source, *staticConfigs) {
	t.Helper()
	fx := golden.Case(t, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(fx.Source, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	src, cfgs := &source{inh: inh}, &staticConfigs{cfg: fx.Config}
	return &Syncer{Client: cs.AdmissionregistrationV1(), Configs: cfgs, Sources: src, Log: logr.Discard()}, cs, src, cfgs
}

func names(t *testing.T, cs *fake.Clientset) (policies, bindings []string) {
	t.Helper()
	ps, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps.Items {
		policies = append(policies, p.Name)
	}
	bs, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs.Items {
		bindings = append(bindings, b.Name)
	}
	slices.Sort(policies)
	slices.Sort(bindings)
	return policies, bindings
}

func writes(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		switch a.GetVerb() {
		case "create", "update", "delete":
			n++
		}
	}
	return n
}

// The syncer writes what the compiler gives, once: a second sync with
// nothing changed writes nothing.
func TestSyncWritesThePoliciesOnce(t *testing.T) {
	s, cs, src, cfgs := setup(t)
	ctx := context.Background()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	want, err := compile.Mutating(compile.Input{Namespace: cfgs.cfg.Source.Namespace, Inherited: src.inh, Config: cfgs.cfg})
	if err != nil {
		t.Fatal(err)
	}
	policies, bindings := names(t, cs)
	if len(policies) != len(want) || !slices.Equal(policies, bindings) {
		t.Fatalf("policies %v, bindings %v; want one of each for %d profiles", policies, bindings, len(want))
	}
	p, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, want[0].Policy.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Mutations[0].JSONPatch.Expression != want[0].Policy.Spec.Mutations[0].JSONPatch.Expression || p.Annotations[SpecHashAnnotation] == "" {
		t.Fatal("the stored policy is not the compiled one, or carries no spec hash")
	}
	before := writes(cs)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if after := writes(cs); after != before {
		t.Fatalf("a sync with nothing changed wrote %d times", after-before)
	}
}

// A policy someone else changed or deleted is written back; one of the
// syncer's that is no longer wanted (another namespace's) is deleted; one
// that is not the syncer's is left alone.
func TestSyncRestoresWhatOthersChanged(t *testing.T) {
	s, cs, _, _ := setup(t)
	ctx := context.Background()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	policies, _ := names(t, cs)
	c := cs.AdmissionregistrationV1().MutatingAdmissionPolicies()
	edited, err := c.Get(ctx, policies[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	original := edited.Spec.Mutations[0].JSONPatch.Expression
	edited.Spec.Mutations[0].JSONPatch.Expression = `[JSONPatch{op: "add", path: "/spec/template/spec/hostNetwork", value: true}]`
	if _, err := c.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Delete(ctx, policies[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: compile.PolicyName("a-namespace-no-longer-the-source"),
		Labels: map[string]string{compile.ManagedByLabel: compile.ManagedBy}}}
	foreign := &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}}
	for _, p := range []*admissionregistrationv1.MutatingAdmissionPolicy{stale, foreign} {
		if _, err := c.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, policies[0], metav1.GetOptions{})
	if err != nil || got.Spec.Mutations[0].JSONPatch.Expression != original {
		t.Fatalf("an edited policy was not written back (%v)", err)
	}
	// The patch reads its long values (the container among them) from the
	// policy's variables: a variable edited alone is written back too.
	if len(got.Spec.Variables) == 0 {
		t.Fatal("the compiled policy has no variables")
	}
	originalVar := got.Spec.Variables[0]
	got.Spec.Variables[0].Expression = `dyn([{"name": "agent", "image": "attacker.example/agent"}])`
	// And its reinvocation policy (required, never defaulted).
	got.Spec.ReinvocationPolicy = admissionregistrationv1.NeverReinvocationPolicy
	if _, err := c.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err = c.Get(ctx, policies[0], metav1.GetOptions{}); err != nil || got.Spec.Variables[0] != originalVar {
		t.Errorf("an edited variable was not written back (%v)", err)
	}
	if err == nil && got.Spec.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Errorf("an edited reinvocation policy was not written back: %s", got.Spec.ReinvocationPolicy)
	}
	after, bindings := names(t, cs)
	if !slices.Contains(bindings, policies[0]) {
		t.Error("a deleted binding was not written back")
	}
	if slices.Contains(after, stale.Name) {
		t.Error("the syncer's policy of a profile that is gone was kept")
	}
	if !slices.Contains(after, foreign.Name) {
		t.Error("a policy that is not the syncer's was deleted")
	}
}

// A change of the source (a new revision: a new pointer from the cache)
// or the config is compiled and written; without a source, or when the
// compiler cannot follow the render, the syncer's policies go and the
// error says the mutating webhook answers alone.
func TestSyncFollowsTheSourceAndRemovesWhatItCannotCompile(t *testing.T) {
	s, cs, src, _ := setup(t)
	ctx := context.Background()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	next := *src.inh
	next.Image = "ghcr.io/paperclipai/paperclip:v2026.12.0"
	next.Revision = "generation 9"
	src.inh = &next
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	policies, _ := names(t, cs)
	p, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, policies[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Spec.Mutations[0].JSONPatch.Expression, "generation 9") {
		t.Error("the policy was not recompiled for the new source revision")
	}

	src.err = &templates.SourceError{Source: "paperclip/paperclip", Reason: "not found"}
	err = s.Sync(ctx)
	if err == nil || !strings.Contains(err.Error(), "the mutating webhook completes agent Jobs alone") {
		t.Fatalf("error %v: want one saying the webhook answers alone", err)
	}
	if policies, bindings := names(t, cs); len(policies)+len(bindings) != 0 {
		t.Fatalf("with no source, policies %v and bindings %v were kept", policies, bindings)
	}
	src.err = nil
	tenant := templates.TenantInherited(config.Source{Namespace: "paperclip", Deployment: "paperclip"})
	src.inh = tenant
	if err := s.Sync(ctx); err == nil {
		t.Fatal("a source the compiler refuses gave no error")
	}
}

// Two installations of clipjob in one cluster, each syncing its own
// source namespace: neither deletes the other's policies, and one with
// no source left deletes only its own. A policy written before owners
// (no owner label), of a namespace neither syncs, is left alone.
func TestSyncersOfTwoInstallationsKeepEachOthersPolicies(t *testing.T) {
	ctx := context.Background()
	a, cs, srcA, cfgsA := setup(t)
	a.Owner = "clipjob-a"
	cfgB := *cfgsA.cfg
	cfgB.Source.Namespace = "paperclip-b"
	srcB := &source{inh: srcA.inh}
	b := &Syncer{Client: cs.AdmissionregistrationV1(), Configs: &staticConfigs{cfg: &cfgB}, Sources: srcB, Owner: "clipjob-b", Log: logr.Discard()}
	legacy := &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: compile.PolicyName("gone"),
		Labels: map[string]string{compile.ManagedByLabel: compile.ManagedBy}}}
	if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, s := range []*Syncer{a, b} {
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	mine := []string{compile.PolicyName(cfgsA.cfg.Source.Namespace), compile.PolicyName("paperclip-b")}
	want := append([]string{legacy.Name}, mine...)
	slices.Sort(want)
	if policies, bindings := names(t, cs); !slices.Equal(policies, want) || !slices.Equal(bindings, mine) {
		t.Fatalf("policies %v, bindings %v; want each installation's and the one before owners, %v", policies, bindings, want)
	}
	p, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, compile.PolicyName("paperclip-b"), metav1.GetOptions{})
	if err != nil || p.Labels[OwnerLabel] != "clipjob-b" {
		t.Fatalf("the second installation's policy: owner %q (%v)", p.Labels[OwnerLabel], err)
	}
	srcB.err = &templates.SourceError{Source: "paperclip-b/paperclip", Reason: "not found"}
	_ = b.Sync(ctx)
	if policies, _ := names(t, cs); !slices.Equal(policies, []string{legacy.Name, compile.PolicyName(cfgsA.cfg.Source.Namespace)}) {
		t.Fatalf("with its source gone the second installation left %v; want the first's alone", policies)
	}
}

// An API error is reported and the rest still synced.
func TestSyncReportsAPIErrors(t *testing.T) {
	s, cs, _, _ := setup(t)
	cs.PrependReactor("create", "mutatingadmissionpolicybindings", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcd is away")
	})
	err := s.Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "etcd is away") {
		t.Fatalf("error %v: want the API error", err)
	}
	if policies, _ := names(t, cs); len(policies) == 0 {
		t.Fatal("no policy written beside the failing bindings")
	}
}
