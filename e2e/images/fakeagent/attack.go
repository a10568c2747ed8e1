package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/paperclipai/clipjob/e2e/paperclipjwt"
)

// Attack is what a hostile agent got from the shared volume: everything
// it could see there, tokens it forged for a victim agent from every
// value it could read, the writes it tried outside its own directories,
// and the links it planted inside them for later runs to meet. The e2e
// suite decodes it from the run's log and tries the tokens on the server.
type Attack struct {
	// Seen is every path under /paperclip it could list, walking without
	// following links (a link is "path -> target"), the first
	// maxAttackEntries of them; Count is how many it saw in all.
	Seen  []string
	Count int
	// Read is every file under /paperclip it could read.
	Read []string
	// Forged are tokens for the victim signed with each value it could
	// read (its environment, the files it read, each KEY=value in them),
	// as Paperclip signs a run's token and with the legacy raw secret.
	// They follow the report in lines of their own (forgedPerLine each).
	Forged []Forged `json:"-"`
	// Tried are writes out of its reach: a file in each read-only mount
	// and in each directory above its mounts, a rename of each of its
	// mounts away. Path to error, "" when it worked.
	Tried map[string]string
	// Planted are the links it left in its writable mounts, pointing up
	// the tree and at the volume's root.
	Planted []string
}

// Forged is a token and the value it was signed with (where it was read).
// The relay redacts what looks like a JWT before storing it, so the token
// is written with spaces for its dots, as any agent could write it.
type Forged struct {
	From  string
	Token string
}

// maxAttackEntries bounds what the report lists (a volume that shows an
// agent more than this already failed the test), and forgedPerLine the
// tokens in a line: the relay cuts lines at 1 MiB.
const (
	maxAttackEntries = 200
	forgedPerLine    = 200
	// maxSecrets bounds the values it signs with (files are read in the
	// walk's order: the instance's .env comes early).
	maxSecrets = 2500
)

// envName is a KEY of a KEY=value line (.env, shell, config files).
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)

func attack(victim string) Attack {
	a := Attack{Tried: map[string]string{}}
	agent, company, _ := strings.Cut(victim, "@")
	secrets := map[string]string{} // value -> where it was read
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		secrets[v] = "env " + k
	}
	filepath.WalkDir("/paperclip", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		a.Count++
		seen := path
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			seen += " -> " + target
		}
		if len(a.Seen) < maxAttackEntries {
			a.Seen = append(a.Seen, seen)
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err != nil || info.Size() > 64<<10 {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || len(secrets) >= maxSecrets {
			return nil
		}
		if len(a.Read) < maxAttackEntries {
			a.Read = append(a.Read, path)
		}
		secrets[strings.TrimSpace(string(b))] = "file " + path
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && envName.MatchString(strings.TrimSpace(k)) {
				secrets[strings.Trim(strings.TrimSpace(v), `"'`)] = "file " + path + " " + strings.TrimSpace(k)
			}
		}
		return nil
	})
	now := time.Now()
	claims := paperclipjwt.Claims{Agent: agent, Company: company, AdapterType: "claude_k8s", Run: paperclipjwt.NewRunID(), Instance: "default"}
	for v, from := range secrets {
		if v == "" {
			continue
		}
		for _, legacy := range []bool{false, true} {
			a.Forged = append(a.Forged, Forged{From: from, Token: strings.ReplaceAll(paperclipjwt.Mint(v, claims, legacy, now), ".", " ")})
		}
	}
	slices.SortFunc(a.Forged, func(x, y Forged) int { return strings.Compare(x.From, y.From) })

	mounts := mountsUnder("/paperclip")
	above := map[string]bool{}
	for _, m := range mounts {
		for d := filepath.Dir(m.Path); strings.HasPrefix(d, "/paperclip"); d = filepath.Dir(d) {
			above[d] = true
		}
	}
	for d := range above {
		a.Tried[d+"/planted-by-an-agent"] = errString(os.WriteFile(d+"/planted-by-an-agent", nil, 0o644))
	}
	for _, m := range mounts {
		if m.ReadOnly {
			a.Tried[m.Path+"/planted-by-an-agent"] = errString(os.WriteFile(m.Path+"/planted-by-an-agent", nil, 0o644))
			continue
		}
		a.Tried["rename "+m.Path] = errString(os.Rename(m.Path, m.Path+".moved"))
		for name, target := range map[string]string{"planted-up": "../../../../../..", "planted-root": "/paperclip"} {
			if os.Symlink(target, filepath.Join(m.Path, name)) == nil {
				a.Planted = append(a.Planted, filepath.Join(m.Path, name))
			}
		}
	}
	slices.Sort(a.Planted)
	return a
}
