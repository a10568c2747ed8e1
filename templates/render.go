package templates

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

// templateVersion is hashed with the inputs, so a change to what Render does
// shows up in the template hash of new Jobs.
const templateVersion = "2"

// apiDefaultBackoffLimit is what the API server sets when a Job has none.
const apiDefaultBackoffLimit = 6

var (
	labelsPath     = field.NewPath("metadata", "labels")
	podPath        = field.NewPath("spec", "template", "spec")
	containersPath = podPath.Child("containers")
	volumesPath    = podPath.Child("volumes")
	tplAnnotations = field.NewPath("spec", "template", "metadata", "annotations")
)

// Input is everything a render depends on.
type Input struct {
	// Job is the submitted Job; Render does not modify it.
	Job *batchv1.Job
	// Inherited comes from the source workload (see InheritFromDeployment).
	Inherited *Inherited
	// Config selects and shapes the profile.
	Config *config.Config
	// Hashes, if set, memoizes the template hash; it must belong to this
	// Inherited and Config.
	Hashes *TemplateHashes
	// Creator is the user creating the Job (the admission request's
	// userInfo), recorded in contract.AnnotationCreatedBy; empty records
	// none (an offline render has no user).
	Creator string
}

// Result is a rendered Job and what a client should know about it.
type Result struct {
	Job *batchv1.Job
	// Profile is the canonical name of the profile applied.
	Profile string
	// Changed is false when the Job was already complete (a re-render).
	Changed bool
	// Warnings are for the client, e.g. a key the profile needs is unset.
	Warnings []string
}

// RenderError lists the fields of a Job that cannot be rendered, with the
// path of each and what to do about it.
type RenderError struct{ Errs field.ErrorList }

func (e *RenderError) Error() string { return e.Errs.ToAggregate().Error() }

// Render completes an agent Job; see the package documentation.
func Render(in Input) (*Result, error) {
	if !contract.IsAgentJob(in.Job.Labels) {
		return nil, &RenderError{field.ErrorList{field.Required(labelsPath.Key(contract.LabelAgentID), "an agent Job carries this label")}}
	}
	adapter := contract.AdapterType(in.Job.Labels)
	prof, known := in.Config.JobProfile(adapter)
	r := renderer{in: in, prof: prof, job: in.Job.DeepCopy(), unknownAdapter: !known}
	if !known {
		r.warn(fmt.Sprintf("adapter type %q has no profile (profiles: %s); profile %q applies", adapter,
			strings.Join(in.Config.ProfileNames(), ", "), prof.Name))
	}
	r.render()
	if len(r.errs) > 0 {
		return nil, &RenderError{r.errs}
	}
	return &Result{
		Job:      r.job,
		Profile:  prof.Name,
		Changed:  !equality.Semantic.DeepEqual(in.Job, r.job),
		Warnings: r.warnings,
	}, nil
}

type renderer struct {
	in   Input
	prof config.Resolved
	// unknownAdapter: no profile knows the Job's adapter type; the default
	// profile applies.
	unknownAdapter bool
	job            *batchv1.Job
	errs           field.ErrorList
	warnings       []string
	withheld       *withheld
	// volumes the pod needs, in the order they were first mounted
	volumes []corev1.Volume
	// dirs are the run's directories when it is confined (runDirs).
	dirs     *RunDirs
	dirsDone bool
}

