package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// Probe is what the container looks like from inside: the facts the
// security floor promises, read the way an agent (or an attacker in one)
// would read them. The e2e suite decodes it from the run's log.
type Probe struct {
	UID, GID int
	Groups   []int
	// CapEff, CapPrm, CapBnd: the capability sets of /proc/self/status, hex.
	CapEff, CapPrm, CapBnd string
	// Seccomp is /proc/self/status's mode: 0 none, 2 filter.
	Seccomp    string
	NoNewPrivs string
	// ServiceAccountToken: a token file is mounted at the usual path.
	ServiceAccountToken bool
	// RootWritable: creating a file in / (and /usr) worked.
	RootWritable bool
	// TmpWritable: creating a file in /tmp worked.
	TmpWritable bool
	// Write reports the file the script asked for: WriteError is empty when
	// it was created and read back; WriteGID is its group (the fsGroup).
	Write      string
	WriteError string
	WriteGID   int
	// Unshare and Mount are the errors of trying to gain privilege the way
	// a container escape starts: a mount namespace of its own, a mount.
	Unshare, Mount string
	// Env is the names (never the values) of the environment.
	Env      []string
	Hostname string
	// Mounts are the container's mounts under /paperclip (the shared
	// volume's path), from /proc/self/mountinfo: what of the volume the
	// run can reach at all.
	Mounts []Mount
	// HomeWritable: creating a file in $HOME worked.
	HomeWritable bool
	// Read is what the file the script asked to read held, or ReadError
	// why it could not be read.
	Read, ReadError string
}

// Mount is one mount point and whether it is read-only.
type Mount struct {
	Path     string
	ReadOnly bool
}

func probe(write string) Probe {
	p := Probe{UID: os.Getuid(), GID: os.Getgid(), Write: write}
	p.Groups, _ = os.Getgroups()
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "CapEff":
				p.CapEff = v
			case "CapPrm":
				p.CapPrm = v
			case "CapBnd":
				p.CapBnd = v
			case "Seccomp":
				p.Seccomp = v
			case "NoNewPrivs":
				p.NoNewPrivs = v
			}
		}
	}
	_, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token")
	p.ServiceAccountToken = err == nil
	p.RootWritable = canCreate("/fakeagent-probe") || canCreate("/usr/fakeagent-probe")
	p.TmpWritable = canCreate("/tmp/fakeagent-probe")
	if write != "" {
		p.WriteError = writeAndRead(write)
		if st, err := os.Stat(write); err == nil {
			p.WriteGID = int(st.Sys().(*syscall.Stat_t).Gid)
		}
	}
	p.Unshare = errString(syscall.Unshare(syscall.CLONE_NEWNS))
	p.Mount = errString(syscall.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		p.Env = append(p.Env, k)
	}
	sort.Strings(p.Env)
	p.Hostname, _ = os.Hostname()
	p.Mounts = mountsUnder("/paperclip")
	p.HomeWritable = os.Getenv("HOME") != "" && canCreate(os.Getenv("HOME")+"/.fakeagent-probe")
	return p
}

// mountsUnder lists the mount points at or under dir.
func mountsUnder(dir string) []Mount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []Mount
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options ...
		f := strings.Fields(line)
		if len(f) < 6 || (f[4] != dir && !strings.HasPrefix(f[4], dir+"/")) {
			continue
		}
		out = append(out, Mount{Path: f[4], ReadOnly: strings.HasPrefix(f[5], "ro") && (len(f[5]) == 2 || f[5][2] == ',')})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func canCreate(path string) bool {
	f, err := os.Create(path)
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(path)
	return true
}

func writeAndRead(path string) string {
	want := "written by fakeagent\n"
	if err := os.WriteFile(path, []byte(want), 0o640); err != nil {
		return err.Error()
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if string(got) != want {
		return "read back " + string(got)
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// instructionsDir finds, in the prompt, the directory the adapter says
// the agent's instructions' references resolve from.
var instructionsDir = regexp.MustCompile(`Resolve any relative file references from (\S+?)\.(\s|$)`)

// readSkill reads the SKILL.md the prompt names for the skill of key, on
// the line clipjob's adapter gives each of the agent's skills:
// "- <runtime name> (<key>): <path>/SKILL.md — <description>".
func readSkill(key, prompt string) (content, errText string) {
	m := regexp.MustCompile(`(?m)^- \S+ \(` + regexp.QuoteMeta(key) + `\): (/\S+/SKILL\.md)`).FindStringSubmatch(prompt)
	if m == nil {
		return "", "the prompt names no SKILL.md for skill " + key
	}
	return readRelative(m[1], prompt)
}

// readRelative reads name, relative to the instructions' directory the
// prompt names when it is not absolute.
func readRelative(name, prompt string) (content, errText string) {
	if name == "" {
		return "", ""
	}
	if !filepath.IsAbs(name) {
		m := instructionsDir.FindStringSubmatch(prompt)
		if m == nil {
			return "", "the prompt names no directory for the instructions' references"
		}
		name = filepath.Join(m[1], name)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return "", err.Error()
	}
	return string(b), ""
}
