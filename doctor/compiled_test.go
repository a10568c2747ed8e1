package doctor

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/templates"
)

// The compiled-policies check: with compiledPolicies on, every policy the
// source and config compile to must be there, current and bound; with it
// off, its namespace's may not be left, and another release's is not its
// concern.
func TestCompiledPoliciesAreChecked(t *testing.T) {
	fx := golden.Case(t, "profile-claude_local")
	inh, err := templates.InheritFromDeployment(fx.Source, fx.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	compiled, err := compile.Mutating(compile.Input{Namespace: fx.Config.Source.Namespace, Inherited: inh, Config: fx.Config})
	if err != nil {
		t.Fatal(err)
	}
	check := func(on bool, edit func(cs *fake.Clientset)) map[string]Result {
		t.Helper()
		cs := fake.NewClientset()
		ctx := context.Background()
		for _, p := range compiled {
			if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, p.Policy, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, p.Binding, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if edit != nil {
			edit(cs)
		}
		rendered, err := charts.Render(release, map[string]any{"compiledPolicies": map[string]any{"enabled": on}})
		if err != nil {
			t.Fatal(err)
		}
		d := &doctor{cs: cs, o: Options{Release: release}, rendered: rendered}
		d.compiledPolicies(ctx, fx.Config, inh)
		results := map[string]Result{}
		for _, r := range d.results {
			results[r.Check] = r
		}
		return results
	}
	ar := func(cs *fake.Clientset) (policies, bindings interface {
		Delete(context.Context, string, metav1.DeleteOptions) error
	}) {
		return cs.AdmissionregistrationV1().MutatingAdmissionPolicies(), cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings()
	}
	first := compiled[0].Policy.Name

	want1 := func(r map[string]Result, ok bool, words ...string) {
		t.Helper()
		want(t, r, "compiled-policies", ok, words...)
	}
	want1(check(true, nil), true, "policies for namespace paperclip, current with paperclip/paperclip")
	want1(check(true, func(cs *fake.Clientset) {
		p, _ := ar(cs)
		_ = p.Delete(context.Background(), first, metav1.DeleteOptions{})
	}), false, first, "not found", "elected webhook replica")
	want1(check(true, func(cs *fake.Clientset) {
		_, b := ar(cs)
		_ = b.Delete(context.Background(), first, metav1.DeleteOptions{})
	}), false, "binding "+first)
	want1(check(true, func(cs *fake.Clientset) {
		c := cs.AdmissionregistrationV1().MutatingAdmissionPolicies()
		p, _ := c.Get(context.Background(), first, metav1.GetOptions{})
		p.Spec.Mutations[0].JSONPatch.Expression = "[]"
		if _, err := c.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}), false, first+" is stale")
	// The patch reads its long values from variables: an edited one is
	// as stale as an edited patch.
	want1(check(true, func(cs *fake.Clientset) {
		c := cs.AdmissionregistrationV1().MutatingAdmissionPolicies()
		p, _ := c.Get(context.Background(), first, metav1.GetOptions{})
		if len(p.Spec.Variables) == 0 {
			t.Fatal("the compiled policy has no variables")
		}
		p.Spec.Variables[0].Expression = "dyn([])"
		if _, err := c.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}), false, first+" is stale")
	want1(check(false, nil), false, "compiledPolicies is off", "kubectl delete mutatingadmissionpolicybinding,mutatingadmissionpolicy "+first)
	// Another release's policy, for the namespace it serves, is not this
	// release's to report.
	other, err := compile.Mutating(compile.Input{Namespace: "other-agents", Inherited: inh, Config: fx.Config})
	if err != nil {
		t.Fatal(err)
	}
	othersOnly := check(false, func(cs *fake.Clientset) {
		for _, p := range compiled {
			pol, b := ar(cs)
			_ = pol.Delete(context.Background(), p.Policy.Name, metav1.DeleteOptions{})
			_ = b.Delete(context.Background(), p.Binding.Name, metav1.DeleteOptions{})
		}
		for _, p := range other {
			if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(context.Background(), p.Policy, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})
	if r, found := othersOnly["compiled-policies"]; found {
		t.Errorf("compiledPolicies off, only another release's policy (%s) there: reported %+v", other[0].Policy.Name, r)
	}
	off := check(false, func(cs *fake.Clientset) {
		for _, p := range compiled {
			pol, b := ar(cs)
			_ = pol.Delete(context.Background(), p.Policy.Name, metav1.DeleteOptions{})
			_ = b.Delete(context.Background(), p.Binding.Name, metav1.DeleteOptions{})
		}
	})
	if r, found := off["compiled-policies"]; found {
		t.Errorf("compiledPolicies off and none left: reported %+v", r)
	}
}