func (r *renderer) render() {
	// What clipjob records is clipjob's to write: a client's own value
	// (say, a start timeout already "handled") would steer the claim
	// controller. jobSpec and annotate set the real ones again.
	for k := range r.job.Annotations {
		if strings.HasPrefix(k, contract.ClipjobPrefix) {
			delete(r.job.Annotations, k)
		}
	}
	spec := &r.job.Spec.Template.Spec
	if len(spec.Containers) == 0 {
		if len(r.prof.Command) == 0 {
			why := fmt.Sprintf("profile %q has no command", r.prof.Name)
			if r.unknownAdapter {
				why = fmt.Sprintf("adapter type %q has no profile, and profile %q, which applies instead, has no command",
					contract.AdapterType(r.job.Labels), r.prof.Name)
			}
			r.errs = append(r.errs, field.Required(containersPath, fmt.Sprintf(
				"the Job has no container and %s: add a container with a command, or set label %s to one of %s",
				why, contract.LabelAdapterType, strings.Join(r.in.Config.ProfileNames(), ", "))))
			return
		}
		spec.Containers = []corev1.Container{{Name: r.prof.ContainerName, Command: r.prof.Command, Args: r.prof.Args}}
	}
	r.withheld = newWithheld(r.in.Inherited.Env, r.in.Config.Source, r.in.Inherited.DataMountPath, r.prof.Env)
	runEnv := r.runEnvSecret()
	prompt := r.promptVolume()
	mounts := r.sharedMounts(prompt)
	env := r.layeredEnv(prompt != nil)

	workDir := r.workingDir()
	for i := range spec.Containers {
		c := &spec.Containers[i]
		p := containersPath.Index(i)
		// The profile's container given with no command (say, to set its
		// resources) runs the profile's command: otherwise the inherited
		// image's entrypoint — the Paperclip server — would run as the agent.
		if c.Name == r.prof.ContainerName && len(c.Command) == 0 && len(c.Args) == 0 && len(r.prof.Command) > 0 {
			c.Command, c.Args = r.prof.Command, r.prof.Args
		}
		r.image(c, p)
		if c.WorkingDir == "" {
			c.WorkingDir = workDir
		}
		c.Env = r.withheld.envOver(c.Name, env, c.Env, r.warn)
		for _, ef := range r.withheld.envFrom(r.in.Inherited.EnvFrom, r.in.Config.Source.Env.AllowFrom, r.warn) {
			if !hasEnvFrom(c.EnvFrom, ef) {
				c.EnvFrom = append(c.EnvFrom, ef)
			}
		}
		// Last: a per-run value wins over an inherited one of the same name.
		if runEnv != nil && !hasEnvFrom(c.EnvFrom, *runEnv) {
			c.EnvFrom = append(c.EnvFrom, *runEnv)
		}
		for _, m := range mounts {
			r.mount(c, m, p)
		}
		r.resources(c)
		enforceContainerFloor(c, r.readOnlyRoot())
		r.warnMissingKeys(c)
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		c.Env = r.withheld.env(c.Name, c.Env, r.warn)
		r.image(c, podPath.Child("initContainers").Index(i))
		enforceContainerFloor(c, r.readOnlyRoot())
	}
	r.addVolumes(spec)
	r.pod(spec)
	r.jobSpec()
	r.labels()
	r.annotate()
}

func (r *renderer) warn(msg string) { r.warnings = append(r.warnings, msg) }

// serverSecret says why Secret name is the Paperclip server's and so not
// a run's (its Deployment reads it: env, envFrom, a volume, a pull
// secret), or "". A run's Job comes to own its run's Secrets and deletes
// them with it: naming one of the server's would hand it to an agent and
// then delete it.
func (r *renderer) serverSecret(name string) string {
	inh := r.in.Inherited
	if !slices.Contains(inh.ReadSecrets(), name) {
		return ""
	}
	return fmt.Sprintf("Secret %s is the Paperclip server's (its Deployment %s reads it); a run's Secrets are made for that run", name, inh.Source)
}

// runEnvSecret is the envFrom of the Job's AnnotationEnvSecret, or nil. A
// Secret the server's withheld variables read is refused here, with no
// cluster access; the validating webhook checks that the Secret exists and
// was made for this run.
func (r *renderer) runEnvSecret() *corev1.EnvFromSource {
	name, ok := r.job.Annotations[contract.AnnotationEnvSecret]
	if !ok {
		return nil
	}
	p := field.NewPath("metadata", "annotations").Key(contract.AnnotationEnvSecret)
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		r.errs = append(r.errs, field.Invalid(p, name, "Secret name: "+msg))
		return nil
	}
	if why := r.serverSecret(name); why != "" {
		r.errs = append(r.errs, field.Forbidden(p, why))
		return nil
	}
	return &corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

// ModelNamePattern is what a run's model name must match (RE2; the
// compiled admission policies check the same pattern in CEL).
const ModelNamePattern = `^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$`

