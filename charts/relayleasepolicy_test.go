package charts

import (
	"context"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	celtypes "github.com/google/cel-go/common/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/paperclipai/clipjob/relay/replicas"
)

// celExpression is one of a policy's expressions, with the type the
// API server wants of it.
type celExpression struct {
	name, expression string
	returns          *cel.Type
}

func (e celExpression) GetName() string          { return e.name }
func (e celExpression) GetExpression() string    { return e.expression }
func (e celExpression) ReturnTypes() []*cel.Type { return []*cel.Type{e.returns} }

// validatingPolicy is a ValidatingAdmissionPolicy compiled as the API
// server's admission plugin compiles it (k8s.io/apiserver's CEL
// environment, match conditions, variables, message expressions).
type validatingPolicy struct {
	matcher          matchconditions.Matcher
	checks, messages plugincel.ConditionEvaluator
}

func compileValidatingPolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) *validatingPolicy {
	t.Helper()
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	var vars []plugincel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		vars = append(vars, celExpression{v.Name, v.Expression, cel.AnyType})
	}
	compiler.CompileAndStoreVariables(vars, opts, environment.StoredExpressions)
	var conds, checks, messages []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
	}
	for _, v := range p.Spec.Validations {
		checks = append(checks, celExpression{"", v.Expression, cel.BoolType})
		messages = append(messages, celExpression{"", v.MessageExpression, cel.StringType})
	}
	vp := &validatingPolicy{checks: compiler.CompileCondition(checks, opts, environment.StoredExpressions),
		messages: compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, environment.StoredExpressions)}
	matcher := compiler.CompileCondition(conds, opts, environment.StoredExpressions)
	for _, f := range []plugincel.ConditionEvaluator{vp.checks, vp.messages, matcher} {
		for _, err := range f.CompilationErrors() {
			t.Fatalf("policy %s: %v", p.Name, err)
		}
	}
	vp.matcher = matchconditions.NewMatcher(matcher, p.Spec.FailurePolicy, "policy", "validate", p.Name)
	return vp
}

// refusals are the messages of the validations that refuse the request,
// in the policy's order; none when it admits it or does not match it.
func (vp *validatingPolicy) refusals(t *testing.T, attrs admission.Attributes) []string {
	t.Helper()
	ctx := context.Background()
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: attrs.GetKind(), VersionedObject: admission.NewLazyObject(attrs.GetObject()), VersionedOldObject: admission.NewLazyObject(attrs.GetOldObject())}
	if m := vp.matcher.Match(ctx, va, nil, nil); m.Error != nil {
		t.Fatalf("match condition %s: %v", m.FailedConditionName, m.Error)
	} else if !m.Matches {
		return nil
	}
	req := plugincel.CreateAdmissionRequest(attrs, metav1.GroupVersionResource(attrs.GetResource()), metav1.GroupVersionKind(attrs.GetKind()))
	results, budget, err := vp.checks.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatal(err)
	}
	messages, _, err := vp.messages.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{}, nil, budget)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, r := range results {
		if r.Error != nil {
			t.Fatalf("validation %d: %v", i, r.Error)
		}
		if r.EvalResult != celtypes.True {
			if messages[i].Error != nil {
				t.Fatalf("message %d: %v", i, messages[i].Error)
			}
			out = append(out, messages[i].EvalResult.Value().(string))
		}
	}
	return out
}

