package config

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/paperclipai/clipjob/internal/imageref"
)

var (
	sourcePath   = field.NewPath("source")
	defaultsPath = field.NewPath("defaults")
	profilesPath = field.NewPath("profiles")
)

// maxStartTimeoutSeconds bounds startTimeoutSeconds: a week is more than
// any image pull, and keeps the duration far from overflowing.
const maxStartTimeoutSeconds = 7 * 24 * 3600

func (c *Config) validate() field.ErrorList {
	errs := c.validateTenants()
	if c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{Kind}))
	}
	errs = append(errs, validateSource(c.Source, sourcePath)...)
	errs = append(errs, validateIsolation(c.Isolation, c.Source.DataMountPath, field.NewPath("isolation"))...)
	if _, ok := c.resolved[c.DefaultProfile]; !ok {
		errs = append(errs, field.NotSupported(field.NewPath("defaultProfile"), c.DefaultProfile, c.ProfileNames()))
	}
	errs = append(errs, validateProfile(c.Defaults, defaultsPath)...)
	for _, name := range sortedKeys(c.Profiles) {
		p := profilesPath.Key(name)
		for _, msg := range validation.IsValidLabelValue(name) {
			errs = append(errs, field.Invalid(p, name, "profile names are adapter-type label values: "+msg))
		}
		errs = append(errs, validateProfile(c.Profiles[name], p)...)
	}
	errs = append(errs, c.validateAliases()...)
	errs = append(errs, validatePolicy(c.Policy, field.NewPath("policy"))...)
	// Requests above limits can come from two layers (defaults and a
	// profile), so it is checked on the resolved profiles.
	for _, name := range sortedKeys(c.resolved) {
		p := profilesPath.Key(name).Child("resources")
		if _, own := c.Profiles[name]; !own {
			p = defaultsPath.Child("resources")
		}
		errs = append(errs, validateRequestsWithinLimits(c.resolved[name].Resources, p)...)
	}
	return errs
}

func validatePolicy(pol Policy, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, g := range pol.Images.Allow {
		if _, err := imageref.ParsePattern(g); err != nil {
			errs = append(errs, field.Invalid(p.Child("images", "allow").Index(i), g, err.Error()))
		}
	}
	for i, ns := range pol.Namespaces {
		errs = append(errs, dns(validation.IsDNS1123Label, ns, p.Child("namespaces").Index(i))...)
	}
	cp := p.Child("concurrency")
	c := pol.Concurrency
	if c.Mode != ModeReject && c.Mode != ModeQueue && c.Mode != ModeDisabled {
		errs = append(errs, field.NotSupported(cp.Child("mode"), c.Mode, []ConcurrencyMode{ModeReject, ModeQueue, ModeDisabled}))
	}
	if c.Scope != ScopeNamespace && c.Scope != ScopeCluster {
		errs = append(errs, field.NotSupported(cp.Child("scope"), c.Scope, []ConcurrencyScope{ScopeNamespace, ScopeCluster}))
	}
	errs = append(errs, dns(validation.IsDNS1123Label, c.ClaimNamespace, cp.Child("claimNamespace"))...)
	if c.MaxQueued < 0 {
		errs = append(errs, field.Invalid(cp.Child("maxQueued"), c.MaxQueued, "must be 0 (unbounded) or more"))
	}
	if c.PendingGraceSeconds < 0 {
		errs = append(errs, field.Invalid(cp.Child("pendingGraceSeconds"), c.PendingGraceSeconds, "must be 0 or more"))
	}
	for i, g := range pol.Secrets.Shared {
		errs = append(errs, glob(g, p.Child("secrets", "shared").Index(i))...)
	}
	sc := p.Child("sharedClaim")
	if m := pol.SharedClaim.Mode; m != SharedClaimEnforce && m != SharedClaimDisabled {
		errs = append(errs, field.NotSupported(sc.Child("mode"), m, []SharedClaimMode{SharedClaimEnforce, SharedClaimDisabled}))
	}
	for i, d := range pol.SharedClaim.Deployments {
		p := sc.Child("deployments").Index(i)
		ns, name, ok := strings.Cut(d, "/")
		if !ok {
			errs = append(errs, field.Invalid(p, d, "a Deployment is named with its namespace, namespace/name (a name alone would let anyone who may create Deployments in any agent namespace take it)"))
			continue
		}
		errs = append(errs, dns(validation.IsDNS1123Label, ns, p)...)
		errs = append(errs, dns(validation.IsDNS1123Subdomain, name, p)...)
	}
	for i, g := range pol.Claims {
		errs = append(errs, glob(g, p.Child("claims").Index(i))...)
	}
	for i, g := range pol.CSIDrivers {
		errs = append(errs, glob(g, p.Child("csiDrivers").Index(i))...)
	}
	return errs
}

