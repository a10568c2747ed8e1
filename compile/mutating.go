package compile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/templates"
)

// Input is what one namespace's policies are compiled from: what the
// mutating webhook renders that namespace's Jobs with.
type Input struct {
	// Namespace is the agent namespace the policies bind to.
	Namespace string
	Inherited *templates.Inherited
	Config    *config.Config
}

// Policy is one compiled MutatingAdmissionPolicy and the binding that
// applies it to its namespace.
type Policy struct {
	// Profiles are the profiles it completes Jobs of.
	Profiles []string
	Policy   *admissionregistrationv1.MutatingAdmissionPolicy
	Binding  *admissionregistrationv1.MutatingAdmissionPolicyBinding
}

// ManagedByLabel marks the objects the compiler makes, so whoever keeps
// them current finds its own.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// ManagedBy is ManagedByLabel's value.
const ManagedBy = "clipjob"

// Mutating compiles the MutatingAdmissionPolicy (with its binding) that
// completes a bare agent Job in in.Namespace exactly as templates.Render
// does, for every profile that runs a command: one policy, so the API
// server evaluates one set of match conditions per Job, and the Job's
// adapter type picks its profile's mutation. Its domain (the matchConditions)
// is the bare Jobs clients send: no containers or volumes of their own,
// run values Render accepts. Any other agent Job is left to the webhook.
// The result is a list so that a later compiler may split the work.
func Mutating(in Input) ([]Policy, error) {
	if in.Inherited.Tenant {
		return nil, errors.New("compile: a tenant namespace inherits nothing; its Jobs bring their own containers and are the webhook's")
	}
	var profiles []compiledProfile
	for _, name := range in.Config.ProfileNames() {
		prof, _ := in.Config.Profile(name)
		if len(prof.Command) == 0 {
			continue // a bare Job of this profile is refused: the webhook's
		}
		// p<index> first: a CEL identifier starts with a letter, and a
		// profile's name may not.
		p, err := compileProfile(in, prof, fmt.Sprintf("p%d_%s_", len(profiles), variableName(name)))
		if err != nil {
			return nil, fmt.Errorf("compile: profile %s: %w", name, err)
		}
		profiles = append(profiles, p)
	}
	if len(profiles) == 0 {
		return nil, nil
	}
	return []Policy{policy(in, profiles)}, nil
}

// PolicyName is the name of a namespace's policy and binding
// (cluster-scoped objects: the namespace is in the name).
func PolicyName(namespace string) string { return "clipjob-render." + namespace }

// compiledProfile is one profile's part of the policy: the adapter types
// that select it (CEL literals), its patch and the variables the patch
// reads.
type compiledProfile struct {
	name   string
	types  []string
	ops    string
	vars   []admissionregistrationv1.Variable
	source string
}

// compiler holds one profile's probe renders, as JSON.
type compiler struct {
	in   Input
	prof config.Resolved
	fs   []*feature
	// full is the render with every feature; without[f] with all but f;
	// secret with the prompt from a Secret instead of the annotation.
	full, secret map[string]any
	without      map[*feature]map[string]any
	subst        map[string]string
	probe        map[string]any
	// vars are the policy variables the patch reads (hoist), named
	// varPrefix + what they hold.
	vars      []admissionregistrationv1.Variable
	varPrefix string
}

// hoistAbove is the length of CEL above which a value becomes a policy
// variable (hoist).
const hoistAbove = 200

// hoist returns expr, or a reference to a policy variable holding it when
// it is long. The API server type-checks each expression on its own, and
// cel-go's checker copies every type substitution made so far in an
// expression at each call and literal entry it checks: the time and
// memory of a check grow with the square of its size. Profiles' patches
// of one expression took the API server 1.6 s and 1.1 GB to check (per
// policy change, per API server); in variables of a few hundred
// characters each the check is linear (BenchmarkTypeCheck). A variable is
// evaluated lazily, against the same object as the mutation reading it.
func (c *compiler) hoist(what, expr string) string {
	if len(expr) <= hoistAbove {
		return expr
	}
	name := c.varPrefix + what
	c.vars = append(c.vars, admissionregistrationv1.Variable{Name: name, Expression: expr})
	return "variables." + name
}

