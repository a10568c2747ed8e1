package policy

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/imageref"
)

// Rules, as named in decisions and metrics.
const (
	RuleNamespace   = "namespace"
	RuleLabels      = "labels"
	RuleImages      = "images"
	RulePodSecurity = "pod-security"
	RuleVolume      = "volume"
	RuleConcurrency = "concurrency"
	RuleTemplate    = "template"
	RuleOnePod      = "one-pod"
	RuleSandbox     = "sandbox"
	RuleCredentials = "credentials"
	RuleDeadline    = "deadline"
	RuleRunSecret   = "run-secret"
	RuleCreator     = "creator"
	RuleRendered    = "rendered"
)

var (
	metaPath   = field.NewPath("metadata")
	labelsPath = metaPath.Child("labels")
	tplPath    = field.NewPath("spec", "template")
	podPath    = tplPath.Child("spec")
)

// Operation is the admission operation being checked.
type Operation string

const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
)

// ClaimLookup returns a PersistentVolumeClaim or an error; a NotFound error
// means it does not exist.
type ClaimLookup func(namespace, name string) (*corev1.PersistentVolumeClaim, error)

// Input is what Evaluate checks.
type Input struct {
	Operation Operation
	// Job is the object as it would be stored; Old is the stored one on
	// UPDATE.
	Job, Old *batchv1.Job
	Config   *config.Config
	// SourceImages are the source Deployment's images, always allowed.
	SourceImages []string
	// Claims looks PVCs up; a *FactUnknown error (an offline check not
	// given the PVC's manifest) leaves the volume rule undecided.
	Claims ClaimLookup
	// SecretMeta returns a Secret's metadata (or a NotFound error), for the
	// Secrets the Job references; a *FactUnknown error leaves the
	// run-secret rule undecided for that Secret.
	SecretMeta SecretMeta
	// HandedSecrets are the Secrets clipjob hands agents whole from the
	// source, and HandedKeys the keys it hands one by one ("secret/key")
	// (templates.Inherited.SecretsFor): a Job may reference those, and a
	// handed key's Secret only by that key.
	HandedSecrets, HandedKeys []string
	// ServerSecrets are the Secrets the server reads under a denied env
	// name (templates.Inherited.ServerSecrets): never an agent's, whatever
	// policy.secrets.shared says.
	ServerSecrets []string
	// SourceSecrets are every Secret the server's container reads
	// (templates.Inherited.ReadSecrets): never a run's, and shared by
	// policy.secrets.shared only under its exact name, never by a glob.
	SourceSecrets []string
	// User is who makes the request (the admission request's userInfo);
	// empty (an offline check) skips the creator rule on CREATE.
	User string
	// Shared is the shared volume as clipjob mounts it for this Job, or
	// nil when the source is not known: the volume rule then checks only
	// that the claims the Job mounts exist.
	Shared *SharedVolume
	// Rerender, on CREATE, completes the Job again as clipjob does
	// (templates.Render with the facts in force) and says whether that
	// changed it (templates.Result.Changed); nil skips the rendered rule.
	// Render is idempotent, so a Job clipjob completed — by its mutating
	// webhook or a compiled admission policy — comes back unchanged, and
	// one that skipped both does not.
	Rerender func(*batchv1.Job) (again *batchv1.Job, changed bool, err error)
}

// SharedVolume is how clipjob mounts the shared volume for one Job
// (templates.SharedMounts).
type SharedVolume struct {
	// Volume is the pod volume clipjob adds for it, and Claim its claim.
	Volume, Claim string
	// Mounts are the mounts of it clipjob gives every app container: the
	// run's own directories, or under isolation mode Shared the whole
	// volume. A container mounts it only so.
	Mounts []corev1.VolumeMount
	// Confined: the run's directories, not the whole volume.
	Confined bool
	// FSGroup is the group clipjob gives the pod (the floor's), or nil.
	FSGroup *int64
}

// SecretMeta returns the metadata of a Secret (its labels and owners), or
// an error; a NotFound error means there is none. Only metadata: the
// webhook never reads a Secret's data.
type SecretMeta func(namespace, name string) (*metav1.ObjectMeta, error)

// FactUnknown is the error a lookup returns for a fact it was not given
// (an offline check without the object's manifest): the rule that needed
// it says what the cluster would do with and without it, never guessing.
type FactUnknown struct {
	// Fact names it: "Secret paperclip/llm-key".
	Fact string
	// Give says how to give it, e.g. "add its manifest with --objects".
	Give string
}

func (e *FactUnknown) Error() string { return e.Fact + " was not given (" + e.Give + ")" }

// Undecided is a verdict that hangs on a fact not given.
type Undecided struct {
	Fact, Give string
	// WithoutIt is what the cluster answers when the object does not
	// exist: its refusal, or with AdmittedWithout the warning it admits
	// the Job with. WithIt is what the object must be for the rule to
	// pass.
	WithoutIt, WithIt string
	// AdmittedWithout: the object's absence is allowed (a Secret the
	// config lets come after its Job), so an offline answer must not
	// advise a setting the config already has.
	AdmittedWithout bool
}

func (u Undecided) String() string {
	without := "refuses the Job"
	if u.AdmittedWithout {
		without = "admits the Job with a warning"
	}
	return fmt.Sprintf("%s was not given (%s): without it the cluster %s (%s); with it, %s", u.Fact, u.Give, without, u.WithoutIt, u.WithIt)
}

// Decision is the verdict of Evaluate.
type Decision struct {
	// Errs are the violations; none means allowed.
	Errs field.ErrorList
	// Undecided are the rules that could not be judged for want of a fact
	// (offline only: the webhook has every fact).
	Undecided []Undecided
	// Warnings are soft findings for the client.
	Warnings []string
	// Failed lists the rules that found violations, for metrics.
	Failed []string
	// Checked lists the rules evaluated.
	Checked []string
}

