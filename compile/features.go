package compile

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/templates"
)

// A feature is one thing a bare Job may carry that changes its render: a
// run label, a run option, the env Secret, the working directory, the
// prompt. The compiler renders a probe Job with every feature, then
// without each in turn; what differs is that feature's, guarded by its
// condition in the policy, with the probe's sentinel values replaced by
// the request's.
type feature struct {
	name string
	// set puts the feature on a probe Job, with sentinel values.
	set func(j *batchv1.Job)
	// present is the CEL condition under which a request's Job has it.
	present string
	// subst maps each sentinel set puts on the probe to the CEL
	// expression of the request's value.
	subst map[string]string
	// required: Render refuses a Job without it (a confined run's agent
	// and company), so the policy applies only to Jobs that carry it and
	// no render without it is compared.
	required bool
}

// sentinel is a probe value no real input holds: lowercase letters, digits
// and dashes, valid as a label value, a Secret name, a model name and a
// path segment. The compiler checks that no render without the feature
// contains it, so an exact match in the render can only be the feature's.
func sentinel(what string) string { return sentinelPrefix + what }

const sentinelPrefix = "clipjob-sentinel-"

// maxTurnsSentinel: a turn limit must be a number; checked like the others.
const maxTurnsSentinel = "9973"

const (
	labelsExpr      = "object.metadata.labels"
	annotationsExpr = "object.metadata.annotations"
	tplAnnotations  = "object.spec.template.metadata.annotations"
)

func labelValue(key string) string { return fmt.Sprintf("%s[%s]", labelsExpr, celString(key)) }

func hasLabel(key string) string {
	return fmt.Sprintf("(%s in %s && %s != '')", celString(key), labelsExpr, labelValue(key))
}

func annotation(key string) string { return fmt.Sprintf("%s[%s]", annotationsExpr, celString(key)) }

func hasAnnotation(key string) string {
	return fmt.Sprintf("(has(%s) && %s in %s)", annotationsExpr, celString(key), annotationsExpr)
}

func hasTplAnnotation(key string) string {
	return fmt.Sprintf("(has(%s) && %s in %s)", tplAnnotations, celString(key), tplAnnotations)
}

func tplAnnotation(key string) string { return fmt.Sprintf("%s[%s]", tplAnnotations, celString(key)) }

// labelSentinel is the probe's value of a run label.
func labelSentinel(label string) string { return sentinel(strings.TrimPrefix(label, contract.Prefix)) }

// confinedLabels are the labels a confined run's directories are named by.
var confinedLabels = []string{contract.LabelAgentID, contract.LabelCompanyID}

// probeDirs are the directories of a probe Job's run (for a confined run),
// its agent and company sentinels in their names.
func probeDirs(cfg *config.Config) templates.RunDirs {
	return templates.DirsFor(cfg.Isolation, labelSentinel(contract.LabelAgentID), labelSentinel(contract.LabelCompanyID))
}

// confined reports whether cfg's runs mount only their own directories
// (a tenant namespace's, which mount none, are never compiled).
func confined(cfg *config.Config) bool { return cfg.Isolation.Mode != config.IsolationShared }