var modelName = regexp.MustCompile(ModelNamePattern)

// runOptions are the env vars of the Job's run-option annotations (model,
// turn limit), each checked: they reach a command line through the
// profile's command.
func (r *renderer) runOptions() []corev1.EnvVar {
	var env []corev1.EnvVar
	for _, o := range contract.RunOptionEnv {
		v, ok := r.job.Annotations[o.Annotation]
		if !ok {
			// Set empty: from the run's env Secret or the server's env a
			// value would reach the command past the checks below.
			env = append(env, corev1.EnvVar{Name: o.Env})
			continue
		}
		p := field.NewPath("metadata", "annotations").Key(o.Annotation)
		switch o.Annotation {
		case contract.AnnotationModel:
			if !modelName.MatchString(v) {
				r.errs = append(r.errs, field.Invalid(p, v, "a model name: letters, digits and ._:/@+- (at most 128), e.g. claude-sonnet-4-5 or anthropic/claude-sonnet-4-5"))
				continue
			}
		case contract.AnnotationMaxTurns:
			if n, err := strconv.Atoi(v); err != nil || n < 1 || n > 10000 || strconv.Itoa(n) != v {
				r.errs = append(r.errs, field.Invalid(p, v, "a number of turns from 1 to 10000"))
				continue
			}
		}
		env = append(env, corev1.EnvVar{Name: o.Env, Value: v})
	}
	return env
}

// workingDir is where containers that set none start: the Job's
// AnnotationWorkingDir (a per-run worktree), else the profile's, else the
// run's workspace (the shared volume's root when the run is not
// confined). The directory must be one the run can write: a path
// elsewhere would be the image's own files, read-only or not the run's.
func (r *renderer) workingDir() string {
	data := r.in.Inherited.DataMountPath
	writable, where := []string{data}, data+", the shared volume (a per-run worktree there)"
	fallback := data
	if d := r.runDirs(); d != nil {
		writable, fallback = d.Writable(), d.Workspace
		where = "a directory the run mounts writable: its workspace " + d.Workspace + ", its company's projects " + d.Projects + " or its home " + d.Home
	} else if r.confined() {
		return "" // the Job does not say whose run it is; runDirs said why
	}
	within := func(dir string) bool {
		return slices.ContainsFunc(writable, func(w string) bool { return config.PathWithin(dir, w) })
	}
	if dir, ok := r.job.Annotations[contract.AnnotationWorkingDir]; ok {
		p := field.NewPath("metadata", "annotations").Key(contract.AnnotationWorkingDir)
		clean := path.Clean(dir)
		switch {
		case strings.ContainsFunc(dir, func(c rune) bool { return c < ' ' || c == 0x7f }):
			r.errs = append(r.errs, field.Invalid(p, dir, "must not hold control characters"))
		case !path.IsAbs(dir):
			r.errs = append(r.errs, field.Invalid(p, dir, "must be an absolute path in "+where))
		case clean != dir && clean+"/" != dir:
			r.errs = append(r.errs, field.Invalid(p, dir, "must be a clean path (no '..', '.' or '//'): "+clean+"?"))
		case !within(clean):
			r.errs = append(r.errs, field.Invalid(p, dir, "must be in "+where))
		default:
			return clean
		}
	}
	if r.prof.WorkingDir != "" {
		if r.dirs != nil && !within(r.prof.WorkingDir) {
			r.errs = append(r.errs, field.Invalid(podPath.Child("containers").Child("workingDir"), r.prof.WorkingDir, fmt.Sprintf(
				"profile %q sets workingDir %s, which this run does not mount: the working directory must be in %s; unset profiles.%s.workingDir in the clipjob config",
				r.prof.Name, r.prof.WorkingDir, where, r.prof.Name)))
			return ""
		}
		return r.prof.WorkingDir
	}
	return fallback
}

func (r *renderer) readOnlyRoot() bool {
	return r.prof.ReadOnlyRootFilesystem != nil && *r.prof.ReadOnlyRootFilesystem
}

