package compile

import (
	"context"
	"encoding/json"
	"fmt"
	celgo "github.com/google/cel-go/cel"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

// evaluator runs a MutatingAdmissionPolicy the way the API server's
// admission plugin does (the same CEL environment, match conditions and
// JSONPatch patcher from k8s.io/apiserver), in process.
type evaluator struct {
	compiler *plugincel.CompositedCompiler
	matcher  matchconditions.Matcher
	patchers []patch.Patcher
}

var (
	jobsGVR = schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	scheme  = runtime.NewScheme()
	_       = batchv1.AddToScheme(scheme)
)

// baseEnv is built once: it is most of a small policy's compile.
var baseEnv = sync.OnceValue(func() *environment.EnvSet {
	return environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
})

// evaluators caches compiled policies by their spec: fixtures share
// configs, and type-checking a policy is most of a test's time.
var evaluators sync.Map

func newEvaluator(p *admissionregistrationv1.MutatingAdmissionPolicy) (*evaluator, error) {
	key, err := json.Marshal(p.Spec)
	if err != nil {
		return nil, err
	}
	if e, ok := evaluators.Load(string(key)); ok {
		return e.(*evaluator), nil
	}
	e, err := compileEvaluator(p)
	if err == nil {
		evaluators.Store(string(key), e)
	}
	return e, err
}

// compileEvaluator compiles p as the API server's mutating admission
// plugin does (compilePolicy in k8s.io/apiserver's policy/mutating): its
// variables, in order, then its match conditions and mutations, in one
// composited compiler of the policy's own.
func compileEvaluator(p *admissionregistrationv1.MutatingAdmissionPolicy) (*evaluator, error) {
	compiler, err := plugincel.NewCompositedCompiler(baseEnv())
	if err != nil {
		return nil, err
	}
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	for _, v := range p.Spec.Variables {
		r := compiler.CompileAndStoreVariable(variable(v), opts, environment.StoredExpressions)
		if r.Error != nil {
			return nil, fmt.Errorf("variable %s: %w", v.Name, r.Error)
		}
	}
	var conds []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
	}
	filter := compiler.CompileCondition(conds, opts, environment.StoredExpressions)
	for _, r := range filter.CompilationErrors() {
		return nil, fmt.Errorf("match condition: %w", r)
	}
	e := &evaluator{compiler: compiler, matcher: matchconditions.NewMatcher(filter, p.Spec.FailurePolicy, "policy", "mutate", p.Name)}
	opts.HasPatchTypes = true
	for _, m := range p.Spec.Mutations {
		if m.PatchType != admissionregistrationv1.PatchTypeJSONPatch {
			return nil, fmt.Errorf("mutation of type %s: the compiler writes JSONPatch only", m.PatchType)
		}
		ev := compiler.CompileMutatingEvaluator(&patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}, opts, environment.StoredExpressions)
		if ev.CompilationErrors() != nil {
			return nil, fmt.Errorf("mutation: %v", ev.CompilationErrors())
		}
		e.patchers = append(e.patchers, patch.NewJSONPatcher(ev))
	}
	return e, nil
}

// variable is a policy variable as the API server's compiler takes it
// (validating.Variable there, whose package this module does not build).
type variable admissionregistrationv1.Variable

func (v variable) GetName() string       { return v.Name }
func (v variable) GetExpression() string { return v.Expression }
func (v variable) ReturnTypes() []*celgo.Type {
	return []*celgo.Type{celgo.AnyType, celgo.DynType}
}

// mutate admits a CREATE of job by username: the policy's result, and
// whether its match conditions chose the Job at all.
func (e *evaluator) mutate(job *batchv1.Job, username string) (*batchv1.Job, bool, error) {
	gvk := batchv1.SchemeGroupVersion.WithKind("Job")
	var obj runtime.Object = job.DeepCopy()
	attrs := func(obj runtime.Object) *admission.VersionedAttributes {
		rec := admission.NewAttributesRecord(obj, nil, gvk, job.Namespace, job.Name, jobsGVR, "", admission.Create,
			&metav1.CreateOptions{}, false, &user.DefaultInfo{Name: username})
		return &admission.VersionedAttributes{Attributes: rec, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(obj)}
	}
	// One context per admission, as the API server's dispatcher makes.
	var ctx context.Context = e.compiler.CreateContext(context.Background())
	m := e.matcher.Match(ctx, attrs(obj), nil, nil)
	if m.Error != nil {
		return nil, false, fmt.Errorf("match condition %s: %w", m.FailedConditionName, m.Error)
	}
	if !m.Matches {
		return job, false, nil
	}
	for _, p := range e.patchers {
		out, err := p.Patch(ctx, patch.Request{
			MatchedResource:     jobsGVR,
			VersionedAttributes: attrs(obj),
			ObjectInterfaces:    admission.NewObjectInterfacesFromScheme(scheme),
		}, celconfig.RuntimeCELCostBudget)
		if err != nil {
			return nil, true, err
		}
		obj = out
	}
	return obj.(*batchv1.Job), true, nil
}
