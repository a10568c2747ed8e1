package templates

import (
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/paperclipai/clipjob/config"
)

// withheld is what the source holds under a denied env name, by every
// route it could take to an agent: the deny list names variables, but the
// principle is about values — the database URL stays the server's under
// any name, through env, envFrom, a secret volume or the Job's own env.
// Only a profile hands such a value over, on purpose, in its own env.
type withheld struct {
	deny []string
	// secretKeys are the (Secret, key) pairs denied variables read.
	secretKeys map[[2]string]bool
	// secrets are the Secrets denied variables read: their volumes are
	// withheld whole.
	secrets map[string]bool
	// values are the literal values of denied variables.
	values map[string]bool
	// paths are denied literal values that are absolute paths (a key file
	// such as PAPERCLIP_SECRETS_MASTER_KEY_FILE): a secret mount holding
	// one is withheld.
	paths []string
	// profile are the names the profile sets itself: handed over on
	// purpose.
	profile map[string]bool
	// run are the run's own values (its labels and run options) by the
	// name clipjob sets them under: the client wrote them into the Job,
	// so one equal to a server's value hands nothing over, and they are
	// not withheld for their value (the compiled admission policies, which
	// cannot see the server's values, set them the same way).
	run map[string]string
	// secretVolumes are the Secrets whose volumes the operator hands
	// agents (source.secretVolumes); dataPath is where the shared volume
	// is mounted, on which no secret volume is handed over.
	secretVolumes []string
	dataPath      string
}

// runValues records the run's own env (see withheld.run).
func (w *withheld) runValues(run []corev1.EnvVar) {
	w.run = make(map[string]string, len(run))
	for _, e := range run {
		w.run[e.Name] = e.Value
	}
}

// newWithheld reads what of the source's container env is the server's
// own: src's deny list over env, the profile's own names aside. Secret
// volumes go by src's list, never one mounted at or under dataPath.
func newWithheld(env []corev1.EnvVar, src config.Source, dataPath string, profileEnv []corev1.EnvVar) *withheld {
	w := &withheld{deny: src.Env.Deny, secretKeys: map[[2]string]bool{}, secrets: map[string]bool{}, values: map[string]bool{}, profile: map[string]bool{},
		secretVolumes: src.SecretVolumes, dataPath: path.Clean(dataPath)}
	for _, e := range profileEnv {
		w.profile[e.Name] = true
	}
	for _, e := range env {
		if !config.MatchAny(w.deny, e.Name) {
			continue
		}
		if ref := secretKeyRef(e); ref != nil {
			w.secretKeys[[2]string{ref.Name, ref.Key}] = true
			w.secrets[ref.Name] = true
		}
		if len(e.Value) >= 6 {
			w.values[e.Value] = true
			if path.IsAbs(e.Value) {
				w.paths = append(w.paths, path.Clean(e.Value))
			}
		}
	}
	return w
}

func secretKeyRef(e corev1.EnvVar) *corev1.SecretKeySelector {
	if e.ValueFrom == nil {
		return nil
	}
	return e.ValueFrom.SecretKeyRef
}

// why says why e is withheld, or "" if it is not.
func (w *withheld) why(e corev1.EnvVar) string {
	if w.profile[e.Name] {
		return ""
	}
	switch ref := secretKeyRef(e); {
	case config.MatchAny(w.deny, e.Name):
		return "its name is denied (source.env.deny)"
	case ref != nil && w.secretKeys[[2]string{ref.Name, ref.Key}]:
		return fmt.Sprintf("it reads Secret %s key %s, which the server holds under a denied name", ref.Name, ref.Key)
	case e.Value != "" && w.values[e.Value] && !w.isRunValue(e):
		return "its value is one the server holds under a denied name"
	}
	return ""
}

// envOver is a container's own env over the env every app container gets
// (layered), less what is withheld, saying what and why. A variable of
// the container's own that is withheld gives way to the layered one of its
// name, if that one is not withheld itself, instead of leaving the name
// unset: unset, a second render would put the layered value back, and the
// validating webhook holds every Job to be a fixed point of its render.
// It also keeps a run value (the agent id, the session) from being left
// for an envFrom Secret to fill.
func (w *withheld) envOver(container string, layered, own []corev1.EnvVar, warn func(string)) []corev1.EnvVar {
	merged := config.MergeEnv(layered, own)
	byName := make(map[string]corev1.EnvVar, len(layered))
	for _, e := range layered {
		byName[e.Name] = e
	}
	out := make([]corev1.EnvVar, 0, len(merged))
	for _, e := range merged {
		why := w.why(e)
		if why == "" {
			out = append(out, e)
			continue
		}
		warn(fmt.Sprintf("container %q: env %s withheld: %s; to hand it over, set it in the profile's env", container, e.Name, why))
		if l, ok := byName[e.Name]; ok && !equality.Semantic.DeepEqual(l, e) && w.why(l) == "" {
			out = append(out, l)
		}
	}
	return out
}

func (w *withheld) isRunValue(e corev1.EnvVar) bool {
	v, ok := w.run[e.Name]
	return ok && e.ValueFrom == nil && e.Value == v
}

// env drops what is withheld from a container's env, saying what and why.
func (w *withheld) env(container string, env []corev1.EnvVar, warn func(string)) []corev1.EnvVar {
	return slices.DeleteFunc(env, func(e corev1.EnvVar) bool {
		why := w.why(e)
		if why != "" {
			warn(fmt.Sprintf("container %q: env %s withheld: %s; to hand it over, set it in the profile's env", container, e.Name, why))
		}
		return why != ""
	})
}

// envFrom keeps the entries whose ConfigMap or Secret the operator lists
// (source.env.allowFrom): an envFrom hands over every key of its source,
// so the name filter cannot apply. A listed Secret that backs a denied
// variable is withheld all the same, saying so.
func (w *withheld) envFrom(list []corev1.EnvFromSource, allow []string, warn func(string)) []corev1.EnvFromSource {
	return slices.DeleteFunc(slices.Clone(list), func(e corev1.EnvFromSource) bool {
		name, secret := envFromSource(e)
		if !config.MatchAny(allow, name) {
			return true
		}
		if secret && w.secrets[name] {
			warn(fmt.Sprintf("envFrom Secret %s not inherited though source.env.allowFrom lists it: the server reads it under a denied env name", name))
			return true
		}
		return false
	})
}

// volume says why a secret volume mounted at mountPath is withheld, or ""
// when it is handed over. Unlisted is true when only the operator's list
// left it out: that is the default, not worth a warning.
func (w *withheld) volume(v corev1.Volume, mountPath string) (why string, unlisted bool) {
	mp := path.Clean(mountPath)
	if mp == w.dataPath || strings.HasPrefix(mp, w.dataPath+"/") || strings.HasPrefix(w.dataPath, mp+"/") {
		// The server may keep its keys there (Paperclip's secrets/ and
		// .env under its home): a run mounts only its own directories of
		// that path.
		return fmt.Sprintf("it is mounted on the shared volume's path %s, of which a run mounts only its own directories", w.dataPath), false
	}
	if v.Secret == nil || !config.MatchAny(w.secretVolumes, v.Secret.SecretName) {
		return "source.secretVolumes does not list it", true
	}
	if w.secrets[v.Secret.SecretName] {
		return fmt.Sprintf("Secret %s backs a denied env var", v.Secret.SecretName), false
	}
	for _, p := range w.paths {
		if p == mp || strings.HasPrefix(p, mp+"/") {
			return fmt.Sprintf("it holds %s, a path the server names under a denied env var", p), false
		}
	}
	return "", false
}