// Allowed reports whether the Job passed every rule.
func (d *Decision) Allowed() bool { return len(d.Errs) == 0 }

// Decided reports whether no verdict hangs on a missing fact.
func (d *Decision) Decided() bool { return len(d.Undecided) == 0 }

func (d *Decision) add(rule string, errs field.ErrorList) {
	d.Checked = append(d.Checked, rule)
	if len(errs) > 0 {
		d.Errs = append(d.Errs, errs...)
		d.Failed = append(d.Failed, rule)
	}
}

// Evaluate checks an agent Job. On UPDATE only label integrity and the
// unchanged pod template are checked: other fields change through
// controllers (owner references, finalizers) that must not be refused
// because, say, the claim was deleted later.
func Evaluate(in Input) *Decision {
	d := &Decision{}
	if in.SecretMeta == nil {
		in.SecretMeta = func(ns, name string) (*metav1.ObjectMeta, error) {
			return nil, &FactUnknown{Fact: "Secret " + ns + "/" + name, Give: "no Secret lookup"}
		}
	}
	if in.Claims == nil {
		in.Claims = func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			return nil, &FactUnknown{Fact: "PersistentVolumeClaim " + ns + "/" + name, Give: "no PersistentVolumeClaim lookup"}
		}
	}
	d.add(RuleLabels, checkLabels(in))
	d.add(RuleCreator, checkCreator(in))
	if in.Operation == Create || podShapeChanged(in.Old, in.Job) {
		d.add(RuleOnePod, checkOnePod(in.Job))
	}
	if in.Operation == Update {
		d.add(RuleTemplate, checkTemplateUnchanged(in))
		d.add(RuleRunSecret, checkRunSecretUnchanged(in))
		d.add(RuleDeadline, checkDeadlineNotRaised(in))
		return d
	}
	d.add(RuleNamespace, checkNamespace(in))
	if in.Rerender != nil {
		d.add(RuleRendered, checkRendered(in))
	}
	imgErrs, imgWarn := checkImages(in)
	d.add(RuleImages, imgErrs)
	d.Warnings = append(d.Warnings, imgWarn...)
	d.add(RulePodSecurity, checkPodSecurity(in.Job))
	d.add(RuleSandbox, checkSandbox(in))
	d.add(RuleCredentials, checkDeniedEnv(in))
	volErrs, volWarn, volUndecided := checkVolume(in)
	d.add(RuleVolume, volErrs)
	d.Warnings = append(d.Warnings, volWarn...)
	d.Undecided = append(d.Undecided, volUndecided...)
	secErrs, secWarn, secUndecided := checkRunSecret(in)
	d.add(RuleRunSecret, secErrs)
	d.Warnings = append(d.Warnings, secWarn...)
	d.Undecided = append(d.Undecided, secUndecided...)
	return d
}