func (r *renderer) image(c *corev1.Container, p *field.Path) {
	if c.Image != "" {
		return
	}
	c.Image = r.prof.Image
	if c.Image == "" {
		c.Image = r.in.Inherited.Image
	}
	if c.Image == "" {
		from := "the source Deployment " + r.in.Inherited.Source
		if r.in.Inherited.Tenant {
			from = "a tenant namespace (which inherits nothing)"
		}
		r.errs = append(r.errs, field.Required(p.Child("image"), fmt.Sprintf(
			"the container has no image, and neither %s nor profile %q gives one: set the container's image, or the profile's image in the clipjob config",
			from, r.prof.Name)))
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = r.prof.ImagePullPolicy
	}
}

// layeredEnv is the env every app container gets under its own: filtered
// inherited env, then the run's identity from its labels, then the profile.
func (r *renderer) layeredEnv(hasPrompt bool) []corev1.EnvVar {
	env := filterEnv(r.in.Inherited.Env, r.in.Config.Source.Env, r.prof.EnvKeys)
	var run []corev1.EnvVar
	for _, m := range contract.RunEnv {
		if v := r.job.Labels[m.Label]; v != "" || m.Label == contract.LabelSessionID {
			// The session is set even when empty: from the run's env
			// Secret (envFrom, which explicit env overrides) or the
			// server's env it would resume a session the Job does not name.
			run = append(run, corev1.EnvVar{Name: m.Env, Value: v})
		}
	}
	run = append(run, r.runOptions()...)
	r.withheld.runValues(run)
	env = config.MergeEnv(env, run)
	prof := []corev1.EnvVar{{Name: "HOME", Value: r.in.Inherited.DataMountPath}}
	if d := r.runDirs(); d != nil {
		prof = d.HomeEnv()
	}
	if r.prof.PermissionMode != "" {
		prof = append(prof, corev1.EnvVar{Name: contract.EnvPermissionMode, Value: r.prof.PermissionMode})
	}
	prof = append(prof, r.prof.Env...)
	if hasPrompt {
		prof = append(prof, corev1.EnvVar{Name: contract.EnvPromptFile, Value: path.Join(contract.PromptDir, contract.PromptFileName)})
	}
	return config.MergeEnv(env, prof)
}

type mountWithVolume struct {
	mount  corev1.VolumeMount
	volume corev1.Volume
}

// sharedMounts is what every app container mounts: the run's directories
// of the shared volume, inherited secrets, the prompt and the writable
// paths.
func (r *renderer) sharedMounts(prompt *corev1.Volume) []mountWithVolume {
	inh := r.in.Inherited
	out := r.dataMounts()
	secrets := map[string]corev1.Volume{}
	for _, v := range inh.SecretVolumes {
		secrets[v.Name] = v
	}
	for _, m := range inh.SecretMounts {
		if why, unlisted := r.withheld.volume(secrets[m.Name], m.MountPath); why != "" {
			if !unlisted {
				r.warn(fmt.Sprintf("Secret %s mounted at %s not inherited: %s", secrets[m.Name].Secret.SecretName, m.MountPath, why))
			}
			continue
		}
		out = append(out, mountWithVolume{mount: m, volume: secrets[m.Name]})
	}
	if prompt != nil {
		out = append(out, mountWithVolume{
			mount:  corev1.VolumeMount{Name: PromptVolume, MountPath: contract.PromptDir, ReadOnly: true},
			volume: *prompt,
		})
	}
	if r.readOnlyRoot() {
		// Each writable path holds at most the profile's ephemeral-storage
		// limit (the pod's limit bounds them together).
		var size *resource.Quantity
		if res := r.prof.Resources; res != nil {
			if q, ok := res.Limits[corev1.ResourceEphemeralStorage]; ok {
				size = &q
			}
		}
		for _, wp := range r.prof.WritablePaths {
			name := writableVolumeName(wp)
			out = append(out, mountWithVolume{
				mount:  corev1.VolumeMount{Name: name, MountPath: wp},
				volume: corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: size}}},
			})
		}
	}
	return out
}

