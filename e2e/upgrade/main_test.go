package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// TestJudgeFailsOnOneLineWrongInOneSource: a run's line stored twice as
// read through one replica, or lost from one mirror file, fails the
// whole upgrade, and the figures sum every run of each source.
func TestJudgeFailsOnOneLineWrongInOneSource(t *testing.T) {
	want := []string{"a", "b", "c"}
	j := &judge{}
	for _, run := range []string{"r1", "r2"} {
		j.add("new relay 0", run, harness.Tally(want, want))
		j.add("mirror files", run, harness.Tally(want, want))
	}
	if !j.ok() {
		t.Fatalf("every source holds every line once, and the judge fails: %v", j.failures)
	}
	if n := j.sums["new relay 0"]; n.Want != 6 || n.Got != 6 || !n.Once() {
		t.Errorf("two runs of three lines each: %+v", n)
	}
	j.add("new relay 1", "r1", harness.Tally([]string{"a", "b", "b", "c"}, want))
	if j.ok() {
		t.Error("a line stored twice as read through one replica passes")
	}
	if n := j.sums["new relay 1"]; n.Duplicated != 1 || n.Once() {
		t.Errorf("the duplicate is not counted for its source: %+v", n)
	}
	j = &judge{}
	j.add("new relay 0", "r1", harness.Tally(want, want))
	j.add("mirror files", "r1", harness.Tally([]string{"a", "c"}, want))
	if j.ok() || j.sums["mirror files"].Lost != 1 || !strings.Contains(j.failures[0], "mirror files, run r1") {
		t.Errorf("a line lost from a mirror file: ok %v, failures %v", j.ok(), j.failures)
	}
	if (&judge{}).ok() {
		t.Error("a judge that read nothing passes")
	}
}

// TestCacheDirIsTheProjects: the old relay is cached where the project's
// other builds are (hack/kube-binaries.sh).
func TestCacheDirIsTheProjects(t *testing.T) {
	t.Setenv("CLIPJOB_CACHE_DIR", "/c/clipjob-cache")
	t.Setenv("XDG_CACHE_HOME", "/x")
	t.Setenv("HOME", "/h")
	for _, c := range []struct{ clipjob, xdg, want string }{
		{"/c/clipjob-cache", "/x", "/c/clipjob-cache"},
		{"", "/x", "/x/clipjob"},
		{"", "", "/h/.cache/clipjob"},
	} {
		t.Setenv("CLIPJOB_CACHE_DIR", c.clipjob)
		t.Setenv("XDG_CACHE_HOME", c.xdg)
		if got, err := cacheDir(); err != nil || got != c.want {
			t.Errorf("CLIPJOB_CACHE_DIR=%q XDG_CACHE_HOME=%q: %q %v, want %q", c.clipjob, c.xdg, got, err, c.want)
		}
	}
}

// TestAHistoryWithoutTheOldCommitNamesTheFix: a clone whose history lacks
// the old relay's commit (a shallow clone) is told how to fetch it.
func TestAHistoryWithoutTheOldCommitNamesTheFix(t *testing.T) {
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	git("init", "-q")
	git("commit", "-q", "--allow-empty", "-m", "one")
	head, err := resolveCommit(context.Background(), repo, "HEAD")
	if err != nil || len(head) != 40 {
		t.Fatalf("HEAD of a repository: %q %v", head, err)
	}
	_, err = resolveCommit(context.Background(), repo, oldCommit)
	if err == nil || !strings.Contains(err.Error(), "fetch --unshallow") || !strings.Contains(err.Error(), oldCommit) {
		t.Errorf("a history without %s: %v", oldCommit, err)
	}

	shallow := filepath.Join(t.TempDir(), "shallow")
	git("commit", "-q", "--allow-empty", "-m", "two")
	if out, err := exec.Command("git", "clone", "-q", "--depth", "1", "file://"+repo, shallow).CombinedOutput(); err != nil {
		t.Fatalf("shallow clone: %v: %s", err, out)
	}
	_, err = resolveCommit(context.Background(), shallow, head)
	if err == nil || !strings.Contains(err.Error(), "shallow clone") {
		t.Errorf("a shallow clone without the commit: %v", err)
	}
}

// TestDroppedAreTheRightsTheNewChartNoLongerGrants: what `helm upgrade`
// deletes of the relays' rights is the old chart's Roles, bindings and
// policies the new one lacks; objects both have, and objects that grant
// nothing, stay.
func TestDroppedAreTheRightsTheNewChartNoLongerGrants(t *testing.T) {
	obj := func(kind, ns, name string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{}
		o.SetKind(kind)
		o.SetNamespace(ns)
		o.SetName(name)
		return o
	}
	old := []*unstructured.Unstructured{obj("Role", "sys", "relay-leases"), obj("RoleBinding", "sys", "relay-leases"), obj("ClusterRole", "", "relay"),
		obj("ValidatingAdmissionPolicy", "", "relay-leases"), obj("Deployment", "sys", "gone"), obj("Role", "sys", "kept")}
	cur := []*unstructured.Unstructured{obj("ClusterRole", "", "relay"), obj("Role", "sys", "kept"), obj("Role", "other", "relay-leases")}
	var got []string
	for _, o := range dropped(old, cur) {
		got = append(got, o.GetKind()+" "+o.GetName())
	}
	if want := "Role relay-leases, RoleBinding relay-leases, ValidatingAdmissionPolicy relay-leases"; strings.Join(got, ", ") != want {
		t.Errorf("dropped %q, want %q", strings.Join(got, ", "), want)
	}
}

// TestTheCurrentChartGrantsNoLeaseRole: rendered for relays on PostgreSQL,
// the current chart has no Lease Role, so the upgrade takes the old one's
// away (leaseObjects diffs against it).
func TestTheCurrentChartGrantsNoLeaseRole(t *testing.T) {
	r, err := charts.Render(harness.Release, chartValues)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.Objects {
		if o.GetKind() == "Role" && strings.Contains(o.GetName(), "lease") {
			t.Errorf("the current chart renders Role %s: the upgrade would not take it away", o.GetName())
		}
	}
}

// TestLogSaysTheErrorNotItsStack: of the relay's JSON log line, the field
// that holds the refusal, not the stack trace beside it or the whole line.
func TestLogSaysTheErrorNotItsStack(t *testing.T) {
	log := `{"level":"info","msg":"starting"}
{"level":"error","msg":"relay","error":"opening the store: the schema is at migration 5, this relay knows up to 4","stacktrace":"main.main the schema is at migration"}
`
	if got := logSays([]byte(log), "the schema is at migration"); got != "opening the store: the schema is at migration 5, this relay knows up to 4" {
		t.Errorf("logSays: %q", got)
	}
	if got := logSays([]byte("plain: the schema is at migration 5\n"), "the schema is at migration"); got != "plain: the schema is at migration 5" {
		t.Errorf("a line that is not JSON: %q", got)
	}
	if got := logSays([]byte(log), "absent"); got != "" {
		t.Errorf("text not in the log: %q", got)
	}
}
