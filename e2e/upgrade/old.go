package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/paperclipai/clipjob/charts"
)

// oldCommit is the last relay users had that divided the runs through
// Kubernetes Leases: main's first-parent commit just before the merge of
// relay-pg-ownership (f55ec0a), which brought eb03f55 ("relay: replicas
// divide the runs through a table of replicas in PostgreSQL …") in. Its
// store is at migration 0004 (the keys table); 0005 adds the table of
// replicas and drops keys.
const oldCommit = "5803e2a3af4226f4d535764688d4bef0b9164151"

// cacheDir is the project's cache (hack/kube-binaries.sh):
// $CLIPJOB_CACHE_DIR, else $XDG_CACHE_HOME/clipjob, else
// $HOME/.cache/clipjob.
func cacheDir() (string, error) {
	if d := os.Getenv("CLIPJOB_CACHE_DIR"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir() // $XDG_CACHE_HOME, else $HOME/.cache
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "clipjob"), nil
}

// oldRelay is the relay of commit, built from repo's history once and
// kept under the cache keyed by the commit's hash: its source tree (for
// its chart) and its binary.
type oldRelay struct {
	commit   string
	src, bin string
}

// buildOld checks out commit of repo into the cache (git archive) and
// builds its cmd/clipjob-relay there, unless a build of it is cached.
func buildOld(ctx context.Context, repo, commit string) (*oldRelay, error) {
	full, err := resolveCommit(ctx, repo, commit)
	if err != nil {
		return nil, err
	}
	cache, err := cacheDir()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "relay-upgrade", full)
	o := &oldRelay{commit: full, src: filepath.Join(dir, "src"), bin: filepath.Join(dir, "clipjob-relay")}
	if _, err := os.Stat(o.bin); err == nil {
		return o, nil
	}
	// A source tree left by a build that did not finish is taken again.
	if err := os.RemoveAll(o.src); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.src, 0o755); err != nil {
		return nil, err
	}
	archive := fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", repo, full, o.src)
	if out, err := exec.CommandContext(ctx, "sh", "-c", archive).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("extracting %s from %s: %v: %s", full, repo, err, out)
	}
	tmp := o.bin + ".building"
	build := exec.CommandContext(ctx, "go", "build", "-o", tmp, "./cmd/clipjob-relay")
	build.Dir = o.src
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the relay of %s in %s: %v: %s", full, o.src, err, out)
	}
	return o, os.Rename(tmp, o.bin)
}

// resolveCommit is commit's full hash in repo, or an error naming the fix
// when the clone's history lacks it (a shallow clone).
func resolveCommit(ctx context.Context, repo, commit string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
	if err == nil {
		return strings.TrimSpace(string(out)), nil
	}
	shallow, _ := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--is-shallow-repository").Output()
	why := "the repository's history does not hold it"
	if strings.TrimSpace(string(shallow)) == "true" {
		why = "this is a shallow clone"
	}
	return "", fmt.Errorf("commit %s, the Lease-based relay the upgrade starts from, is not in %s (%s): fetch the history, `git -C %s fetch --unshallow` (or `git fetch origin %s`), and run again",
		commit, repo, why, repo, commit)
}

// leaseObjects are what the old chart grants its relays on PostgreSQL and
// the current chart no longer renders (so `helm upgrade` deletes them):
// the relays' Lease Role and RoleBinding and the admission policy that
// confined their Lease writes. values are the install's.
func leaseObjects(oldChart string, rel charts.Release, values map[string]any) ([]*unstructured.Unstructured, error) {
	old, err := charts.RenderDir(oldChart, rel, values)
	if err != nil {
		return nil, fmt.Errorf("rendering the old chart: %w", err)
	}
	cur, err := charts.Render(rel, values)
	if err != nil {
		return nil, err
	}
	return dropped(old.Objects, cur.Objects), nil
}

// dropped are the objects of old, of a kind that grants or confines
// rights, that new does not have (by kind, namespace and name).
func dropped(old, new []*unstructured.Unstructured) []*unstructured.Unstructured {
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	have := map[string]bool{}
	for _, o := range new {
		have[key(o)] = true
	}
	var out []*unstructured.Unstructured
	for _, o := range old {
		switch o.GetKind() {
		case "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if !have[key(o)] {
				out = append(out, o)
			}
		}
	}
	return out
}
