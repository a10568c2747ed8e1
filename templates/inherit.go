package templates

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/paperclipai/clipjob/config"
)

// Inherited is what agent Jobs take from the source workload's pod
// template. It holds only facts copied from the source; the env filter and
// the profile apply at render time.
type Inherited struct {
	// Source names the workload, as "namespace/name".
	Source string `json:"source"`
	// Tenant: inherited in a tenant namespace, that is nothing.
	Tenant bool `json:"tenant,omitempty"`
	// Revision identifies what agents inherit ("inherited <hash>" of the
	// values below); it is recorded on rendered Jobs, not hashed. Not the
	// Deployment's generation: scaling the server bumps that, and would make
	// every Job rendered the moment before differ from a render the moment
	// after (the validating webhook holds a Job to a fresh render).
	Revision string `json:"-"`

	Image            string                        `json:"image"`
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	DNSPolicy        corev1.DNSPolicy              `json:"dnsPolicy,omitempty"`
	DNSConfig        *corev1.PodDNSConfig          `json:"dnsConfig,omitempty"`
	// DataVolume is the source's volume backed by the shared PVC, mounted
	// at DataMountPath.
	DataVolume    corev1.Volume `json:"dataVolume"`
	DataMountPath string        `json:"dataMountPath"`
	// DataSubPath is the subPath of the volume the source mounts there
	// ("" for its root): a run's directories are under it.
	DataSubPath string `json:"dataSubPath,omitempty"`
	// SecretVolumes and SecretMounts are the container's secret-backed
	// mounts, made read-only, their volumes renamed into clipjob's names
	// (contract.ReservedPrefix) so they never meet a Job's own.
	SecretVolumes []corev1.Volume      `json:"secretVolumes,omitempty"`
	SecretMounts  []corev1.VolumeMount `json:"secretMounts,omitempty"`
	// Env and EnvFrom are the container's, unfiltered: the allowlist
	// (config.EnvFilter) and the profile's envKeys apply at render time.
	Env     []corev1.EnvVar        `json:"env,omitempty"`
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`
}

// TemplateHashes memoizes TemplateHash by profile for one Inherited under
// one Config: the hash is a third of a render's time and depends on nothing
// in the Job. Whoever keeps an Inherited per source revision and Config
// (the webhook's source cache) keeps one of these beside it; a nil
// *TemplateHashes computes the hash on every render.
type TemplateHashes struct{ byProfile sync.Map }

func (h *TemplateHashes) get(prof config.Resolved, inh *Inherited, cfg *config.Config) string {
	if h == nil {
		return TemplateHash(prof, inh, cfg)
	}
	if v, ok := h.byProfile.Load(prof.Name); ok {
		return v.(string)
	}
	v := TemplateHash(prof, inh, cfg)
	h.byProfile.Store(prof.Name, v)
	return v
}

// SourceError says why a source workload cannot be inherited from. The
// webhook denies with it rather than admitting a half-built Job.
type SourceError struct {
	Source string
	Reason string
}

func (e *SourceError) Error() string {
	return fmt.Sprintf("source Deployment %s: %s", e.Source, e.Reason)
}

// InheritFromDeployment reads d's pod template as configured by src.
func InheritFromDeployment(d *appsv1.Deployment, src config.Source) (*Inherited, error) {
	ref := d.Namespace + "/" + d.Name
	tpl := d.Spec.Template.Spec
	var c *corev1.Container
	var names []string
	for i := range tpl.Containers {
		names = append(names, tpl.Containers[i].Name)
		if tpl.Containers[i].Name == src.Container {
			c = &tpl.Containers[i]
		}
	}
	if c == nil {
		return nil, &SourceError{ref, fmt.Sprintf("has no container %q (it has %s); set source.container in the clipjob config",
			src.Container, strings.Join(names, ", "))}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range tpl.Volumes {
		volumes[v.Name] = v
	}
	in := &Inherited{
		Source:           ref,
		Image:            c.Image,
		ImagePullSecrets: tpl.ImagePullSecrets,
		DNSPolicy:        tpl.DNSPolicy,
		DNSConfig:        tpl.DNSConfig,
		DataMountPath:    src.DataMountPath,
		Env:              c.Env,
		EnvFrom:          c.EnvFrom,
	}
	foundData := false
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		switch {
		case !ok:
			continue
		case m.MountPath == src.DataMountPath:
			if v.PersistentVolumeClaim == nil {
				return nil, &SourceError{ref, fmt.Sprintf("volume %q mounted at %s is not a PersistentVolumeClaim; agent Jobs share the server's data through a ReadWriteMany claim",
					v.Name, src.DataMountPath)}
			}
			if m.SubPathExpr != "" {
				return nil, &SourceError{ref, fmt.Sprintf("container %q mounts the shared volume at %s with subPathExpr %q, which clipjob cannot resolve for agent pods: mount it with subPath",
					src.Container, src.DataMountPath, m.SubPathExpr)}
			}
			in.DataSubPath = m.SubPath
			pvc := v.DeepCopy()
			pvc.PersistentVolumeClaim.ReadOnly = false
			pvc.Name = DataVolume
			in.DataVolume, foundData = *pvc, true
		case v.Secret != nil:
			v.Name = reservedName(secretVolumePrefix, v.Name)
			in.SecretVolumes = append(in.SecretVolumes, v)
			in.SecretMounts = append(in.SecretMounts, corev1.VolumeMount{
				Name: v.Name, MountPath: m.MountPath, SubPath: m.SubPath, ReadOnly: true,
			})
		}
	}
	if !foundData {
		return nil, &SourceError{ref, fmt.Sprintf("container %q mounts no PersistentVolumeClaim at %s; set source.dataMountPath in the clipjob config",
			src.Container, src.DataMountPath)}
	}
	in.Revision = inheritedRevision(in)
	return in, nil
}

// inheritedRevision is Inherited.Revision: a hash of what is inherited.
func inheritedRevision(in *Inherited) string {
	data, err := json.Marshal(in)
	if err != nil {
		panic("hashing inherited values: " + err.Error()) // plain data; cannot fail
	}
	sum := sha256.Sum256(data)
	return "inherited " + hex.EncodeToString(sum[:6])
}

// filterEnv is the source env agents inherit, by allowlist: the names the
// profile needs (envKeys) and those the operator lists (f.Allow), never a
// denied one. A server credential under a name nobody listed stays the
// server's, whatever it is called.
func filterEnv(env []corev1.EnvVar, f config.EnvFilter, envKeys []string) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(env))
	for _, e := range env {
		if config.MatchAny(f.Deny, e.Name) {
			continue
		}
		if !config.MatchAny(f.Allow, e.Name) && !slices.Contains(envKeys, e.Name) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// envFromSource names what an envFrom entry reads, and whether it is a
// Secret.
func envFromSource(e corev1.EnvFromSource) (name string, secret bool) {
	switch {
	case e.SecretRef != nil:
		return e.SecretRef.Name, true
	case e.ConfigMapRef != nil:
		return e.ConfigMapRef.Name, false
	}
	return "", false
}

// TenantInherited is what an agent in a tenant namespace (one apart from
// the server; config TenantNamespaces) inherits: nothing but an emptyDir
// workspace at the data mount path. The server's image, env, secrets,
// pull secrets, DNS and PVC belong to its namespace and would not resolve.
func TenantInherited(src config.Source) *Inherited {
	return &Inherited{
		Source:        "none (tenant namespace)",
		Tenant:        true,
		DataMountPath: src.DataMountPath,
		DataVolume:    corev1.Volume{Name: WorkspaceVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
}

// ReadSecrets are every Secret the source's container reads: env, envFrom,
// secret volumes, pull secrets. None of them is a run's.
func (in *Inherited) ReadSecrets() []string {
	var out []string
	for _, e := range in.Env {
		if ref := secretKeyRef(e); ref != nil {
			out = append(out, ref.Name)
		}
	}
	for _, e := range in.EnvFrom {
		if e.SecretRef != nil {
			out = append(out, e.SecretRef.Name)
		}
	}
	for _, v := range in.SecretVolumes {
		if v.Secret != nil {
			out = append(out, v.Secret.SecretName)
		}
	}
	for _, ps := range in.ImagePullSecrets {
		out = append(out, ps.Name)
	}
	return out
}

// SourceSecrets sorts the Secrets of the source by what an agent may do
// with them.
type SourceSecrets struct {
	// Whole are the Secrets clipjob hands the agent whole (inherited
	// envFrom, secret volumes, pull secrets): a Job may reference them.
	Whole []string
	// Keys are the keys clipjob hands the agent one by one through its
	// inherited env, as "secret/key": a Job may read those keys, not the
	// rest of their Secret (which may hold the server's own).
	Keys []string
	// Server are the Secrets the server reads under a denied env name:
	// its own credentials, which no config makes an agent's.
	Server []string
	// Read are every Secret the server's container reads (ReadSecrets).
	Read []string
}

// SecretsFor sorts the Secrets of the source for an agent of profile prof,
// in one pass: what Render would hand over (withheld ones left out), the
// server's own, and all it reads.
func (in *Inherited) SecretsFor(src config.Source, prof config.Resolved) SourceSecrets {
	f := src.Env
	w := newWithheld(in.Env, src, in.DataMountPath, prof.Env)
	var out SourceSecrets
	for _, e := range filterEnv(in.Env, f, prof.EnvKeys) {
		if ref := secretKeyRef(e); ref != nil && w.why(e) == "" {
			out.Keys = append(out.Keys, ref.Name+"/"+ref.Key)
		}
	}
	for _, e := range w.envFrom(in.EnvFrom, f.AllowFrom, func(string) {}) {
		if name, secret := envFromSource(e); secret {
			out.Whole = append(out.Whole, name)
		}
	}
	byName := map[string]corev1.Volume{}
	for _, v := range in.SecretVolumes {
		byName[v.Name] = v
	}
	for _, m := range in.SecretMounts {
		if v := byName[m.Name]; v.Secret != nil {
			if why, _ := w.volume(v, m.MountPath); why == "" {
				out.Whole = append(out.Whole, v.Secret.SecretName)
			}
		}
	}
	for _, ps := range in.ImagePullSecrets {
		out.Whole = append(out.Whole, ps.Name)
	}
	for name := range w.secrets {
		out.Server = append(out.Server, name)
	}
	out.Read = in.ReadSecrets()
	return out
}
