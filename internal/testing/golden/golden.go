// Package golden holds the render fixtures shared by every path that renders
// a Job: templates.Render itself, the mutating webhook's handler and the
// offline CLI. Each case is templates/testdata/cases/NAME.yaml (a Job, and
// optionally a Deployment and a Config replacing the shared ones) with its
// expected output in NAME.golden. Set REFRESH_GOLDEN=true to rewrite the
// golden files after an intended change, then review the diff.
package golden

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/templates"
)

// Fixture is one render case: a Job, the Config and source Deployment it
// renders with, and the golden file holding the expected output.
type Fixture struct {
	Name       string
	Job        *batchv1.Job
	Config     *config.Config
	Source     *appsv1.Deployment
	GoldenPath string
}

// Dir is the fixture directory, wherever the calling test runs from.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "templates", "testdata")
}

// Cases loads every fixture and fails the test on stale golden files.
func Cases(t testing.TB) []Fixture {
	t.Helper()
	dir := Dir()
	baseCfg := ReadManifests(t, filepath.Join(dir, "config.yaml"))
	baseSrc := ReadManifests(t, filepath.Join(dir, "source.yaml"))
	files, err := filepath.Glob(filepath.Join(dir, "cases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in %s: %v", dir, err)
	}
	sort.Strings(files)
	var cases []Fixture
	want := map[string]bool{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		set := ReadManifests(t, f)
		if len(set.Jobs) != 1 {
			t.Fatalf("%s: want exactly one Job, found %d", f, len(set.Jobs))
		}
		cfgDocs, srcs := set.Raw, set.Deployments
		if len(cfgDocs) == 0 {
			cfgDocs = baseCfg.Raw
		}
		if len(srcs) == 0 {
			srcs = baseSrc.Deployments
		}
		cfg, err := config.Parse(cfgDocs[0])
		if err != nil {
			t.Fatalf("%s: config: %v", f, err)
		}
		c := Fixture{Name: name, Job: set.Jobs[0], Config: cfg, Source: srcs[0],
			GoldenPath: filepath.Join(dir, "cases", name+".golden")}
		want[c.GoldenPath] = true
		cases = append(cases, c)
	}
	goldens, _ := filepath.Glob(filepath.Join(dir, "cases", "*.golden"))
	for _, g := range goldens {
		if !want[g] && !refresh() {
			t.Errorf("stale golden file %s: its fixture is gone; delete it", g)
		}
	}
	return cases
}

// Case loads the fixture called name (cases/NAME.yaml), so a test that needs
// one particular Job says which.
func Case(t testing.TB, name string) Fixture {
	t.Helper()
	for _, c := range Cases(t) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no golden fixture %q in %s", name, filepath.Join(Dir(), "cases"))
	return Fixture{}
}

// Render runs the core the way the CLI does: inherit from the case's
// source, then render.
func (c Fixture) Render() (*templates.Result, error) {
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		return nil, err
	}
	return templates.Render(templates.Input{Job: c.Job, Inherited: inh, Config: c.Config})
}

// Format is the golden text of a render: its profile and warnings as
// comments, then the Job, or the error alone.
func Format(profile string, job *batchv1.Job, warnings []string, err error) []byte {
	var b bytes.Buffer
	if err != nil {
		fmt.Fprintf(&b, "# error: %v\n", err)
		return b.Bytes()
	}
	fmt.Fprintf(&b, "# profile: %s\n", profile)
	for _, w := range warnings {
		fmt.Fprintf(&b, "# warning: %s\n", w)
	}
	y, yerr := manifest.JobYAML(job)
	if yerr != nil {
		fmt.Fprintf(&b, "# marshal error: %v\n", yerr)
	}
	b.Write(y)
	return b.Bytes()
}

// Compare checks got against the golden file, or rewrites the file when
// REFRESH_GOLDEN=true.
func Compare(t testing.TB, path string, got []byte) {
	t.Helper()
	if refresh() {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with REFRESH_GOLDEN=true to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got); REFRESH_GOLDEN=true rewrites it:\n%s", filepath.Base(path), diff)
	}
}

func refresh() bool { return os.Getenv("REFRESH_GOLDEN") == "true" }

// ReadManifests reads the manifests of the file at path, failing the test
// on an error.
func ReadManifests(t testing.TB, path string) *manifest.Set {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	set, err := manifest.Read(f, config.TypeMeta)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return set
}

// WriteYAML writes obj as YAML to dir/name and returns the path, for tests
// that hand manifests to the CLI.
func WriteYAML(t testing.TB, dir, name string, obj any) string {
	t.Helper()
	data, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