func compileProfile(in Input, prof config.Resolved, varPrefix string) (compiledProfile, error) {
	c := &compiler{in: in, prof: prof, fs: features(in.Inherited.DataMountPath, in.Config), without: map[*feature]map[string]any{}, varPrefix: varPrefix}
	c.subst = map[string]string{creatorSentinel: "request.userInfo.username"}
	for _, f := range c.fs {
		maps.Copy(c.subst, f.subst)
	}
	maps.Copy(c.subst, promptSecretSubst())
	var err error
	probe := c.probeJob(nil, nil)
	if c.probe, err = toJSON(probe); err != nil {
		return compiledProfile{}, err
	}
	if c.full, err = c.render(c.probeJob(nil, nil)); err != nil {
		return compiledProfile{}, err
	}
	if c.secret, err = c.render(c.probeJob(nil, setPromptSecret)); err != nil {
		return compiledProfile{}, err
	}
	for _, f := range c.fs {
		if f.required {
			c.without[f] = c.full // no Job without it is the policy's
			continue
		}
		if c.without[f], err = c.render(c.probeJob(f, nil)); err != nil {
			return compiledProfile{}, err
		}
		for s := range f.subst {
			if strings.Contains(mustMarshal(c.without[f]), s) {
				return compiledProfile{}, fmt.Errorf("the render without %s still holds its sentinel %q: it cannot be told from the request's value", f.name, s)
			}
		}
	}
	ops, err := c.operations()
	if err != nil {
		return compiledProfile{}, err
	}
	expr := strings.Join(ops, " +\n")
	for s := range c.subst {
		if strings.Contains(expr, s) || slices.ContainsFunc(c.vars, func(v admissionregistrationv1.Variable) bool { return strings.Contains(v.Expression, s) }) {
			return compiledProfile{}, fmt.Errorf("sentinel %q is left in the policy: Render put it inside a longer value", s)
		}
	}
	source, _ := asMap(at(c.full, "metadata", "annotations"))[contract.AnnotationSource].(string)
	return compiledProfile{name: prof.Name, types: c.adapterTypes(), ops: expr, vars: c.vars, source: source}, nil
}

// probeJob is a bare Job of the profile with every feature but skip, the
// last changed by alter.
func (c *compiler) probeJob(skip *feature, alter func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: c.in.Namespace,
			Labels:      map[string]string{contract.LabelAgentID: "", contract.LabelAdapterType: c.prof.Name},
			Annotations: map[string]string{}},
	}
	j.Spec.Template.Annotations = map[string]string{}
	for _, f := range c.fs {
		if f != skip {
			f.set(j)
		}
	}
	if alter != nil {
		alter(j)
	}
	return j
}

func (c *compiler) render(j *batchv1.Job) (map[string]any, error) {
	res, err := templates.Render(templates.Input{Job: j, Inherited: c.in.Inherited, Config: c.in.Config, Creator: creatorSentinel})
	if err != nil {
		return nil, fmt.Errorf("rendering the probe Job: %w", err)
	}
	return toJSON(res.Job)
}

func toJSON(v any) (map[string]any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var out map[string]any
	return out, d.Decode(&out)
}

func mustMarshal(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // decoded JSON; cannot fail
	}
	return string(data)
}

// at walks a decoded JSON tree; missing is nil.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// operations is the JSONPatch of the policy, as CEL list expressions to
// concatenate, in the order they apply.
func (c *compiler) operations() ([]string, error) {
	var ops []string
	ops = append(ops, c.annotationOps()...)
	labels, err := c.labelOps()
	if err != nil {
		return nil, err
	}
	ops = append(ops, labels...)
	pod, err := c.podOps()
	if err != nil {
		return nil, err
	}
	ops = append(ops, pod...)
	job, err := c.jobSpecOps()
	if err != nil {
		return nil, err
	}
	return append(ops, job...), nil
}

// annotationOps: a client's clipjob.paperclip.io/ annotations go, clipjob's
// own are written (the created-by one from the request's user).
func (c *compiler) annotationOps() []string {
	ops := []string{
		when("!has(object.metadata.annotations)", op("add", "/metadata/annotations", "{}")),
		fmt.Sprintf("(has(object.metadata.annotations) ? object.metadata.annotations.filter(k, k.startsWith(%s)).map(k, JSONPatch{op: \"remove\", path: \"/metadata/annotations/\" + jsonpatch.escapeKey(k)}) : [])",
			celString(contract.ClipjobPrefix)),
	}
	var add []string
	ann := asMap(at(c.full, "metadata", "annotations"))
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		if !strings.HasPrefix(k, contract.ClipjobPrefix) {
			continue
		}
		v, _ := literal(ann[k], c.subst)
		o := op("add", pointer("metadata", "annotations", k), v)
		if k == contract.AnnotationCreatedBy {
			ops = append(ops, when("request.userInfo.username != ''", o))
			continue
		}
		add = append(add, o)
	}
	return append(ops, "["+strings.Join(add, ", ")+"]")
}