// checkRunSecret: every Secret the Job references is one of three kinds.
// A run's own Secret (its env and prompt Secrets, and any other it names)
// must exist and be made for this run (contract.SecretMadeForRun): any
// Secret of the namespace would otherwise be an agent's for the naming,
// and the Job comes to own its run's Secrets, so they go when it goes. A
// Secret clipjob hands agents from the source may be referenced. A Secret
// the operator shares (policy.secrets.shared, an LLM key) may be
// referenced as it is, but never named as a run's env or prompt Secret,
// and never if the server reads it under a denied name.
func checkRunSecret(in Input) (field.ErrorList, []string, []Undecided) {
	type ref struct {
		name string
		path *field.Path
		// ofRun: named by a run annotation, so the Job would own it.
		ofRun bool
	}
	var refs []ref
	if name, ok := in.Job.Annotations[contract.AnnotationEnvSecret]; ok {
		refs = append(refs, ref{name, metaPath.Child("annotations").Key(contract.AnnotationEnvSecret), true})
	}
	if v, ok := in.Job.Spec.Template.Annotations[contract.AnnotationPromptSecret]; ok {
		name, _, _ := strings.Cut(v, "/")
		refs = append(refs, ref{name, tplPath.Child("metadata", "annotations").Key(contract.AnnotationPromptSecret), true})
	}
	seen := map[string]bool{}
	for _, r := range refs {
		seen[r.name] = true
	}
	forEachSecretRef(in.Job.Spec.Template.Spec, func(name, key string, p *field.Path) {
		handed := slices.Contains(in.HandedSecrets, name) || key != "" && slices.Contains(in.HandedKeys, name+"/"+key)
		if name == "" || handed || seen[name] {
			return
		}
		seen[name] = true
		refs = append(refs, ref{name, p, false})
	})
	var errs field.ErrorList
	var warnings []string
	var undecided []Undecided
	job, sp := in.Job, in.Config.Policy.Secrets
	run, agent := job.Labels[contract.LabelRunID], job.Labels[contract.LabelAgentID]
	labelIt := fmt.Sprintf("labeled %s=%s and %s=%s", contract.LabelRunID, run, contract.LabelAgentID, agent)
	for _, r := range refs {
		shared := config.MatchAny(sp.Shared, r.name)
		switch {
		case slices.Contains(in.ServerSecrets, r.name):
			errs = append(errs, field.Forbidden(r.path, fmt.Sprintf(
				"Secret %s holds the Paperclip server's credentials (its Deployment reads it under a denied env name): no label and no setting makes it an agent's", r.name)))
			continue
		case shared && r.ofRun:
			errs = append(errs, field.Forbidden(r.path, fmt.Sprintf(
				"Secret %s is shared (policy.secrets.shared), and a run's env or prompt Secret is owned by its Job and deleted with it: name a Secret made for this run (%s)", r.name, labelIt)))
			continue
		case shared && slices.Contains(in.SourceSecrets, r.name) && !slices.Contains(sp.Shared, r.name):
			errs = append(errs, field.Forbidden(r.path, fmt.Sprintf(
				"Secret %s is read by the Paperclip server's Deployment, and a glob in policy.secrets.shared does not share such a Secret: list it by its exact name if every run may read all of it", r.name)))
			continue
		case shared:
			continue
		case slices.Contains(in.SourceSecrets, r.name):
			// Whatever its labels say: the server's Secret is not a run's,
			// and the run's Job would come to own and delete it.
			errs = append(errs, field.Forbidden(r.path, fmt.Sprintf(
				"Secret %s is read by the Paperclip server's Deployment, so it is not a run's (whatever its labels): reference only what clipjob hands agents from it, or, if every run may read all of it, list it in policy.secrets.shared by its exact name", r.name)))
			continue
		}
		// Built only when a Secret is missing or unknown: this runs on
		// every admission.
		notFound := func() *field.Error {
			missing := fmt.Sprintf("%s: no Secret %q in namespace %s; create the run's Secret (%s) before its Job", r.name, r.name, job.Namespace, labelIt)
			if contract.NamedForJob(job.Name, r.name) {
				missing += ", or set policy.secrets.createdAfterJob: true in the clipjob config to let a Secret named for its Job come after it"
			} else if !r.ofRun {
				missing += ", or, if many runs share it, list it in policy.secrets.shared in the clipjob config"
			}
			return field.NotFound(r.path, missing)
		}
		// A Secret named for its Job may come after it under
		// createdAfterJob: then its absence is a warning, offline too.
		comesAfter := sp.CreatedAfterJob && contract.NamedForJob(job.Name, r.name)
		notYet := func() string {
			return fmt.Sprintf("Secret %s does not exist yet (policy.secrets.createdAfterJob): the pod waits for it, and reads whatever is created under that name", r.name)
		}
		meta, err := in.SecretMeta(job.Namespace, r.name)
		var unknown *FactUnknown
		switch {
		case errors.As(err, &unknown):
			u := Undecided{Fact: unknown.Fact, Give: unknown.Give, WithoutIt: notFound().Error(),
				WithIt: fmt.Sprintf("allowed when it is %s (or, named %s-<word>, labeled %s=%s)", labelIt, job.Name, contract.LabelRunID, run)}
			if comesAfter {
				u.WithoutIt, u.AdmittedWithout = notYet(), true
			}
			undecided = append(undecided, u)
		case apierrors.IsNotFound(err) && comesAfter:
			warnings = append(warnings, notYet())
		case apierrors.IsNotFound(err):
			errs = append(errs, notFound())
		case err != nil:
			errs = append(errs, field.InternalError(r.path, fmt.Errorf("looking up Secret %s/%s: %w", job.Namespace, r.name, err)))
		case ownerJob(meta, job) != "":
			// Another run's, still there until its Job goes (at its TTL):
			// copying that run's ids does not make it this one's.
			errs = append(errs, field.Forbidden(r.path, fmt.Sprintf(
				"Secret %s belongs to Job %s (its owner), another run: a run's Secret serves the run that made it; make one for this run", r.name, ownerJob(meta, job))))
		case !contract.SecretMadeForRun(job.Name, job.Labels, r.name, meta.Labels):
			msg := fmt.Sprintf("Secret %s is labeled %s=%q, %s=%q, not this run's %q of agent %q: a run's Secret is made for that run (%s)",
				r.name, contract.LabelRunID, meta.Labels[contract.LabelRunID], contract.LabelAgentID, meta.Labels[contract.LabelAgentID], run, agent, labelIt)
			if !r.ofRun {
				msg += "; if many runs share it (an LLM key), list it in policy.secrets.shared in the clipjob config, and do not label it for a run: a run's Job owns and deletes its run's Secrets"
			}
			errs = append(errs, field.Forbidden(r.path, msg))
		}
	}
	return errs, warnings, undecided
}

// ownerJob names the Job other than job that owns a Secret, or "". On
// CREATE the Job being admitted owns nothing yet, so any owner is another
// run's Job; when a queued run starts (the start check judges it as its
// CREATE) it may own its Secrets already (the run-secret controller took
// them), and that owner is the run itself.
func ownerJob(meta *metav1.ObjectMeta, job *batchv1.Job) string {
	for _, o := range meta.OwnerReferences {
		if o.Kind == "Job" && (job.UID == "" || o.UID != job.UID) {
			return o.Name
		}
	}
	return ""
}

// forEachSecretRef calls f with every Secret the pod spec references by
// name (envFrom, env valueFrom, pull secrets, secret, projected and CSI
// volumes), the key for a single-key reference (env valueFrom) or "" for
// the whole Secret, and the path of the reference. (The other in-tree
// volume types that name a Secret are refused by Pod Security
// "restricted".)
func forEachSecretRef(spec corev1.PodSpec, f func(name, key string, p *field.Path)) {
	for _, list := range []struct {
		cs []corev1.Container
		p  *field.Path
	}{{spec.InitContainers, podPath.Child("initContainers")}, {spec.Containers, podPath.Child("containers")}} {
		for i, c := range list.cs {
			for j, e := range c.EnvFrom {
				if e.SecretRef != nil {
					f(e.SecretRef.Name, "", list.p.Index(i).Child("envFrom").Index(j).Child("secretRef"))
				}
			}
			for j, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					f(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key, list.p.Index(i).Child("env").Index(j).Child("valueFrom", "secretKeyRef"))
				}
			}
		}
	}
	for i, s := range spec.ImagePullSecrets {
		f(s.Name, "", podPath.Child("imagePullSecrets").Index(i))
	}
	for i, v := range spec.Volumes {
		p := podPath.Child("volumes").Index(i)
		if v.Secret != nil {
			f(v.Secret.SecretName, "", p.Child("secret"))
		}
		if v.CSI != nil && v.CSI.NodePublishSecretRef != nil {
			f(v.CSI.NodePublishSecretRef.Name, "", p.Child("csi", "nodePublishSecretRef"))
		}
		if v.Projected != nil {
			for j, src := range v.Projected.Sources {
				if src.Secret != nil {
					f(src.Secret.Name, "", p.Child("projected", "sources").Index(j).Child("secret"))
				}
			}
		}
	}
}

