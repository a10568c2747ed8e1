package compile

import (
	"context"
	"encoding/json"
	"fmt"
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
	matcher  matchconditions.Matcher
	patchers []patch.Patcher
}

var (
	jobsGVR = schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	scheme  = runtime.NewScheme()
	_       = batchv1.AddToScheme(scheme)
)

// celCompiler is built once: the environment is most of a compile's time,
// and the compiler keeps no state between expressions but variables,
// which the compiled policies do not use.
var celCompiler = sync.OnceValues(func() (*plugincel.CompositedCompiler, error) {
	return plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
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

func compileEvaluator(p *admissionregistrationv1.MutatingAdmissionPolicy) (*evaluator, error) {
	compiler, err := celCompiler()
	if err != nil {
		return nil, err
	}
	opts := plugincel.OptionalVariableDeclarations{}
	var conds []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
	}
	filter := compiler.CompileCondition(conds, opts, environment.StoredExpressions)
	for _, r := range filter.CompilationErrors() {
		return nil, fmt.Errorf("match condition: %w", r)
	}
	e := &evaluator{matcher: matchconditions.NewMatcher(filter, p.Spec.FailurePolicy, "policy", "mutate", p.Name)}
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
	ctx := context.Background()
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
