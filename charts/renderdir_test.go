package charts

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRenderDirRendersTheChartInADirectory: the chart's own directory
// renders as the embedded chart does, and a copy with a template changed
// (as an older version's) renders its own objects, not this version's.
func TestRenderDirRendersTheChartInADirectory(t *testing.T) {
	values := map[string]any{"relay": map[string]any{"store": "postgres", "replicas": 2, "postgres": map[string]any{"url": "postgres://db/clipjob"}}}
	want := render(t, values)
	got, err := RenderDir(Name, rel, values)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want.Objects, got.Objects); d != "" {
		t.Fatalf("the chart's directory renders otherwise than the embedded chart (-embedded +directory):\n%s", d)
	}

	old := t.TempDir()
	if err := os.CopyFS(old, os.DirFS(Name)); err != nil {
		t.Fatal(err)
	}
	role := "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {{ .Release.Name }}-relay-leases\n  namespace: {{ .Release.Namespace }}\n"
	if err := os.WriteFile(filepath.Join(old, "templates", "leases.yaml"), []byte(role), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := RenderDir(old, rel, values)
	if err != nil {
		t.Fatal(err)
	}
	if o := r.FindIn("Role", rel.Namespace, "clipjob-relay-leases"); o == nil {
		t.Error("the changed copy's Role is not rendered")
	}
	if o := want.FindIn("Role", rel.Namespace, "clipjob-relay-leases"); o != nil {
		t.Error("the embedded chart renders the copy's Role")
	}
	if len(r.Objects) != len(want.Objects)+1 {
		t.Errorf("the changed copy renders %d objects, want the chart's %d and its Role", len(r.Objects), len(want.Objects))
	}
}