// checkRunSecretUnchanged keeps the Job's env Secret as admitted: the Job
// comes to own the Secret it names, and a name changed afterwards was
// never checked.
func checkRunSecretUnchanged(in Input) field.ErrorList {
	if in.Old == nil || !contract.IsAgentJob(in.Old.Labels) {
		return nil
	}
	was, had := in.Old.Annotations[contract.AnnotationEnvSecret]
	now, has := in.Job.Annotations[contract.AnnotationEnvSecret]
	if had == has && was == now {
		return nil
	}
	return field.ErrorList{field.Invalid(metaPath.Child("annotations").Key(contract.AnnotationEnvSecret), now, fmt.Sprintf(
		"is immutable (was %q): the run's env Secret was checked at admission; create a new Job instead", was))}
}

// checkDeadlineNotRaised lets an agent Job's activeDeadlineSeconds be set
// or lowered, never raised or removed: the claim controller ends a run
// that never started by lowering it, and a client undoing that would keep
// the run holding its agent.
func checkDeadlineNotRaised(in Input) field.ErrorList {
	if in.Old == nil || in.Old.Spec.ActiveDeadlineSeconds == nil || !contract.IsAgentJob(in.Old.Labels) {
		return nil
	}
	was, now := *in.Old.Spec.ActiveDeadlineSeconds, in.Job.Spec.ActiveDeadlineSeconds
	if now != nil && *now <= was {
		return nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec", "activeDeadlineSeconds"), fmt.Sprintf(
		"may be lowered, not raised or removed (it is %d): an agent run's deadline only comes closer; create a new Job for a longer run", was))}
}

// checkOnePod keeps an agent run to one pod at a time, on CREATE and on
// every UPDATE (parallelism can be patched on a running Job). Without it
// one claim would cover several agent processes: parallelism or
// completions above 1, a replacement pod started while the one it replaces
// still terminates, or a manual selector, which lets an orphaned pod
// outlive its Job unseen by the claim.
func checkOnePod(job *batchv1.Job) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if p := job.Spec.Parallelism; p != nil && *p > 1 {
		errs = append(errs, field.Invalid(spec.Child("parallelism"), *p, "an agent run is one pod: must be 1, 0 to pause, or unset"))
	}
	if c := job.Spec.Completions; c != nil && *c != 1 {
		errs = append(errs, field.Invalid(spec.Child("completions"), *c, "an agent run is one pod: must be 1 or unset"))
	}
	if p := job.Spec.PodReplacementPolicy; p == nil || *p != batchv1.Failed {
		got := "unset (TerminatingOrFailed)"
		if p != nil {
			got = string(*p)
		}
		errs = append(errs, field.Invalid(spec.Child("podReplacementPolicy"), got,
			"must be Failed: a replacement pod may start only once the one it replaces has stopped writing to the shared volume"))
	}
	if job.Spec.ManualSelector != nil && *job.Spec.ManualSelector {
		errs = append(errs, field.Forbidden(spec.Child("manualSelector"),
			"agent Jobs use the Job controller's own selector, which is what ties every pod to its run"))
	}
	// Another controller's Job gets no pod, start time or condition from
	// the Job controller: its run would hold the agent's claim with
	// nothing to end it (the start timeout works through the Job
	// controller's deadline). managedBy cannot change after CREATE.
	if m := job.Spec.ManagedBy; m != nil && *m != batchv1.JobControllerName {
		errs = append(errs, field.Forbidden(spec.Child("managedBy"), fmt.Sprintf(
			"an agent Job is run by the Job controller (%s), not %q: clipjob frees an agent's claim and ends a run that cannot start through it; leave managedBy unset", batchv1.JobControllerName, *m)))
	}
	return errs
}