// labelOps: the labels Render adds to the Job, and the pod template's
// labels: exactly the Job's paperclip.io/ ones, then clipjob's.
func (c *compiler) labelOps() ([]string, error) {
	var ops []string
	probeLabels := asMap(at(c.probe, "metadata", "labels"))
	full := asMap(at(c.full, "metadata", "labels"))
	for _, k := range slices.Sorted(maps.Keys(full)) {
		if _, ok := probeLabels[k]; ok {
			if probeLabels[k] != full[k] && c.subst[probeLabels[k].(string)] == "" {
				return nil, fmt.Errorf("render changes the Job's label %s, which the compiler does not follow", k)
			}
			continue
		}
		v, _ := literal(full[k], c.subst)
		ops = append(ops, "["+op("add", pointer("metadata", "labels", k), v)+"]")
	}
	prefix := celString(contract.Prefix)
	tpl := "object.spec.template.metadata.labels"
	ops = append(ops,
		when("!has("+tpl+")", op("add", "/spec/template/metadata/labels", "{}")),
		fmt.Sprintf("(has(%[1]s) ? %[1]s.filter(k, k.startsWith(%[2]s)).map(k, JSONPatch{op: \"remove\", path: \"/spec/template/metadata/labels/\" + jsonpatch.escapeKey(k)}) : [])", tpl, prefix),
		fmt.Sprintf("%[1]s.filter(k, k.startsWith(%[2]s)).map(k, JSONPatch{op: \"add\", path: \"/spec/template/metadata/labels/\" + jsonpatch.escapeKey(k), value: %[1]s[k]})", labelsExpr, prefix),
	)
	tplLabels := asMap(at(c.full, "spec", "template", "metadata", "labels"))
	for _, k := range slices.Sorted(maps.Keys(tplLabels)) {
		if _, copied := probeLabels[k]; copied {
			continue
		}
		if !strings.HasPrefix(k, contract.Prefix) {
			return nil, fmt.Errorf("render adds pod label %s, which the compiler does not follow", k)
		}
		v, _ := literal(tplLabels[k], c.subst)
		ops = append(ops, "["+op("add", pointer("spec", "template", "metadata", "labels", k), v)+"]")
	}
	return ops, nil
}

// Pod spec fields Render sets whatever a bare Job holds (the domain
// admits none of them but an empty securityContext and a default DNS
// policy), and the one it keeps when the client chose it.
var (
	podAlways = []string{"containers", "volumes", "imagePullSecrets", "dnsPolicy", "dnsConfig", "securityContext",
		"serviceAccountName", "automountServiceAccountToken", "nodeSelector", "tolerations", "runtimeClassName"}
	podKept = map[string]string{"restartPolicy": "!(has(object.spec.template.spec.restartPolicy) && object.spec.template.spec.restartPolicy == 'OnFailure')"}
)

func (c *compiler) podOps() ([]string, error) {
	spec := asMap(at(c.full, "spec", "template", "spec"))
	var ops []string
	for _, k := range slices.Sorted(maps.Keys(spec)) {
		var value string
		var err error
		switch {
		case k == "containers":
			value, err = c.containers()
		case k == "volumes":
			value, err = c.list([]any{"spec", "template", "spec", "volumes"}, "name")
		case slices.Contains(podAlways, k) || podKept[k] != "":
			value, err = c.value([]any{"spec", "template", "spec", k})
		default:
			return nil, fmt.Errorf("render sets the pod's %s, which the compiler does not follow", k)
		}
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", k, err)
		}
		o := op("add", pointer("spec", "template", "spec", k), c.hoist("pod_"+variableName(k), value))
		if cond := podKept[k]; cond != "" {
			ops = append(ops, when(cond, o))
		} else {
			ops = append(ops, "["+o+"]")
		}
	}
	return ops, nil
}