// features lists what a bare Job may carry, for a source whose shared
// volume is mounted at dataPath. Their order is the order of the
// operations in the policy, nothing else.
func features(dataPath string, cfg *config.Config) []*feature {
	var fs []*feature
	for _, m := range contract.RunEnv {
		s := labelSentinel(m.Label)
		fs = append(fs, &feature{
			name:     m.Label,
			set:      func(j *batchv1.Job) { j.Labels[m.Label] = s },
			present:  hasLabel(m.Label),
			subst:    map[string]string{s: labelValue(m.Label)},
			required: confined(cfg) && slices.Contains(confinedLabels, m.Label),
		})
	}
	// Run options and the env Secret: the annotation's value as it is.
	for _, a := range []struct{ key, sentinel string }{{contract.AnnotationModel, sentinel("model")},
		{contract.AnnotationMaxTurns, maxTurnsSentinel}, {contract.AnnotationEnvSecret, sentinel("env-secret")}} {
		key, s := a.key, a.sentinel
		fs = append(fs, &feature{
			name:    key,
			set:     func(j *batchv1.Job) { j.Annotations[key] = s },
			present: hasAnnotation(key),
			subst:   map[string]string{s: annotation(key)},
		})
	}
	workDir := path.Join(dataPath, sentinel("working-dir"))
	if confined(cfg) {
		workDir = path.Join(probeDirs(cfg).Workspace, sentinel("working-dir"))
	}
	dir := annotation(contract.AnnotationWorkingDir)
	fs = append(fs, &feature{
		name:    contract.AnnotationWorkingDir,
		set:     func(j *batchv1.Job) { j.Annotations[contract.AnnotationWorkingDir] = workDir },
		present: hasAnnotation(contract.AnnotationWorkingDir),
		// Render uses the clean path: the annotation without a trailing
		// slash (the domain admits only clean paths, with or without one).
		subst: map[string]string{workDir: fmt.Sprintf("((%[1]s.endsWith('/') && size(%[1]s) > 1) ? %[1]s.substring(0, size(%[1]s) - 1) : %[1]s)", dir)},
	})
	fs = append(fs, &feature{
		name: "prompt",
		set: func(j *batchv1.Job) {
			j.Spec.Template.Annotations[contract.AnnotationPrompt] = sentinel("prompt")
		},
		present: fmt.Sprintf("(%s || %s)", hasTplAnnotation(contract.AnnotationPrompt), hasTplAnnotation(contract.AnnotationPromptSecret)),
	})
	return fs
}

// The prompt may come from a Secret instead of the annotation: the probe
// renders once more that way, and what differs is chosen by which
// annotation the request's Job carries.
var (
	promptSecretName = sentinel("prompt-secret")
	promptSecretKey  = sentinel("prompt-key")
)

func setPromptSecret(j *batchv1.Job) {
	delete(j.Spec.Template.Annotations, contract.AnnotationPrompt)
	j.Spec.Template.Annotations[contract.AnnotationPromptSecret] = promptSecretName + "/" + promptSecretKey
}

func promptSecretSubst() map[string]string {
	ref := tplAnnotation(contract.AnnotationPromptSecret)
	return map[string]string{
		promptSecretName: fmt.Sprintf("%s.split('/')[0]", ref),
		promptSecretKey: fmt.Sprintf("((size(%[1]s.split('/')) > 1 && %[1]s.split('/')[1] != '') ? %[1]s.split('/')[1] : %[2]s)",
			ref, celString(contract.DefaultPromptKey)),
	}
}

// creatorSentinel stands for the requesting user.
var creatorSentinel = sentinel("creator")

// Patterns of the values Render accepts, as RE2 for CEL's matches().
var (
	dns1123Subdomain = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	configMapKey     = `^[-._a-zA-Z0-9]+$`
	maxTurns         = `^(10000|[1-9][0-9]{0,3})$`
	// A clean absolute path, with or without a trailing slash: no empty,
	// "." or ".." segment, no control character.
	cleanAbsPath = `^/(` + segment + `(/` + segment + `)*/?)?$`
	segment      = `([^/.\x00-\x1f\x7f][^/\x00-\x1f\x7f]*|\.[^/.\x00-\x1f\x7f][^/\x00-\x1f\x7f]*|\.\.[^/\x00-\x1f\x7f]+)`
)

// The patterns must compile as RE2 (Go's regexp is RE2 too).
var _ = regexp.MustCompile(dns1123Subdomain + configMapKey + maxTurns + cleanAbsPath)