// checkPodContractLabels: the pods carry exactly the Job's paperclip.io/
// labels (plus the role and egress labels clipjob assigns), since the
// relay, the egress policies and Paperclip read them from the pods: a pod
// label the Job does not carry, or carries otherwise, would claim another
// company, agent, run or task.
func checkPodContractLabels(jobLabels, podLabels map[string]string) field.ErrorList {
	var errs field.ErrorList
	path := tplPath.Child("metadata", "labels")
	keys := map[string]bool{}
	for k := range jobLabels {
		keys[k] = true
	}
	for k := range podLabels {
		keys[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if !strings.HasPrefix(k, contract.Prefix) || k == contract.LabelRole || k == contract.LabelEgress {
			continue
		}
		jv, onJob := jobLabels[k]
		pv, onPod := podLabels[k]
		switch {
		case onJob && pv != jv:
			errs = append(errs, field.Invalid(path.Key(k), pv,
				fmt.Sprintf("must equal the Job's %s %q: pods may not claim another agent, run or company", k, jv)))
		case onPod && !onJob:
			errs = append(errs, field.Forbidden(path.Key(k),
				fmt.Sprintf("the Job does not carry %s: pods carry only the Job's paperclip.io/ labels", k)))
		}
	}
	return errs
}

// checkSandbox holds the pod to what its profile sets about where and as
// whom it runs (the renderer applies the same): a Job may not replace the
// profile's runtime class, ServiceAccount, token mounting, node selector
// entries or tolerations. Whatever the profile, a pod may not pick its node
// (nodeName skips the scheduler, and every selector and taint with it) or
// tolerate every taint.
func checkSandbox(in Input) field.ErrorList {
	var errs field.ErrorList
	spec := in.Job.Spec.Template.Spec
	if spec.NodeName != "" {
		errs = append(errs, field.Forbidden(podPath.Child("nodeName"),
			"agent pods are placed by the scheduler, under the profile's node selector and tolerations"))
	}
	for i, t := range spec.Tolerations {
		if t.Key == "" && t.Operator == corev1.TolerationOpExists {
			errs = append(errs, field.Forbidden(podPath.Child("tolerations").Index(i),
				"a toleration without a key tolerates every taint, the control plane's included"))
		}
	}
	prof, _ := in.Config.JobProfile(contract.AdapterType(in.Job.Labels))
	why := fmt.Sprintf("profile %q sets it; a Job cannot replace its profile's sandbox", prof.Name)
	if prof.ServiceAccountName != "" && spec.ServiceAccountName != prof.ServiceAccountName {
		errs = append(errs, field.Invalid(podPath.Child("serviceAccountName"), spec.ServiceAccountName, "must be "+prof.ServiceAccountName+": "+why))
	}
	if a := prof.AutomountServiceAccountToken; a != nil && (spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken != *a) {
		errs = append(errs, field.Invalid(podPath.Child("automountServiceAccountToken"), fmtPtr(spec.AutomountServiceAccountToken), fmt.Sprintf("must be %t: %s", *a, why)))
	}
	if rc := prof.RuntimeClassName; rc != nil && (spec.RuntimeClassName == nil || *spec.RuntimeClassName != *rc) {
		errs = append(errs, field.Invalid(podPath.Child("runtimeClassName"), fmtPtr(spec.RuntimeClassName), "must be "+*rc+": "+why))
	}
	// A token by projection is a token all the same: where the profile
	// mounts none, a Job may not mount one (or a pod certificate, the
	// other credential of its identity) through a projected volume.
	if a := prof.AutomountServiceAccountToken; a == nil || !*a {
		for i, v := range spec.Volumes {
			if v.Projected == nil {
				continue
			}
			for j, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil || src.PodCertificate != nil {
					errs = append(errs, field.Forbidden(podPath.Child("volumes").Index(i).Child("projected", "sources").Index(j), fmt.Sprintf(
						"profile %q mounts no ServiceAccount token (automountServiceAccountToken false), and a projected token or pod certificate is one: set profiles.%s.automountServiceAccountToken: true in the clipjob config to let this adapter's pods hold one",
						prof.Name, prof.Name)))
				}
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(prof.NodeSelector)) {
		if got, ok := spec.NodeSelector[k]; !ok || got != prof.NodeSelector[k] {
			errs = append(errs, field.Invalid(podPath.Child("nodeSelector").Key(k), got, "must be "+prof.NodeSelector[k]+": "+why))
		}
	}
	if len(prof.Tolerations) > 0 {
		for i, t := range spec.Tolerations {
			if !slices.ContainsFunc(prof.Tolerations, func(p corev1.Toleration) bool { return equality.Semantic.DeepEqual(p, t) }) {
				errs = append(errs, field.Forbidden(podPath.Child("tolerations").Index(i), "not among the profile's tolerations: "+why))
			}
		}
	}
	return errs
}

// checkDeniedEnv refuses env under a denied name (source.env.deny and the
// built-in list) in any container, unless the profile sets it itself: the
// mutating webhook drops them, so this holds when mutation failed open or
// another webhook added one.
func checkDeniedEnv(in Input) field.ErrorList {
	var errs field.ErrorList
	prof, _ := in.Config.JobProfile(contract.AdapterType(in.Job.Labels))
	spec := in.Job.Spec.Template.Spec
	check := func(cs []corev1.Container, p *field.Path) {
		for i, c := range cs {
			for j, e := range c.Env {
				if config.MatchAny(in.Config.Source.Env.Deny, e.Name) && !slices.ContainsFunc(prof.Env, func(pe corev1.EnvVar) bool { return pe.Name == e.Name }) {
					errs = append(errs, field.Forbidden(p.Index(i).Child("env").Index(j),
						fmt.Sprintf("%s is the Paperclip server's (source.env.deny); a profile may hand it over in its own env", e.Name)))
				}
			}
		}
	}
	check(spec.Containers, podPath.Child("containers"))
	check(spec.InitContainers, podPath.Child("initContainers"))
	return errs
}

// fmtPtr shows an optional field's value, or that it is unset.
func fmtPtr[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// podShapeChanged reports whether an UPDATE touches what checkOnePod
// checks. Unchanged, it is left alone: a Job admitted before the rule
// existed must still take its unsuspend, labels and finalizers.
func podShapeChanged(old, job *batchv1.Job) bool {
	if old == nil {
		return true
	}
	o, n := old.Spec, job.Spec
	return !equality.Semantic.DeepEqual(
		[]any{o.Parallelism, o.Completions, o.PodReplacementPolicy, o.ManualSelector},
		[]any{n.Parallelism, n.Completions, n.PodReplacementPolicy, n.ManualSelector})
}

// checkTemplateUnchanged keeps the pod template as it was admitted. The
// API server lets a Job that is suspended and never started change its
// template's labels, annotations, node selector, tolerations and
// scheduling gates; a queued agent run is exactly such a Job, and every
// other rule was checked on the template it had then.
func checkTemplateUnchanged(in Input) field.ErrorList {
	if in.Old == nil || !contract.IsAgentJob(in.Old.Labels) ||
		equality.Semantic.DeepEqual(in.Old.Spec.Template, in.Job.Spec.Template) {
		return nil
	}
	return field.ErrorList{field.Forbidden(tplPath,
		"the pod template of an agent Job is fixed once admitted (clipjob checked that one); create a new Job instead")}
}

// checkCreator: the Job records who created it, and only that. Clients
// tell their own runs from a Job that copied their labels by it (the
// Paperclip adapter re-attaches only to Jobs its own ServiceAccount
// made), so a Job may neither claim another creator nor change it later.
func checkCreator(in Input) field.ErrorList {
	key := contract.AnnotationCreatedBy
	path := metaPath.Child("annotations").Key(key)
	got, has := in.Job.Annotations[key]
	if in.Operation == Update && in.Old != nil {
		was, had := in.Old.Annotations[key]
		if has != had || got != was {
			return field.ErrorList{field.Invalid(path, got, fmt.Sprintf(
				"is immutable (was %q): it records who created the run", was))}
		}
		return nil
	}
	if in.Operation != Create || in.User == "" || got == in.User {
		return nil
	}
	return field.ErrorList{field.Invalid(path, got, fmt.Sprintf(
		"must be the creating user %q: clipjob's mutating webhook writes it, so a Job admitted without it was not completed by clipjob (check its mutating webhook, clipjob doctor)", in.User))}
}

func checkNamespace(in Input) field.ErrorList {
	allowed := in.Config.Policy.Namespaces
	if len(allowed) == 0 || slices.Contains(allowed, in.Job.Namespace) {
		return nil
	}
	return field.ErrorList{field.Forbidden(metaPath.Child("namespace"), fmt.Sprintf(
		"agent Jobs may run only in namespaces %s, not %q", strings.Join(allowed, ", "), in.Job.Namespace))}
}

func checkLabels(in Input) field.ErrorList {
	var errs field.ErrorList
	job := in.Job
	if in.Operation == Update && in.Old != nil {
		// Every contract label: the agent and run, and also the adapter
		// type (it picks the profile the claim controller times the start
		// by) and the company and task the relay reports.
		keys := map[string]bool{}
		for k := range in.Old.Labels {
			keys[k] = strings.HasPrefix(k, contract.Prefix)
		}
		for k := range job.Labels {
			keys[k] = keys[k] || strings.HasPrefix(k, contract.Prefix)
		}
		for _, key := range slices.Sorted(maps.Keys(keys)) {
			oldV, hadOld := in.Old.Labels[key]
			newV, hasNew := job.Labels[key]
			if keys[key] && (hadOld != hasNew || oldV != newV) {
				errs = append(errs, field.Invalid(labelsPath.Key(key), newV, fmt.Sprintf(
					"is immutable (was %q): an agent run keeps its agent, run and profile; create a new Job instead", oldV)))
			}
		}
		return errs
	}
	for _, key := range []string{contract.LabelAgentID, contract.LabelRunID} {
		v := job.Labels[key]
		if v == "" {
			errs = append(errs, field.Required(labelsPath.Key(key), "agent Jobs carry a non-empty "+key))
			continue
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(labelsPath.Key(key), v, msg))
		}
	}
	tplLabels := job.Spec.Template.Labels
	errs = append(errs, checkPodContractLabels(job.Labels, tplLabels)...)
	prof, _ := in.Config.JobProfile(contract.AdapterType(job.Labels))
	if got := tplLabels[contract.LabelEgress]; got != prof.EgressProfile {
		errs = append(errs, field.Invalid(tplPath.Child("metadata", "labels").Key(contract.LabelEgress), got,
			fmt.Sprintf("profile %q assigns egress profile %q; a Job cannot choose its own", prof.Name, prof.EgressProfile)))
	}
	if got := tplLabels[contract.LabelRole]; got != contract.RoleAgent {
		errs = append(errs, field.Invalid(tplPath.Child("metadata", "labels").Key(contract.LabelRole), got,
			"agent pods carry "+contract.LabelRole+"="+contract.RoleAgent))
	}
	return errs
}

// checkImages applies the allowlist to every container. The source's and
// the profiles' images are trusted: the operator configured them.
func checkImages(in Input) (field.ErrorList, []string) {
	pol := in.Config.Policy.Images
	patterns := make([]imageref.Pattern, 0, len(pol.Allow))
	for _, g := range pol.Allow {
		if p, err := imageref.ParsePattern(g); err == nil { // validated at load
			patterns = append(patterns, p)
		}
	}
	trusted := map[string]bool{}
	for _, s := range append(slices.Clone(in.SourceImages), in.Config.ProfileImages()...) {
		if img, err := imageref.Parse(s); err == nil {
			trusted[img.String()] = true
		}
	}
	allowedList := strings.Join(append(append([]string{}, pol.Allow...), "the source Deployment's and profiles' images"), ", ") +
		" (policy.images.allow in the clipjob config)"

	var errs field.ErrorList
	var warnings []string
	spec := in.Job.Spec.Template.Spec
	check := func(p *field.Path, c corev1.Container) {
		img, err := imageref.Parse(c.Image)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child("image"), c.Image, err.Error()))
			return
		}
		ok := trusted[img.String()]
		for _, pat := range patterns {
			ok = ok || pat.Match(img)
		}
		if !ok {
			errs = append(errs, field.Forbidden(p.Child("image"), fmt.Sprintf(
				"container %q: image %q (%s) is not allowed; allowed: %s", c.Name, c.Image, img, allowedList)))
			return
		}
		if pol.RequireDigest && img.Digest == "" {
			errs = append(errs, field.Forbidden(p.Child("image"), fmt.Sprintf(
				"container %q: image %q must be referenced by digest (policy.images.requireDigest)", c.Name, c.Image)))
			return
		}
		if img.Mutable() {
			warnings = append(warnings, fmt.Sprintf("container %q: image %q uses the mutable tag latest; pin a version or digest", c.Name, c.Image))
		}
	}
	for i, c := range spec.InitContainers {
		check(podPath.Child("initContainers").Index(i), c)
	}
	for i, c := range spec.Containers {
		check(podPath.Child("containers").Index(i), c)
	}
	for i, c := range spec.EphemeralContainers {
		check(podPath.Child("ephemeralContainers").Index(i), corev1.Container(c.EphemeralContainerCommon))
	}
	// An image volume pulls an image too, with the pod's pull secrets.
	for i, v := range spec.Volumes {
		if v.Image != nil {
			check(podPath.Child("volumes").Index(i), corev1.Container{Name: "volume " + v.Name, Image: v.Image.Reference})
		}
	}
	return errs, warnings
}