// Job spec fields Render sets always, and those it sets only when the
// client left them unset (backoffLimit: or at the API server's default).
var (
	jobAlways = []string{"parallelism", "completions", "podReplacementPolicy", "suspend"}
	jobUnset  = map[string]string{
		"backoffLimit":            "!has(object.spec.backoffLimit) || object.spec.backoffLimit == 6",
		"ttlSecondsAfterFinished": "!has(object.spec.ttlSecondsAfterFinished)",
		"activeDeadlineSeconds":   "!has(object.spec.activeDeadlineSeconds)",
	}
)

func (c *compiler) jobSpecOps() ([]string, error) {
	spec := asMap(at(c.full, "spec"))
	var ops []string
	for _, k := range slices.Sorted(maps.Keys(spec)) {
		if k == "template" {
			continue
		}
		if !slices.Contains(jobAlways, k) && jobUnset[k] == "" {
			return nil, fmt.Errorf("render sets the Job's %s, which the compiler does not follow", k)
		}
		value, err := c.value([]any{"spec", k})
		if err != nil {
			return nil, err
		}
		o := op("add", pointer("spec", k), value)
		if cond := jobUnset[k]; cond != "" {
			ops = append(ops, when(cond, o))
		} else {
			ops = append(ops, "["+o+"]")
		}
	}
	return ops, nil
}

// containers is the pod's one container: the profile's, with what each
// feature changes in it guarded by that feature.
func (c *compiler) containers() (string, error) {
	if n := len(at(c.full, "spec", "template", "spec", "containers").([]any)); n != 1 {
		return "", fmt.Errorf("a bare Job renders to %d containers, want 1", n)
	}
	base := []any{"spec", "template", "spec", "containers", 0}
	keys := map[string]bool{}
	for _, r := range c.renders() {
		for k := range asMap(at(r, base...)) {
			keys[k] = true
		}
	}
	var fields []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		var v string
		var err error
		if key, ok := listKeys[k]; ok {
			v, err = c.list(append(slices.Clone(base), k), key)
		} else {
			v, err = c.value(append(slices.Clone(base), k))
		}
		if err != nil {
			return "", fmt.Errorf("container %s: %w", k, err)
		}
		fields = append(fields, fmt.Sprintf("%s: %s", celString(k), c.hoist("container_"+variableName(k), "dyn("+v+")")))
	}
	return "[dyn({" + strings.Join(fields, ", ") + "})]", nil
}

// listKeys: the container's lists whose elements a feature adds or
// changes one by one, and what tells their elements apart.
var listKeys = map[string]string{"env": "name", "envFrom": "", "volumeMounts": "mountPath"}

func (c *compiler) renders() []map[string]any {
	out := []map[string]any{c.full, c.secret}
	for _, f := range c.fs {
		out = append(out, c.without[f])
	}
	return out
}

// promptFeature is the feature whose alternative render is c.secret.
func (c *compiler) promptFeature() *feature { return c.fs[len(c.fs)-1] }

// value is the field at path: a constant, or, when one feature changes it,
// that feature's value under its condition. A field no render holds is
// absent (an add of null is never written: the caller only asks for
// fields of the full render).
func (c *compiler) value(path []any) (string, error) {
	full := at(c.full, path...)
	var by []*feature
	for _, f := range c.fs {
		if !reflect.DeepEqual(at(c.without[f], path...), full) {
			by = append(by, f)
		}
	}
	secretDiffers := !reflect.DeepEqual(at(c.secret, path...), full)
	switch {
	case len(by) == 0 && !secretDiffers:
		return literal(full, c.subst)
	case len(by) == 1 && (!secretDiffers || by[0] == c.promptFeature()):
		f := by[0]
		present, err := c.presentValue(f, full, at(c.secret, path...), secretDiffers)
		if err != nil {
			return "", err
		}
		if at(c.without[f], path...) == nil {
			return "", fmt.Errorf("%v is set only with %s; a field cannot be left out by the patch", path, f.name)
		}
		absent, err := literal(at(c.without[f], path...), c.subst)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("(%s ? %s : %s)", f.present, present, absent), nil
	}
	return "", fmt.Errorf("%v depends on more than one feature (%d), which the compiler does not follow", path, len(by))
}