// mount adds m to c unless c already mounts something at that path: what
// the Job mounts itself wins.
func (r *renderer) mount(c *corev1.Container, m mountWithVolume, p *field.Path) {
	for _, have := range c.VolumeMounts {
		if have.MountPath == m.mount.MountPath {
			return
		}
	}
	c.VolumeMounts = append(c.VolumeMounts, m.mount)
	for _, v := range r.volumes {
		if v.Name == m.volume.Name {
			return
		}
	}
	r.volumes = append(r.volumes, m.volume)
}

// addVolumes adds the volumes mounted above; a Job volume of the same name
// but another source is a conflict the client has to resolve.
func (r *renderer) addVolumes(spec *corev1.PodSpec) {
	for _, v := range r.volumes {
		i := slices.IndexFunc(spec.Volumes, func(have corev1.Volume) bool { return have.Name == v.Name })
		if i < 0 {
			spec.Volumes = append(spec.Volumes, v)
			continue
		}
		if !equality.Semantic.DeepEqual(spec.Volumes[i].VolumeSource, v.VolumeSource) {
			r.errs = append(r.errs, field.Invalid(volumesPath.Index(i).Child("name"), v.Name,
				"volume names starting "+contract.ReservedPrefix+" are clipjob's (the bare-Job contract reserves them), and clipjob mounts another volume under this one; rename the Job's volume"))
		}
	}
}

func writableVolumeName(p string) string {
	return reservedName(writableVolumePrefix, strings.Trim(strings.NewReplacer("/", "-", "_", "-", ".", "-").Replace(strings.ToLower(p)), "-"))
}

// promptVolume projects the prompt into a file: an inline prompt from the
// pod-template annotation through the downward API, a large one from a
// Secret key. It returns nil when the Job carries no prompt.
func (r *renderer) promptVolume() *corev1.Volume {
	ann := r.job.Spec.Template.Annotations
	_, inline := ann[contract.AnnotationPrompt]
	secretRef, bySecret := ann[contract.AnnotationPromptSecret]
	switch {
	case inline && bySecret:
		r.errs = append(r.errs, field.Invalid(tplAnnotations.Key(contract.AnnotationPromptSecret), secretRef,
			"set either "+contract.AnnotationPrompt+" or "+contract.AnnotationPromptSecret+", not both"))
		return nil
	case inline:
		return &corev1.Volume{Name: PromptVolume, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{
				Path:     contract.PromptFileName,
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations['" + contract.AnnotationPrompt + "']"},
			}},
		}}}
	case bySecret:
		name, key, _ := strings.Cut(secretRef, "/")
		if key == "" {
			key = contract.DefaultPromptKey
		}
		p := tplAnnotations.Key(contract.AnnotationPromptSecret)
		if why := r.serverSecret(name); why != "" {
			r.errs = append(r.errs, field.Forbidden(p, why))
			return nil
		}
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			r.errs = append(r.errs, field.Invalid(p, secretRef, "Secret name: "+msg+` (want "name" or "name/key")`))
		}
		for _, msg := range validation.IsConfigMapKey(key) {
			r.errs = append(r.errs, field.Invalid(p, secretRef, "Secret key: "+msg))
		}
		return &corev1.Volume{Name: PromptVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: name,
			Items:      []corev1.KeyToPath{{Key: key, Path: contract.PromptFileName}},
		}}}
	}
	return nil
}

// resources fills each resource the container leaves unset from the
// profile, keeping the pair valid: a default limit never falls below the
// container's own request, nor a default request above its own limit.
func (r *renderer) resources(c *corev1.Container) {
	def := r.prof.Resources
	if def == nil {
		return
	}
	res := &c.Resources
	for _, name := range slices.Sorted(maps.Keys(def.Limits)) {
		if _, set := res.Limits[name]; set {
			continue
		}
		lim := def.Limits[name]
		if req, ok := res.Requests[name]; ok && req.Cmp(lim) > 0 {
			lim = req
		}
		if res.Limits == nil {
			res.Limits = corev1.ResourceList{}
		}
		res.Limits[name] = lim
	}
	for _, name := range slices.Sorted(maps.Keys(def.Requests)) {
		if _, set := res.Requests[name]; set {
			continue
		}
		req := def.Requests[name]
		if lim, ok := res.Limits[name]; ok && req.Cmp(lim) > 0 {
			req = lim
		}
		if res.Requests == nil {
			res.Requests = corev1.ResourceList{}
		}
		res.Requests[name] = req
	}
}