var restricted = func() psapolicy.Evaluator {
	e, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		panic("pod-security-admission checks: " + err.Error())
	}
	return e
}()

// checkPodSecurity runs Pod Security "restricted" (latest) on the template.
func checkPodSecurity(job *batchv1.Job) field.ErrorList {
	tpl := job.Spec.Template
	results := restricted.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()},
		&tpl.ObjectMeta, &tpl.Spec)
	agg := psapolicy.AggregateCheckResults(results)
	if agg.Allowed {
		return nil
	}
	var parts []string
	for i, reason := range agg.ForbiddenReasons {
		if d := agg.ForbiddenDetails[i]; d != "" {
			reason += " (" + d + ")"
		}
		parts = append(parts, reason)
	}
	return field.ErrorList{field.Forbidden(podPath, `violates PodSecurity "restricted:latest": `+strings.Join(parts, ", "))}
}

// checkVolume: the shared volume is clipjob's to mount, and only as it
// mounts it: the run's own directories, each at its path, its subPath
// fixed at admission. Another volume of the shared claim, a mount of it
// without its subPath or with subPathExpr (which the container's env
// expands), or a directory of another agent or company would hand the run
// what isolation keeps from it; so would a working directory on the
// volume the run does not mount writable. Any other claim must be one the
// config allows (policy.claims): it could be another of the server's
// volumes. The shared claim must exist in the Job's namespace, and is
// warned about unless ReadWriteMany.
func checkVolume(in Input) (field.ErrorList, []string, []Undecided) {
	spec := in.Job.Spec.Template.Spec
	var errs field.ErrorList
	var warnings []string
	var undecided []Undecided
	sh := in.Shared
	if sh != nil {
		errs = append(errs, checkSharedMounts(in, sh)...)
		errs = append(errs, checkVolumeOwnership(in, sh)...)
	}
	for i, v := range spec.Volumes {
		p := podPath.Child("volumes").Index(i)
		switch {
		case v.Ephemeral != nil && v.Ephemeral.VolumeClaimTemplate != nil:
			// A new claim, but one that can start as a copy of another
			// (the shared one, a snapshot of it) or bind a given volume.
			ts := v.Ephemeral.VolumeClaimTemplate.Spec
			tp := p.Child("ephemeral", "volumeClaimTemplate", "spec")
			if ts.DataSource != nil || ts.DataSourceRef != nil || ts.VolumeName != "" {
				errs = append(errs, field.Forbidden(tp,
					"an ephemeral volume of an agent run starts empty: its claim template may not name a dataSource, dataSourceRef or volumeName (a clone or snapshot of the shared volume, or the volume itself)"))
			}
			// Binding picks an Available PersistentVolume that matches
			// the claim before it provisions one: a selector or a class
			// chooses which, another tenant's or the shared storage's.
			if ts.Selector != nil {
				errs = append(errs, field.Forbidden(tp.Child("selector"),
					"an ephemeral volume of an agent run may not select a PersistentVolume (it would bind an existing one, another's data): remove the selector"))
			}
			if sc := ts.StorageClassName; sc != nil && !config.MatchAny(in.Config.Policy.StorageClasses, *sc) {
				errs = append(errs, field.Forbidden(tp.Child("storageClassName"), fmt.Sprintf(
					"StorageClass %q is not one agent Jobs' ephemeral volumes may name (a claim binds any Available PersistentVolume of its class): remove storageClassName to use the cluster's default, or list the class in policy.storageClasses in the clipjob config",
					*sc)))
			}
			continue
		case v.CSI != nil:
			// An inline CSI volume reaches storage by attributes the Job
			// writes (an NFS driver's server and share: the shared
			// volume's own export).
			if !config.MatchAny(in.Config.Policy.CSIDrivers, v.CSI.Driver) {
				errs = append(errs, field.Forbidden(p.Child("csi", "driver"), fmt.Sprintf(
					"CSI driver %q is not one agent Jobs may use inline (it could reach the shared volume's storage by its attributes): remove the volume, or list the driver in policy.csiDrivers in the clipjob config",
					v.CSI.Driver)))
			}
			continue
		case v.PersistentVolumeClaim == nil:
			continue
		}
		p = p.Child("persistentVolumeClaim", "claimName")
		name := v.PersistentVolumeClaim.ClaimName
		shared := sh != nil && name == sh.Claim
		switch {
		case shared && v.Name != sh.Volume && sh.Confined:
			errs = append(errs, field.Forbidden(p, fmt.Sprintf(
				"%s is the shared volume, which clipjob mounts itself (volume %s: the run's own directories); remove volume %q from the Job",
				name, sh.Volume, v.Name)))
			continue
		case sh != nil && !shared && !config.MatchAny(in.Config.Policy.Claims, name):
			errs = append(errs, field.Forbidden(p, fmt.Sprintf(
				"PersistentVolumeClaim %q is not one agent Jobs may mount (it could hold another run's or the server's data): remove the volume, or list the claim in policy.claims in the clipjob config",
				name)))
			continue
		case sh == nil && v.Name != contract.DataVolume:
			continue // without the source, only clipjob's own volume is known
		}
		notFound := func() *field.Error {
			return field.NotFound(p, fmt.Sprintf(
				"%s: no PersistentVolumeClaim %q in namespace %s; agent Jobs share Paperclip's data through it, so create the Job in the namespace that has it, or, if agents here run apart from the server, list the namespace in tenantNamespaces in the clipjob config",
				name, name, in.Job.Namespace))
		}
		if !shared && sh != nil {
			notFound = func() *field.Error {
				return field.NotFound(p, fmt.Sprintf("%s: no PersistentVolumeClaim %q in namespace %s", name, name, in.Job.Namespace))
			}
		}
		pvc, err := in.Claims(in.Job.Namespace, name)
		var unknown *FactUnknown
		switch {
		case errors.As(err, &unknown):
			undecided = append(undecided, Undecided{Fact: unknown.Fact, Give: unknown.Give, WithoutIt: notFound().Error(),
				WithIt: "allowed (ReadWriteMany, or a warning)"})
		case apierrors.IsNotFound(err):
			errs = append(errs, notFound())
		case err != nil:
			errs = append(errs, field.InternalError(p, fmt.Errorf("looking up PersistentVolumeClaim %s/%s: %w", in.Job.Namespace, name, err)))
		case !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) && (shared || v.Name == contract.DataVolume):
			warnings = append(warnings, fmt.Sprintf("PersistentVolumeClaim %s/%s is not ReadWriteMany (%v): the agent pod may not be able to mount it beside the Paperclip server",
				in.Job.Namespace, name, pvc.Spec.AccessModes))
		}
	}
	return errs, warnings, undecided
}