// presentValue is a feature's value when present: for the prompt, the
// inline one or the Secret's, by the annotation the request carries.
func (c *compiler) presentValue(f *feature, full, secret any, secretDiffers bool) (string, error) {
	v, err := literal(full, c.subst)
	if err != nil || !secretDiffers {
		return v, err
	}
	s, err := literal(secret, c.subst)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("(%s ? %s : %s)", hasTplAnnotation(contract.AnnotationPrompt), v, s), nil
}

// list is the list at path, element by element: those no feature changes
// as constants, each other one under its feature's condition. A feature
// adds an element or changes one; it never removes one, nor reorders.
func (c *compiler) list(path []any, key string) (string, error) {
	keyOf := func(e any) string {
		if key == "" {
			return mustMarshal(e)
		}
		return mustMarshal(asMap(e)[key])
	}
	index := func(r map[string]any) (map[string]any, []string) {
		m := map[string]any{}
		var order []string
		l, _ := at(r, path...).([]any)
		for _, e := range l {
			m[keyOf(e)] = e
			order = append(order, keyOf(e))
		}
		return m, order
	}
	full, order := index(c.full)
	secret, _ := index(c.secret)
	without := map[*feature]map[string]any{}
	for _, f := range c.fs {
		m, o := index(c.without[f])
		without[f] = m
		if !isSubsequence(o, order) {
			return "", fmt.Errorf("%v without %s is not the full list less some elements", path, f.name)
		}
	}
	var parts, run []string
	flush := func() {
		if len(run) > 0 {
			parts = append(parts, "["+strings.Join(run, ", ")+"]")
			run = nil
		}
	}
	for _, k := range order {
		e := full[k]
		var by []*feature
		for _, f := range c.fs {
			if !reflect.DeepEqual(without[f][k], e) {
				by = append(by, f)
			}
		}
		secretDiffers := !reflect.DeepEqual(secret[k], e)
		if len(by) == 0 && !secretDiffers {
			v, err := literal(e, c.subst)
			if err != nil {
				return "", err
			}
			run = append(run, "dyn("+v+")")
			continue
		}
		if len(by) != 1 || (secretDiffers && by[0] != c.promptFeature()) {
			return "", fmt.Errorf("%v element %s depends on more than one feature", path, k)
		}
		f := by[0]
		present, err := c.presentValue(f, e, secret[k], secretDiffers)
		if err != nil {
			return "", err
		}
		absent := "[]"
		if alt, ok := without[f][k]; ok {
			v, err := literal(alt, c.subst)
			if err != nil {
				return "", err
			}
			absent = "[dyn(" + v + ")]"
		}
		flush()
		parts = append(parts, fmt.Sprintf("(%s ? [dyn(%s)] : %s)", f.present, present, absent))
	}
	flush()
	return celList(parts), nil
}

func isSubsequence(sub, of []string) bool {
	i := 0
	for _, s := range of {
		if i < len(sub) && sub[i] == s {
			i++
		}
	}
	return i == len(sub)
}

// policy is the namespace's policy: each profile's patch under the
// adapter types that select it.
func policy(in Input, profiles []compiledProfile) Policy {
	name := PolicyName(in.Namespace)
	labels := map[string]string{ManagedByLabel: ManagedBy}
	var expr strings.Builder
	var vars []admissionregistrationv1.Variable
	var names, all []string
	for _, p := range profiles {
		fmt.Fprintf(&expr, "%s in [%s] ? (\n%s\n) :\n", adapterType, strings.Join(p.types, ", "), p.ops)
		vars = append(vars, p.vars...)
		names = append(names, p.name)
		all = append(all, p.types...)
	}
	expr.WriteString("[]")
	return Policy{
		Profiles: names,
		Policy: &admissionregistrationv1.MutatingAdmissionPolicy{
			TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels,
				Annotations: map[string]string{contract.AnnotationSource: profiles[0].source}},
			Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{
					// A label selector costs the API server no CEL: a Job
					// that is no agent's never reaches the conditions.
					ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
						{Key: contract.LabelAgentID, Operator: metav1.LabelSelectorOpExists}}},
					ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule: admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"},
							Resources: []string{"jobs"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
					}}},
				},
				MatchConditions:    matchConditions(in, all),
				FailurePolicy:      ptr.To(admissionregistrationv1.Fail),
				ReinvocationPolicy: admissionregistrationv1.IfNeededReinvocationPolicy,
				Variables:          vars,
				Mutations: []admissionregistrationv1.Mutation{{
					PatchType: admissionregistrationv1.PatchTypeJSONPatch,
					JSONPatch: &admissionregistrationv1.JSONPatch{Expression: expr.String()},
				}},
			},
		},
		Binding: &admissionregistrationv1.MutatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{
				PolicyName: name,
				MatchResources: &admissionregistrationv1.MatchResources{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: in.Namespace}},
				},
			},
		},
	}
}