func validateIsolation(iso Isolation, dataMountPath string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch iso.Mode {
	case IsolationAgent, IsolationCompany, IsolationShared:
	default:
		errs = append(errs, field.NotSupported(p.Child("mode"), iso.Mode, []IsolationMode{IsolationAgent, IsolationCompany, IsolationShared}))
	}
	home := p.Child("paperclipHome")
	if e := absPath(iso.PaperclipHome, home); e != nil {
		errs = append(errs, e...)
	} else if !PathWithin(iso.PaperclipHome, dataMountPath) {
		errs = append(errs, field.Invalid(home, iso.PaperclipHome, fmt.Sprintf(
			"the server's PAPERCLIP_HOME must be on the shared volume: %s or a directory under it (source.dataMountPath)", dataMountPath)))
	}
	if !PathSegment(iso.Instance) {
		errs = append(errs, field.Invalid(p.Child("instance"), iso.Instance,
			"the server's PAPERCLIP_INSTANCE_ID: one path segment of letters, digits, '.', '_' and '-' (default \"default\")"))
	}
	return errs
}

// PathWithin reports whether the clean absolute path p is dir or under it.
func PathWithin(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// PathSegment reports whether s can name one directory: letters, digits,
// '.', '_' and '-', not "." or "..", at most 253 characters. Agent and
// company ids (label values) always are.
func PathSegment(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 253 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validateSource(s Source, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, dns(validation.IsDNS1123Label, s.Namespace, p.Child("namespace"))...)
	errs = append(errs, dns(validation.IsDNS1123Subdomain, s.Deployment, p.Child("deployment"))...)
	errs = append(errs, dns(validation.IsDNS1123Label, s.Container, p.Child("container"))...)
	errs = append(errs, absPath(s.DataMountPath, p.Child("dataMountPath"))...)
	for i, g := range s.Env.Allow {
		errs = append(errs, glob(g, p.Child("env", "allow").Index(i))...)
	}
	for i, g := range s.Env.Deny {
		errs = append(errs, glob(g, p.Child("env", "deny").Index(i))...)
	}
	for i, g := range s.Env.AllowFrom {
		errs = append(errs, glob(g, p.Child("env", "allowFrom").Index(i))...)
	}
	return errs
}

func validateProfile(pr Profile, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, a := range pr.Aliases {
		for _, msg := range validation.IsValidLabelValue(a) {
			errs = append(errs, field.Invalid(p.Child("aliases").Index(i), a, msg))
		}
	}
	if pr.Image != "" && strings.TrimSpace(pr.Image) != pr.Image {
		errs = append(errs, field.Invalid(p.Child("image"), pr.Image, "must not have leading or trailing whitespace"))
	}
	switch pr.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), pr.ImagePullPolicy,
			[]corev1.PullPolicy{corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}))
	}
	if pr.ContainerName != "" {
		errs = append(errs, dns(validation.IsDNS1123Label, pr.ContainerName, p.Child("containerName"))...)
	}
	if pr.WorkingDir != "" {
		errs = append(errs, absPath(pr.WorkingDir, p.Child("workingDir"))...)
	}
	seen := map[string]bool{}
	for i, e := range pr.Env {
		ep := p.Child("env").Index(i)
		for _, msg := range validation.IsEnvVarName(e.Name) {
			errs = append(errs, field.Invalid(ep.Child("name"), e.Name, msg))
		}
		if seen[e.Name] {
			errs = append(errs, field.Duplicate(ep.Child("name"), e.Name))
		}
		seen[e.Name] = true
		if e.Value != "" && e.ValueFrom != nil {
			errs = append(errs, field.Invalid(ep, e.Name, "set value or valueFrom, not both"))
		}
	}
	for i, k := range pr.EnvKeys {
		for _, msg := range validation.IsEnvVarName(k) {
			errs = append(errs, field.Invalid(p.Child("envKeys").Index(i), k, msg))
		}
	}
	if pr.Resources != nil {
		errs = append(errs, validateRequestsWithinLimits(pr.Resources, p.Child("resources"))...)
	}
	if pr.EgressProfile != "" {
		for _, msg := range validation.IsValidLabelValue(pr.EgressProfile) {
			errs = append(errs, field.Invalid(p.Child("egressProfile"), pr.EgressProfile, msg))
		}
	}
	if v := pr.ActiveDeadlineSeconds; v != nil && *v <= 0 {
		errs = append(errs, field.Invalid(p.Child("activeDeadlineSeconds"), *v, "must be greater than 0"))
	}
	if m := pr.PermissionMode; m != "" && m != PermissionSkip && m != PermissionAsk {
		errs = append(errs, field.NotSupported(p.Child("permissionMode"), m, []string{PermissionSkip, PermissionAsk}))
	}
	if v := pr.StartTimeoutSeconds; v != nil && (*v <= 0 || *v > maxStartTimeoutSeconds) {
		errs = append(errs, field.Invalid(p.Child("startTimeoutSeconds"), *v, fmt.Sprintf(
			"must be 1 to %d (7 days): a run that never starts must not keep its agent busy forever", maxStartTimeoutSeconds)))
	}
	if v := pr.TTLSecondsAfterFinished; v != nil && *v < 0 {
		errs = append(errs, field.Invalid(p.Child("ttlSecondsAfterFinished"), *v, "must be 0 or more"))
	}
	if v := pr.BackoffLimit; v != nil && *v < 0 {
		errs = append(errs, field.Invalid(p.Child("backoffLimit"), *v, "must be 0 or more"))
	}
	if pr.ServiceAccountName != "" {
		errs = append(errs, dns(validation.IsDNS1123Subdomain, pr.ServiceAccountName, p.Child("serviceAccountName"))...)
	}
	if pr.RuntimeClassName != nil {
		errs = append(errs, dns(validation.IsDNS1123Subdomain, *pr.RuntimeClassName, p.Child("runtimeClassName"))...)
	}
	paths := map[string]bool{}
	for i, wp := range pr.WritablePaths {
		pp := p.Child("writablePaths").Index(i)
		errs = append(errs, absPath(wp, pp)...)
		if paths[wp] {
			errs = append(errs, field.Duplicate(pp, wp))
		}
		paths[wp] = true
	}
	return errs
}