// checkSharedMounts holds every mount of the shared volume to one clipjob
// gives (exactly: path, subPath, read-only), and, for a confined run, a
// working directory on the volume's path to a directory mounted writable.
func checkSharedMounts(in Input, sh *SharedVolume) field.ErrorList {
	var errs field.ErrorList
	var allowed []string
	for _, m := range sh.Mounts {
		how := m.MountPath + " (subPath " + m.SubPath + ")"
		if m.ReadOnly {
			how += " read-only"
		}
		allowed = append(allowed, how)
	}
	spec := in.Job.Spec.Template.Spec
	check := func(cs []corev1.Container, p *field.Path) {
		for i, c := range cs {
			var writable []string
			for j, m := range c.VolumeMounts {
				if m.Name != sh.Volume {
					if !m.ReadOnly {
						writable = append(writable, m.MountPath) // the Job's own volume over a path of the volume's
					}
					continue
				}
				if slices.ContainsFunc(sh.Mounts, func(want corev1.VolumeMount) bool { return equality.Semantic.DeepEqual(want, m) }) {
					if !m.ReadOnly {
						writable = append(writable, m.MountPath)
					}
					continue
				}
				errs = append(errs, field.Forbidden(p.Index(i).Child("volumeMounts").Index(j), fmt.Sprintf(
					"mounts the shared volume at %s (subPath %q%s): the run mounts it only as clipjob does, %s; remove this mount",
					m.MountPath, m.SubPath, expr(m.SubPathExpr), strings.Join(allowed, ", "))))
			}
			data := in.Config.Source.DataMountPath
			if wd := c.WorkingDir; sh.Confined && wd != "" && config.PathWithin(path.Clean(wd), data) &&
				!slices.ContainsFunc(writable, func(w string) bool { return config.PathWithin(path.Clean(wd), w) }) {
				errs = append(errs, field.Forbidden(p.Index(i).Child("workingDir"), fmt.Sprintf(
					"%s is on the shared volume but not in a directory the container mounts writable (%s): leave workingDir unset (clipjob sets the run's), or use the paperclip.io/working-dir annotation",
					wd, strings.Join(writable, ", "))))
			}
		}
	}
	check(spec.InitContainers, podPath.Child("initContainers"))
	check(spec.Containers, podPath.Child("containers"))
	return errs
}

