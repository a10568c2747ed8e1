package charts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/paperclipai/clipjob/config"
)

// configSchema is the JSON schema of clipjob's Config keys, from its Go
// types: objects list their fields and refuse others, so a typo under
// config in the chart's values is an error at install, not a crash-looping
// webhook. Kubernetes types inside (env, resources, tolerations) are
// checked by the webhook's own parse.
func configSchema(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[resource.Quantity](), t == reflect.TypeFor[intstr.IntOrString]():
		return map[string]any{}
	case strings.HasPrefix(t.PkgPath(), "k8s.io/"):
		return map[string]any{}
	}
	switch t.Kind() {
	case reflect.Struct:
		props := map[string]any{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" && f.Anonymous {
				for k, v := range configSchema(f.Type)["properties"].(map[string]any) {
					props[k] = v
				}
				continue
			}
			props[name] = configSchema(f.Type)
		}
		return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": configSchema(t.Elem())}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": configSchema(t.Elem())}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	}
	return map[string]any{}
}

// TestValuesSchemaKnowsTheConfig keeps values.schema.json's config in step
// with config.Config (REFRESH_SCHEMA=true rewrites it), minus the header
// the chart writes itself.
func TestValuesSchemaKnowsTheConfig(t *testing.T) {
	path := filepath.Join(Name, "values.schema.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	want := configSchema(reflect.TypeFor[config.Config]())
	props := want["properties"].(map[string]any)
	delete(props, "apiVersion")
	delete(props, "kind")
	want["required"] = []any{"source"}
	got := doc["properties"].(map[string]any)["config"]
	// Round-trip through JSON so both sides have the same types.
	b, _ := json.Marshal(want)
	var wantJSON any
	_ = json.Unmarshal(b, &wantJSON)
	if d := cmp.Diff(wantJSON, got); d != "" {
		if os.Getenv("REFRESH_SCHEMA") == "true" {
			doc["properties"].(map[string]any)["config"] = wantJSON
			out, _ := json.MarshalIndent(doc, "", "  ")
			if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("values.schema.json's config differs from config.Config (-want +got); REFRESH_SCHEMA=true rewrites it:\n%s", d)
	}
	if _, err := Render(rel, map[string]any{"config": map[string]any{"source": map[string]any{"namespace": "p"}, "polcy": map[string]any{}}}); err == nil || !strings.Contains(err.Error(), "polcy") {
		t.Errorf("a typo under config: %v", err)
	}
}