func (c *Config) validateAliases() field.ErrorList {
	var errs field.ErrorList
	owner := map[string]string{}
	for _, name := range sortedKeys(c.resolved) {
		for i, a := range c.resolved[name].Aliases {
			p := profilesPath.Key(name).Child("aliases").Index(i)
			if _, isProfile := c.resolved[a]; isProfile {
				errs = append(errs, field.Invalid(p, a, "is the name of a profile"))
			}
			if prev, ok := owner[a]; ok && prev != name {
				errs = append(errs, field.Invalid(p, a, fmt.Sprintf("is already an alias of profile %q", prev)))
			}
			owner[a] = name
		}
	}
	return errs
}

func validateRequestsWithinLimits(r *corev1.ResourceRequirements, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r == nil {
		return nil
	}
	for name, req := range r.Requests {
		if lim, ok := r.Limits[name]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, field.Invalid(p.Child("requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to the %s limit %s", name, lim.String())))
		}
	}
	return errs
}

func dns(check func(string) []string, v string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range check(v) {
		errs = append(errs, field.Invalid(p, v, msg))
	}
	return errs
}

func absPath(v string, p *field.Path) field.ErrorList {
	if !path.IsAbs(v) || path.Clean(v) != v {
		return field.ErrorList{field.Invalid(p, v, "must be an absolute, clean path such as /paperclip")}
	}
	return nil
}

func glob(g string, p *field.Path) field.ErrorList {
	if g == "" {
		return field.ErrorList{field.Required(p, "a name or glob")}
	}
	if _, err := path.Match(g, ""); err != nil {
		return field.ErrorList{field.Invalid(p, g, "not a valid glob: "+err.Error())}
	}
	return nil
}

// MatchAny reports whether name matches any of the globs (validated at load).
func MatchAny(globs []string, name string) bool {
	for _, g := range globs {
		if matchGlob(g, name) {
			return true
		}
	}
	return false
}

// matchGlob is path.Match for one glob, with the shapes config files use
// (NAME, PREFIX_*, *_SUFFIX) answered without it: a render matches every
// inherited env var against every deny glob, and path.Match was over half
// of templates.Render (docs/design/2026-11-23-admission-performance.md,
// "Inside the process"). FuzzMatchGlob holds the two equal.
func matchGlob(g, name string) bool {
	meta := strings.IndexAny(g, `*?[\`)
	switch {
	case meta < 0:
		return g == name
	case meta == len(g)-1 && g[meta] == '*':
		return strings.HasPrefix(name, g[:meta]) && !strings.Contains(name[len(g)-1:], "/")
	case meta == 0 && g[0] == '*' && !strings.ContainsAny(g[1:], `*?[\`):
		return strings.HasSuffix(name, g[1:]) && !strings.Contains(name[:len(name)-len(g)+1], "/")
	}
	ok, _ := path.Match(g, name)
	return ok
}

func (c *Config) validateTenants() field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("tenantNamespaces")
	for i, g := range c.TenantNamespaces {
		if _, err := path.Match(g, ""); err != nil || g == "" || g == "*" {
			errs = append(errs, field.Invalid(p.Index(i), g, "a namespace or a glob of them such as paperclip-* (not * alone: the server's own namespace would inherit nothing)"))
		}
		if MatchAny([]string{g}, c.Source.Namespace) {
			errs = append(errs, field.Invalid(p.Index(i), g, "matches the source namespace "+c.Source.Namespace+", where agents inherit from the server"))
		}
	}
	return errs
}