// validValues is the CEL condition that every run value the Job carries
// is one Render accepts: otherwise Render refuses the Job (422), which a
// mutating policy cannot do, so such a Job is left to clipjob's webhook.
func validValues(inh *templates.Inherited, cfg *config.Config) string {
	model, turns := annotation(contract.AnnotationModel), annotation(contract.AnnotationMaxTurns)
	envSecret, dir := annotation(contract.AnnotationEnvSecret), annotation(contract.AnnotationWorkingDir)
	ref := tplAnnotation(contract.AnnotationPromptSecret)
	data := strings.TrimSuffix(inh.DataMountPath, "/")
	server := serverSecrets(inh)
	name := fmt.Sprintf("%s.split('/')[0]", ref)
	key := fmt.Sprintf("%s.split('/')[1]", ref)
	conds := []string{
		fmt.Sprintf("(!%s || %s.matches(%s))", hasAnnotation(contract.AnnotationModel), model, celString(templates.ModelNamePattern)),
		fmt.Sprintf("(!%s || %s.matches(%s))", hasAnnotation(contract.AnnotationMaxTurns), turns, celString(maxTurns)),
		fmt.Sprintf("(!%s || (size(%[2]s) <= 253 && %[2]s.matches(%[3]s) && !(%[2]s in %[4]s)))",
			hasAnnotation(contract.AnnotationEnvSecret), envSecret, celString(dns1123Subdomain), server),
		fmt.Sprintf("(!%s || (%s.matches(%s) && (%s)))",
			hasAnnotation(contract.AnnotationWorkingDir), dir, celString(cleanAbsPath), workingDirWithin(dir, data, cfg)),
		fmt.Sprintf("!(%s && %s)", hasTplAnnotation(contract.AnnotationPrompt), hasTplAnnotation(contract.AnnotationPromptSecret)),
		fmt.Sprintf("(!%s || (size(%[2]s.split('/')) <= 2 && size(%[3]s) <= 253 && %[3]s.matches(%[4]s) && !(%[3]s in %[5]s) && "+
			"(size(%[2]s.split('/')) == 1 || %[6]s == '' || (size(%[6]s) <= 253 && %[6]s.matches(%[7]s) && %[6]s != '.' && !%[6]s.startsWith('..')))))",
			hasTplAnnotation(contract.AnnotationPromptSecret), ref, name, celString(dns1123Subdomain), server, key, celString(configMapKey)),
	}
	if confined(cfg) {
		// A confined run's directories are named by its agent and
		// company: Render refuses a Job without them, or with one that is
		// not a plain path segment.
		for _, l := range confinedLabels {
			conds = append(conds, fmt.Sprintf("(%s && %s.matches(%s) && !(%[2]s in ['.', '..']))",
				hasLabel(l), labelValue(l), celString(pathSegment)))
		}
	}
	return strings.Join(conds, " && ")
}

// pathSegment is config.PathSegment's alphabet and length.
const pathSegment = `^[A-Za-z0-9._-]{1,253}$`

// workingDirWithin is the CEL condition that the clean absolute path dir
// (with or without a trailing slash) is in a directory the run mounts
// writable: its own directories when confined (named by its labels), else
// the shared volume at data.
func workingDirWithin(dir, data string, cfg *config.Config) string {
	writable := []string{celString(data)}
	if confined(cfg) {
		subst := map[string]string{}
		for _, l := range confinedLabels {
			subst[labelSentinel(l)] = labelValue(l)
		}
		writable = nil
		for _, w := range probeDirs(cfg).Writable() {
			writable = append(writable, spliced(w, subst))
		}
	}
	var within []string
	for _, w := range writable {
		within = append(within, fmt.Sprintf("%[1]s == %[2]s || %[1]s.startsWith(%[2]s + '/')", dir, w))
	}
	return strings.Join(within, " || ")
}

// serverSecrets is the CEL list of the Secrets the server's Deployment
// reads: never a run's (Render refuses them with 403).
func serverSecrets(inh *templates.Inherited) string {
	var names []string
	for _, s := range inh.ReadSecrets() {
		names = append(names, celString(s))
	}
	return "[" + strings.Join(names, ", ") + "]"
}