func (r *renderer) warnMissingKeys(c *corev1.Container) {
	if len(c.EnvFrom) > 0 {
		return // an envFrom source may provide them; cannot know offline
	}
	for _, k := range r.prof.EnvKeys {
		found := false
		for _, e := range c.Env {
			if e.Name == k {
				found = true
				break
			}
		}
		switch {
		case found:
		case r.in.Inherited.Tenant:
			r.warn(fmt.Sprintf("container %q: profile %q expects env %s, which the Job does not set (a tenant namespace inherits nothing)", c.Name, r.prof.Name, k))
		default:
			r.warn(fmt.Sprintf("container %q: profile %q expects env %s, which neither the source %s nor the Job sets", c.Name, r.prof.Name, k, r.in.Inherited.Source))
		}
	}
}

func hasEnvFrom(list []corev1.EnvFromSource, e corev1.EnvFromSource) bool {
	for _, have := range list {
		if equality.Semantic.DeepEqual(have, e) {
			return true
		}
	}
	return false
}

func (r *renderer) pod(spec *corev1.PodSpec) {
	inh := r.in.Inherited
	for _, s := range inh.ImagePullSecrets {
		if !slices.Contains(spec.ImagePullSecrets, s) {
			spec.ImagePullSecrets = append(spec.ImagePullSecrets, s)
		}
	}
	if (spec.DNSPolicy == "" || spec.DNSPolicy == corev1.DNSClusterFirst) && inh.DNSPolicy != "" {
		spec.DNSPolicy = inh.DNSPolicy
	}
	if spec.DNSConfig == nil && inh.DNSConfig != nil {
		spec.DNSConfig = inh.DNSConfig.DeepCopy()
	}
	if spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		spec.RestartPolicy = corev1.RestartPolicyNever
	}
	r.sandbox(spec)
	enforcePodFloor(spec)
}

// sandbox applies what the profile sets about where and as whom the pod
// runs, over whatever the Job asked: a profile's sandbox (gVisor, an agent
// node pool, a ServiceAccount without rights) is the operator's, not a
// default the Job may replace. What the profile leaves unset, the Job
// chooses; policy.Evaluate checks the same rules on the final Job.
func (r *renderer) sandbox(spec *corev1.PodSpec) {
	prof := r.prof
	if prof.ServiceAccountName != "" {
		r.pin(spec.ServiceAccountName != "" && spec.ServiceAccountName != prof.ServiceAccountName,
			"serviceAccountName", spec.ServiceAccountName, prof.ServiceAccountName)
		spec.ServiceAccountName = prof.ServiceAccountName
	}
	if a := prof.AutomountServiceAccountToken; a != nil {
		r.pin(spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken != *a,
			"automountServiceAccountToken", fmt.Sprint(ptr.Deref(spec.AutomountServiceAccountToken, false)), fmt.Sprint(*a))
		spec.AutomountServiceAccountToken = ptr.To(*a)
	}
	for k, v := range prof.NodeSelector {
		if spec.NodeSelector == nil {
			spec.NodeSelector = map[string]string{}
		}
		spec.NodeSelector[k] = v
	}
	if len(prof.Tolerations) > 0 {
		spec.Tolerations = slices.Clone(prof.Tolerations)
	}
	if rc := prof.RuntimeClassName; rc != nil {
		r.pin(spec.RuntimeClassName != nil && *spec.RuntimeClassName != *rc,
			"runtimeClassName", ptr.Deref(spec.RuntimeClassName, ""), *rc)
		spec.RuntimeClassName = ptr.To(*rc)
	}
}

// pin refuses, when conflict, a pod field the Job set to other than its
// profile's value: the profile's value is the operator's and applies, but
// replacing what a client wrote without a word would run its pod otherwise
// than it asked (a token it expects, missing). The message names the one
// setting that would let the Job through.
func (r *renderer) pin(conflict bool, fieldName, got, want string) {
	if !conflict {
		return
	}
	r.errs = append(r.errs, field.Invalid(podPath.Child(fieldName), got, fmt.Sprintf(
		"profile %q sets %s %s, and a Job cannot replace its profile's sandbox: leave it unset, or set profiles.%s.%s: %s in the clipjob config to run this adapter's pods so",
		r.prof.Name, fieldName, want, r.prof.Name, fieldName, got)))
}