// checkVolumeOwnership: kubelet applies a pod's fsGroup to the whole
// shared volume (for drivers that support it) before any subPath is
// bound, and fsGroupChangePolicy Always re-applies it at every start: a
// Job's own group there would make Paperclip's files (its secrets, its
// database) that group's and group-writable. Group 0 among a run's groups
// reaches what is the root group's on the volume.
func checkVolumeOwnership(in Input, sh *SharedVolume) field.ErrorList {
	spec := in.Job.Spec.Template.Spec
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == sh.Volume }) || spec.SecurityContext == nil {
		return nil
	}
	sc, p := spec.SecurityContext, podPath.Child("securityContext")
	var errs field.ErrorList
	if sc.FSGroup != nil && sh.FSGroup != nil && *sc.FSGroup != *sh.FSGroup {
		errs = append(errs, field.Forbidden(p.Child("fsGroup"), fmt.Sprintf(
			"%d: kubelet would give the whole shared volume (Paperclip's home with it) to this group; leave fsGroup unset (clipjob sets %d)", *sc.FSGroup, *sh.FSGroup)))
	}
	if sc.FSGroupChangePolicy != nil && *sc.FSGroupChangePolicy != corev1.FSGroupChangeOnRootMismatch {
		errs = append(errs, field.Forbidden(p.Child("fsGroupChangePolicy"), fmt.Sprintf(
			"%s: kubelet would walk the whole shared volume at every start; leave it unset or OnRootMismatch", *sc.FSGroupChangePolicy)))
	}
	if slices.Contains(sc.SupplementalGroups, 0) {
		errs = append(errs, field.Forbidden(p.Child("supplementalGroups"), "group 0 (root) reaches what is the root group's on the shared volume; remove it"))
	}
	return errs
}

func expr(subPathExpr string) string {
	if subPathExpr == "" {
		return ""
	}
	return fmt.Sprintf(", subPathExpr %q", subPathExpr)
}
