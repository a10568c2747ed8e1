package charts

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

//go:embed all:clipjob
var files embed.FS

// Name is the chart's name.
const Name = "clipjob"

// Load returns the chart as Helm loads it from a directory.
func Load() (*chart.Chart, error) { return load(files, Name) }

// load loads the chart in directory root of fsys.
func load(fsys fs.FS, root string) (*chart.Chart, error) {
	var bufs []*loader.BufferedFile
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		bufs = append(bufs, &loader.BufferedFile{Name: strings.TrimPrefix(p, root+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return loader.LoadFiles(bufs)
}

// Release names the install a rendering is for.
type Release struct {
	Name, Namespace string
}

// Rendered is what the chart renders for a release: every object in the
// order of its template file and position, and NOTES.txt.
type Rendered struct {
	Objects []*unstructured.Unstructured
	Notes   string
}

// Render renders the chart for rel with values over the chart's defaults,
// checked against values.schema.json as `helm install` checks them.
func Render(rel Release, values map[string]any) (*Rendered, error) {
	ch, err := Load()
	if err != nil {
		return nil, err
	}
	return renderChart(ch, rel, values)
}

// RenderDir is Render of the chart in directory dir instead of this one:
// another version's, such as the one a release was installed from before
// an upgrade.
func RenderDir(dir string, rel Release, values map[string]any) (*Rendered, error) {
	ch, err := load(os.DirFS(dir), ".")
	if err != nil {
		return nil, err
	}
	return renderChart(ch, rel, values)
}

func renderChart(ch *chart.Chart, rel Release, values map[string]any) (*Rendered, error) {
	opts := chartutil.ReleaseOptions{Name: rel.Name, Namespace: rel.Namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values, opts, chartutil.DefaultCapabilities.Copy())
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	r := &Rendered{}
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if path.Base(name) == "NOTES.txt" {
			r.Notes = out[name]
			continue
		}
		objs, err := decode(name, out[name])
		if err != nil {
			return nil, err
		}
		r.Objects = append(r.Objects, objs...)
	}
	return r, nil
}

// decode splits a rendered template into its objects.
func decode(name, manifest string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for i, doc := range strings.Split(manifest, "\n---") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", name, i, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs, nil
}

// Find returns the rendered object of kind and name, or nil.
func (r *Rendered) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// FindIn returns the rendered object of kind, namespace and name, or nil:
// Roles of one name are rendered into each agent namespace.
func (r *Rendered) FindIn(kind, namespace, name string) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.GetKind() == kind && o.GetNamespace() == namespace && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Into decodes the (first) rendered object of kind and name into out, a
// typed API object, failing on any field the type does not know.
func (r *Rendered) Into(kind, name string, out runtime.Object) error {
	o := r.Find(kind, name)
	if o == nil {
		return fmt.Errorf("the chart renders no %s %q", kind, name)
	}
	return Decode(o, out)
}

// Decode decodes a rendered object into out, a typed API object, failing
// on any field the type does not know.
func Decode(o *unstructured.Unstructured, out runtime.Object) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true)
}