func (r *renderer) jobSpec() {
	s, prof := &r.job.Spec, r.prof
	if (s.BackoffLimit == nil || *s.BackoffLimit == apiDefaultBackoffLimit) && s.BackoffLimitPerIndex == nil && prof.BackoffLimit != nil {
		s.BackoffLimit = ptr.To(*prof.BackoffLimit)
	}
	if s.TTLSecondsAfterFinished == nil && prof.TTLSecondsAfterFinished != nil {
		s.TTLSecondsAfterFinished = ptr.To(*prof.TTLSecondsAfterFinished)
	}
	if s.ActiveDeadlineSeconds == nil && prof.ActiveDeadlineSeconds != nil {
		s.ActiveDeadlineSeconds = ptr.To(*prof.ActiveDeadlineSeconds)
	}
	// One agent pod at a time, whatever the client set: more would be
	// several runs of one agent under one claim, and a replacement pod must
	// wait until the one it replaces has stopped writing to the shared
	// volume (the API's default starts it while that one terminates).
	s.Parallelism, s.Completions = ptr.To[int32](1), ptr.To[int32](1)
	s.PodReplacementPolicy = ptr.To(batchv1.Failed)
	// In Queue mode every agent run starts suspended and waits for its
	// turn; the claim controller unsuspends it. Always, whatever the client
	// set: the mutating webhook sees only CREATE, so a started Job is never
	// re-rendered, and a client cannot skip the queue.
	if r.in.Config.Policy.Concurrency.Mode == config.ModeQueue {
		if r.job.Annotations == nil {
			r.job.Annotations = map[string]string{}
		}
		r.job.Annotations[contract.AnnotationQueued] = "true"
		s.Suspend = ptr.To(true)
	}
}

// labels carries the contract labels to the pods, where NetworkPolicies and
// the log relay select them. Role and egress profile are set, not
// defaulted: a client cannot pick a wider egress profile.
func (r *renderer) labels() {
	tpl := &r.job.Spec.Template
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	// The pods carry exactly the Job's contract labels: the relay, the
	// egress policies and Paperclip trust them, so one the Job does not
	// carry (a company id of another tenant) is dropped.
	for k := range tpl.Labels {
		if strings.HasPrefix(k, contract.Prefix) {
			delete(tpl.Labels, k)
		}
	}
	for k, v := range r.job.Labels {
		if strings.HasPrefix(k, contract.Prefix) {
			tpl.Labels[k] = v
		}
	}
	tpl.Labels[contract.LabelRole] = contract.RoleAgent
	tpl.Labels[contract.LabelEgress] = r.prof.EgressProfile
	r.job.Labels[contract.LabelEgress] = r.prof.EgressProfile
}

func (r *renderer) annotate() {
	if r.job.Annotations == nil {
		r.job.Annotations = map[string]string{}
	}
	r.job.Annotations[contract.AnnotationProfile] = r.prof.Name
	r.job.Annotations[contract.AnnotationSource] = r.in.Inherited.Source + " " + r.in.Inherited.Revision
	r.job.Annotations[contract.AnnotationTemplateHash] = r.in.Hashes.get(r.prof, r.in.Inherited, r.in.Config)
	if r.in.Creator != "" {
		r.job.Annotations[contract.AnnotationCreatedBy] = r.in.Creator
	}
}

// TemplateHash identifies the inputs a Job was rendered from (profile,
// inherited values, env filter), not the Job: re-rendering keeps it.
func TemplateHash(prof config.Resolved, inh *Inherited, cfg *config.Config) string {
	data, err := json.Marshal(struct {
		V         string
		Profile   config.Resolved
		Inh       *Inherited
		Env       config.EnvFilter
		Isolation config.Isolation
	}{templateVersion, prof, inh, cfg.Source.Env, cfg.Isolation})
	if err != nil {
		panic("hashing render inputs: " + err.Error()) // plain data; cannot fail
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}