// TestRelayLeasePolicyDecides: the relay Lease policy as the API server
// would run it. The relay's ServiceAccount may create, renew and delete
// its group's Leases, including a killed replica's; it is refused any
// other Lease (the webhook's election Lease, an unlabeled one, another
// group's, one of its label not named for the group) and taking its own
// out of the group, with a message naming the label, the name and the
// flag. Anyone else's requests are not the policy's.
func TestRelayLeasePolicyDecides(t *testing.T) {
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	into(t, render(t, relayStores["relay on postgres, existing secret"]), "ValidatingAdmissionPolicy", "clipjob-relay-leases", &vap)
	policy := compileValidatingPolicy(t, &vap)
	const relaySA = "system:serviceaccount:clipjob-system:clipjob-relay"
	group := map[string]string{replicas.LabelGroup: "clipjob-relay"}
	lease := func(name string, labels map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "clipjob-system", Labels: labels}}
	}
	own, election := lease(replicas.LeaseName("clipjob-relay", "clipjob-relay-7d9f-x2"), group), lease("clipjob-claim-controller", nil)
	for _, tc := range []struct {
		name     string
		user     string
		op       admission.Operation
		obj, old *coordinationv1.Lease
		refusal  string // "" when admitted
	}{
		{"creates its own", relaySA, admission.Create, own, nil, ""},
		{"renews its own", relaySA, admission.Update, own, own, ""},
		{"deletes its own or a killed replica's", relaySA, admission.Delete, nil, own, ""},
		{"updates the election Lease", relaySA, admission.Update, election, election,
			"the relay may update only Leases labeled clipjob.paperclip.io/relay-group=clipjob-relay and named clipjob-relay.<replica id>: Lease clipjob-claim-controller is not a relay Lease of this release"},
		{"deletes the election Lease", relaySA, admission.Delete, nil, election, "the relay may delete only Leases"},
		{"labels the election Lease as its group's", relaySA, admission.Update, lease("clipjob-claim-controller", group), election, "may update only"},
		{"deletes another group's Lease", relaySA, admission.Delete, nil, lease("clipjob-relay.x", map[string]string{replicas.LabelGroup: "other"}), "may delete only"},
		{"creates an unlabeled Lease", relaySA, admission.Create, lease("clipjob-relay.x", nil), nil,
			"the relay may write only Leases labeled clipjob.paperclip.io/relay-group=clipjob-relay and named clipjob-relay.<replica id>: Lease clipjob-relay.x as written is not: run the relay with --lease-group=clipjob-relay"},
		// Group clipjob-relay-b of another release in this namespace names
		// its Leases clipjob-relay-b.<id>: before '.', clipjob-relay-b-<id>
		// began with this group's prefix (a hostile review).
		{"creates another group's Lease name with its own label", relaySA, admission.Create, lease(replicas.LeaseName("clipjob-relay-b", "x"), group), nil, "as written is not"},
		{"creates a Lease named as relays before '.' named theirs", relaySA, admission.Create, lease("clipjob-relay-x", group), nil, "as written is not"},
		{"renews a Lease named as before '.' (a rolling upgrade)", relaySA, admission.Update, lease("clipjob-relay-old-0", group), lease("clipjob-relay-old-0", group), ""},
		{"deletes a Lease named as before '.' long gone", relaySA, admission.Delete, nil, lease("clipjob-relay-old-0", group), ""},
		{"creates a Lease of its label not named for the group", relaySA, admission.Create, lease("clipjob-claim-controller", group), nil, "Lease clipjob-claim-controller as written is not"},
		{"creates a Lease named for the group with another's label", relaySA, admission.Create, lease("clipjob-relay.x", map[string]string{replicas.LabelGroup: "clipjob"}), nil, "as written is not"},
		{"takes its own out of the group", relaySA, admission.Update, lease(own.Name, nil), own, "Lease " + own.Name + " as written is not"},
		{"the webhook updates the election Lease", "system:serviceaccount:clipjob-system:clipjob-webhook", admission.Update, election, election, ""},
		{"another relay release's account deletes it", "system:serviceaccount:other:clipjob-relay", admission.Delete, nil, election, ""},
	} {
		var obj, old runtime.Object
		if tc.obj != nil {
			obj = tc.obj
		}
		if tc.old != nil {
			old = tc.old
		}
		name := election.Name
		if tc.old != nil {
			name = tc.old.Name
		} else if tc.obj != nil {
			name = tc.obj.Name
		}
		kind := coordinationv1.SchemeGroupVersion.WithKind("Lease")
		denied := policy.refusals(t, admission.NewAttributesRecord(obj, old, kind, "clipjob-system", name, coordinationv1.SchemeGroupVersion.WithResource("leases"), "", tc.op,
			nil, false, &user.DefaultInfo{Name: tc.user}))
		switch {
		case tc.refusal == "" && len(denied) > 0:
			t.Errorf("%s: refused: %v", tc.name, denied)
		case tc.refusal != "" && (len(denied) == 0 || !strings.Contains(denied[0], tc.refusal)):
			t.Errorf("%s: want the first refusal to say %q, got %v", tc.name, tc.refusal, denied)
		}
	}
}