// adapterType is the CEL of a Job's adapter type as contract.AdapterType
// reads it: the adapter-type label, else its alias label, else empty.
var adapterType = fmt.Sprintf("((%[1]s in %[3]s && %[4]s != '') ? %[4]s : (%[2]s in %[3]s ? %[5]s : ''))",
	celString(contract.LabelAdapterType), celString(contract.LabelAdapter), labelsExpr,
	labelValue(contract.LabelAdapterType), labelValue(contract.LabelAdapter))

// adapterTypes are the adapter types (CEL literals) that select the
// profile: its name, its aliases, and none for the default profile.
func (c *compiler) adapterTypes() []string {
	types := []string{celString(c.prof.Name)}
	for _, a := range c.prof.Aliases {
		types = append(types, celString(a))
	}
	if c.prof.Name == c.in.Config.DefaultProfile {
		types = append(types, "''")
	}
	return types
}

// matchConditions is the policy's domain: an agent Job of a profile it
// completes (types), bare, carrying only run values Render accepts.
func matchConditions(in Input, types []string) []admissionregistrationv1.MatchCondition {
	return []admissionregistrationv1.MatchCondition{
		{Name: "agent-job", Expression: fmt.Sprintf("has(%s) && %s in %s", labelsExpr, celString(contract.LabelAgentID), labelsExpr)},
		{Name: "profile", Expression: fmt.Sprintf("%s in [%s]", adapterType, strings.Join(types, ", "))},
		{Name: "bare-job", Expression: bareJobSpec()},
		{Name: "bare-pod", Expression: barePodSpec()},
		{Name: "valid-run-values", Expression: validValues(in.Inherited, in.Config)},
	}
}

// bareJobSpec: the Job spec holds nothing but what Render keeps or replaces
// (and the API server's defaults of those).
func bareJobSpec() string {
	conds := []string{
		"(!has(object.spec.completionMode) || object.spec.completionMode == 'NonIndexed')",
		"(!has(object.spec.manualSelector) || !object.spec.manualSelector)", // the API server defaults it to false
	}
	for _, f := range jsonFields(reflect.TypeFor[batchv1.JobSpec]()) {
		switch f {
		case "template", "completionMode", "manualSelector", "backoffLimit", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
			"suspend", "completions", "parallelism", "podReplacementPolicy":
			continue
		}
		conds = append(conds, "!has(object.spec."+f+")")
	}
	return strings.Join(conds, " && ")
}

// barePodSpec: the pod spec holds nothing but a restart policy and the API
// server's defaults; no container, volume or field Render merges with.
func barePodSpec() string {
	spec := "object.spec.template.spec"
	conds := []string{
		fmt.Sprintf("(!has(%[1]s.dnsPolicy) || %[1]s.dnsPolicy == 'ClusterFirst')", spec),
	}
	for _, f := range jsonFields(reflect.TypeFor[corev1.PodSpec]()) {
		switch f {
		case "restartPolicy", "terminationGracePeriodSeconds", "schedulerName", "dnsPolicy", "securityContext":
			continue
		case "containers", "initContainers", "volumes":
			// containers has no omitempty: a bare Job's is null.
			conds = append(conds, fmt.Sprintf("(!has(%[1]s.%[2]s) || %[1]s.%[2]s == null || size(%[1]s.%[2]s) == 0)", spec, f))
			continue
		}
		conds = append(conds, fmt.Sprintf("!has(%s.%s)", spec, f))
	}
	var sc []string
	for _, f := range jsonFields(reflect.TypeFor[corev1.PodSecurityContext]()) {
		sc = append(sc, fmt.Sprintf("!has(%s.securityContext.%s)", spec, f))
	}
	conds = append(conds, fmt.Sprintf("(!has(%s.securityContext) || (%s))", spec, strings.Join(sc, " && ")))
	return strings.Join(conds, " && ")
}

// jsonFields are the JSON names of a struct's fields.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// variableName is s as part of a CEL identifier: letters, digits and
// underscores (the index before a profile's name keeps two apart).
func variableName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}
