package config

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Resolved is a profile with every layer applied: built-in defaults, the
// configured defaults, the built-in profile and the configured profile.
type Resolved struct {
	// Name is the profile's canonical name, never an alias.
	Name string
	Profile
}

// Profile returns the resolved profile for an adapter-type label value (a
// profile name or an alias); an empty value selects DefaultProfile.
func (c *Config) Profile(adapterType string) (Resolved, bool) {
	if adapterType == "" {
		adapterType = c.DefaultProfile
	}
	if name, ok := c.aliases[adapterType]; ok {
		adapterType = name
	}
	p, ok := c.resolved[adapterType]
	return p, ok
}

// JobProfile returns the profile an agent Job runs under: its adapter
// type's, or for a type no profile knows, DefaultProfile's (known false).
// Paperclip has more adapter types than profiles; a Job of an unknown type
// that brings its own containers still gets the shared volume, the floor
// and the claim, and one without containers gets the default profile's
// clear error.
func (c *Config) JobProfile(adapterType string) (p Resolved, known bool) {
	if p, ok := c.Profile(adapterType); ok {
		return p, true
	}
	p, _ = c.Profile("")
	return p, false
}

// ProfileNames lists the canonical profile names, sorted.
func (c *Config) ProfileNames() []string { return sortedKeys(c.resolved) }

// resolveProfiles layers every profile once, at load time, so admission
// never merges profiles on the hot path.
func (c *Config) resolveProfiles() {
	builtin := builtinProfiles()
	base := layer(builtinDefaults(), c.Defaults)
	c.resolved = map[string]Resolved{}
	c.aliases = map[string]string{}
	names := map[string]bool{}
	for n := range builtin {
		names[n] = true
	}
	for n := range c.Profiles {
		names[n] = true
	}
	for n := range names {
		p := layer(layer(base, builtin[n]), c.Profiles[n])
		c.resolved[n] = Resolved{Name: n, Profile: p}
		for _, a := range p.Aliases {
			c.aliases[a] = n
		}
	}
}

// layer returns base with every field that over sets taken from over.
// Lists keyed by name (env, resources, node selector) merge; other lists
// are replaced when over sets them.
func layer(base, over Profile) Profile {
	out := base
	out.Aliases = union(base.Aliases, over.Aliases)
	setIf(&out.Image, over.Image)
	setIf(&out.ImagePullPolicy, over.ImagePullPolicy)
	setIf(&out.ContainerName, over.ContainerName)
	if over.Command != nil {
		out.Command = over.Command
	}
	if over.Args != nil {
		out.Args = over.Args
	}
	setIf(&out.WorkingDir, over.WorkingDir)
	setIf(&out.PermissionMode, over.PermissionMode)
	out.Env = MergeEnv(base.Env, over.Env)
	out.EnvKeys = union(base.EnvKeys, over.EnvKeys)
	out.Resources = mergeResources(base.Resources, over.Resources)
	setIf(&out.EgressProfile, over.EgressProfile)
	setPtr(&out.ActiveDeadlineSeconds, over.ActiveDeadlineSeconds)
	setPtr(&out.StartTimeoutSeconds, over.StartTimeoutSeconds)
	setPtr(&out.TTLSecondsAfterFinished, over.TTLSecondsAfterFinished)
	setPtr(&out.BackoffLimit, over.BackoffLimit)
	if len(over.NodeSelector) > 0 {
		merged := map[string]string{}
		for k, v := range base.NodeSelector {
			merged[k] = v
		}
		for k, v := range over.NodeSelector {
			merged[k] = v
		}
		out.NodeSelector = merged
	}
	if over.Tolerations != nil {
		out.Tolerations = over.Tolerations
	}
	setPtr(&out.RuntimeClassName, over.RuntimeClassName)
	setIf(&out.ServiceAccountName, over.ServiceAccountName)
	setPtr(&out.AutomountServiceAccountToken, over.AutomountServiceAccountToken)
	setPtr(&out.ReadOnlyRootFilesystem, over.ReadOnlyRootFilesystem)
	if over.WritablePaths != nil {
		out.WritablePaths = over.WritablePaths
	}
	return out
}

// MergeEnv returns low with every entry of high applied by name: an entry
// of high replaces the one of low with the same name in place, new ones are
// appended in their order. Keeping positions stable matters because
// $(VAR) references only see entries defined earlier.
func MergeEnv(low, high []corev1.EnvVar) []corev1.EnvVar {
	if len(high) == 0 {
		return low
	}
	out := make([]corev1.EnvVar, 0, len(low)+len(high))
	index := make(map[string]int, len(low)+len(high))
	for _, e := range low {
		index[e.Name] = len(out)
		out = append(out, e)
	}
	for _, e := range high {
		if i, ok := index[e.Name]; ok {
			out[i] = e
			continue
		}
		index[e.Name] = len(out)
		out = append(out, e)
	}
	return out
}

func mergeResources(base, over *corev1.ResourceRequirements) *corev1.ResourceRequirements {
	if over == nil {
		return base
	}
	if base == nil {
		return over
	}
	merge := func(a, b corev1.ResourceList) corev1.ResourceList {
		out := corev1.ResourceList{}
		for k, v := range a {
			out[k] = v
		}
		for k, v := range b {
			out[k] = v
		}
		return out
	}
	return &corev1.ResourceRequirements{
		Requests: merge(base.Requests, over.Requests),
		Limits:   merge(base.Limits, over.Limits),
	}
}

func setIf[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

func setPtr[T any](dst **T, v *T) {
	if v != nil {
		*dst = v
	}
}

func union(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range append(append([]string{}, a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// ProfileImages lists the images the profiles set; they are as trusted as
// the configuration itself.
func (c *Config) ProfileImages() []string {
	var out []string
	for _, n := range sortedKeys(c.resolved) {
		if img := c.resolved[n].Image; img != "" {
			out = append(out, img)
		}
	}
	return out
}

// IsTenant reports whether agents in namespace run apart from the server
// (TenantNamespaces).
func (c *Config) IsTenant(namespace string) bool {
	return MatchAny(c.TenantNamespaces, namespace)
}
