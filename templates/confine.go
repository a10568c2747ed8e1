package templates

import (
	"fmt"
	"path"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

// RunDirs are the directories of Paperclip's home one agent run mounts,
// as absolute paths in the server's container: the pod mounts each at the
// same path, so every path Paperclip hands the run (its working directory,
// its instructions file) means the same thing in the pod.
type RunDirs struct {
	// Workspace is the agent's fallback working directory
	// (instances/<id>/workspaces/<agent>), made by the server.
	Workspace string
	// Projects holds the company's managed checkouts and their worktrees
	// (instances/<id>/projects/<company>).
	Projects string
	// Home is the run's HOME: Claude's ~/.claude and ~/.claude.json, Codex's
	// CODEX_HOME, OpenCode's XDG directories. One per agent
	// (companies/<company>/agents/<agent>/home), or per company in
	// isolation mode Company (companies/<company>/home).
	Home string
	// Instructions are the agent's managed instruction files, read-only
	// (companies/<company>/agents/<agent>/instructions).
	Instructions string
	// Skills are the company's skills, read-only (skills/<company>).
	Skills string
}

// DirsFor is where the run of agent in company finds its directories under
// iso. The ids must be path segments (config.PathSegment).
func DirsFor(iso config.Isolation, agent, company string) RunDirs {
	root := path.Join(iso.PaperclipHome, "instances", iso.Instance)
	agentDir := path.Join(root, "companies", company, "agents", agent)
	d := RunDirs{
		Workspace:    path.Join(root, "workspaces", agent),
		Projects:     path.Join(root, "projects", company),
		Home:         path.Join(agentDir, "home"),
		Instructions: path.Join(agentDir, "instructions"),
		Skills:       path.Join(root, "skills", company),
	}
	if iso.Mode == config.IsolationCompany {
		d.Home = path.Join(root, "companies", company, "home")
	}
	return d
}

// Writable are the directories the run may write, in mount order.
func (d RunDirs) Writable() []string { return []string{d.Workspace, d.Projects, d.Home} }

// ReadOnly are the directories the run may only read, in mount order.
func (d RunDirs) ReadOnly() []string { return []string{d.Instructions, d.Skills} }

// HomeEnv points every agent CLI at the run's home: Claude reads HOME,
// Codex CODEX_HOME, OpenCode the XDG base directories.
func (d RunDirs) HomeEnv() []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "HOME", Value: d.Home},
		{Name: "CODEX_HOME", Value: path.Join(d.Home, ".codex")},
		{Name: "XDG_CONFIG_HOME", Value: path.Join(d.Home, ".config")},
		{Name: "XDG_DATA_HOME", Value: path.Join(d.Home, ".local", "share")},
		{Name: "XDG_STATE_HOME", Value: path.Join(d.Home, ".local", "state")},
		{Name: "XDG_CACHE_HOME", Value: path.Join(d.Home, ".cache")},
	}
}

// confined reports whether the run mounts only its own directories: a
// namespace with the server's volume, and an isolation mode other than
// Shared. A tenant namespace mounts no shared volume at all.
func (r *renderer) confined() bool {
	return !r.in.Inherited.Tenant && r.in.Config.Isolation.Mode != config.IsolationShared
}

// runDirs are the run's directories, or nil with the errors recorded when
// the Job does not say whose run it is in terms that can name a directory.
func (r *renderer) runDirs() *RunDirs {
	if r.dirsDone || !r.confined() {
		return r.dirs
	}
	r.dirsDone = true
	mode := r.in.Config.Isolation.Mode
	ids := map[string]string{}
	for _, l := range []string{contract.LabelAgentID, contract.LabelCompanyID} {
		p := labelsPath.Key(l)
		v := r.job.Labels[l]
		switch {
		case v == "":
			r.errs = append(r.errs, field.Required(p, fmt.Sprintf(
				"isolation mode %s mounts only the run's own directories of Paperclip's home, named by its agent and company: label the Job with its %s, "+
					"or set isolation.mode: Shared in the clipjob config (every run then mounts the whole volume)", mode, strings.TrimPrefix(l, contract.Prefix))))
		case !config.PathSegment(v):
			r.errs = append(r.errs, field.Invalid(p, v, "names a directory of the run: letters, digits, '.', '_' and '-', not '.' or '..'"))
		default:
			ids[l] = v
		}
	}
	if len(ids) != 2 {
		return nil
	}
	d := DirsFor(r.in.Config.Isolation, ids[contract.LabelAgentID], ids[contract.LabelCompanyID])
	r.dirs = &d
	return r.dirs
}

// dataMounts are the mounts of the shared volume: the run's directories,
// each at the path the server sees it, or under isolation mode Shared the
// whole volume at the data mount path.
func (r *renderer) dataMounts() []mountWithVolume {
	inh := r.in.Inherited
	if !r.confined() {
		if !inh.Tenant {
			r.warn(fmt.Sprintf("isolation mode Shared: this run mounts the whole shared volume at %s, with Paperclip's secrets, database and every company's data; "+
				"set isolation.mode: Agent in the clipjob config (docs/security.md)", inh.DataMountPath))
		}
		return []mountWithVolume{{
			mount:  corev1.VolumeMount{Name: inh.DataVolume.Name, MountPath: inh.DataMountPath, SubPath: inh.DataSubPath},
			volume: inh.DataVolume,
		}}
	}
	d := r.runDirs()
	if d == nil {
		return nil
	}
	var out []mountWithVolume
	add := func(dir string, readOnly bool) {
		m := corev1.VolumeMount{Name: inh.DataVolume.Name, MountPath: dir, SubPath: inh.subPathOf(dir), ReadOnly: readOnly}
		if readOnly {
			// Read-only all the way down where the node can (Kubernetes
			// 1.33+): a mount under it stays read-only too.
			m.RecursiveReadOnly = ptr.To(corev1.RecursiveReadOnlyIfPossible)
		}
		out = append(out, mountWithVolume{mount: m, volume: inh.DataVolume})
	}
	for _, dir := range d.Writable() {
		add(dir, false)
	}
	for _, dir := range d.ReadOnly() {
		add(dir, true)
	}
	return out
}

// subPathOf is the subPath of the shared volume that holds dir, a path at
// or under the data mount path in the server's container: under the
// server's own subPath, if it mounts one.
func (in *Inherited) subPathOf(dir string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(dir, in.DataMountPath), "/")
	return path.Join(in.DataSubPath, rel)
}

// SharedMounts are the mounts of the shared volume clipjob gives every app
// container of a Job labeled labels, for the volume rule (nil when the
// labels name no directory: Render refuses such a Job).
func SharedMounts(inh *Inherited, cfg *config.Config, labels map[string]string) []corev1.VolumeMount {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
	r := renderer{in: Input{Inherited: inh, Config: cfg, Job: job}, job: job}
	var out []corev1.VolumeMount
	for _, m := range r.dataMounts() {
		out = append(out, m.mount)
	}
	return out
}

// Confined reports whether a run in a namespace with inh mounts only its
// own directories under cfg.
func Confined(inh *Inherited, cfg *config.Config) bool {
	return (&renderer{in: Input{Inherited: inh, Config: cfg}}).confined()
}
