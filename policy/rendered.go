package policy

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// checkRendered: an agent Job is admitted only as clipjob completes it.
// The mutating webhook and the compiled admission policies both complete
// it; this holds the final Job to a fresh render, so neither can be
// skipped (a mutating webhook failing open, a client's Job dressed as
// complete) nor drift (a compiled policy older than the config or the
// source): the first field that differs is named.
func checkRendered(in Input) field.ErrorList {
	again, changed, err := in.Rerender(in.Job)
	if err != nil {
		return field.ErrorList{field.Forbidden(tplPath, fmt.Sprintf(
			"clipjob does not complete this Job (%v), so it cannot have been completed by clipjob: create it so that it is (see the error), with clipjob's mutating webhook registered", err))}
	}
	if !changed {
		return nil // the admitted case: Render compared them already
	}
	path := firstDifference(in.Job, again)
	if path == nil {
		path = tplPath // equal as JSON, unequal semantically: name the template
	}
	return field.ErrorList{field.Forbidden(path, "not as clipjob completes this Job: it reached validation without clipjob's mutating webhook "+
		"or its compiled admission policy, or one of them ran with another configuration or source revision; create the Job again "+
		"(a Job's template cannot change after create), and if this persists run clipjob doctor")}
}

// firstDifference is the path of the first field (in key order) where a
// and b differ as JSON, or nil when they are equal.
func firstDifference(a, b any) *field.Path {
	x, y := asJSON(a), asJSON(b)
	return diffPath(nil, x, y)
}

func asJSON(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("unencodable: %v", err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		return fmt.Sprintf("undecodable: %v", err)
	}
	return out
}

func diffPath(p *field.Path, a, b any) *field.Path {
	child := func(k string) *field.Path {
		switch {
		case p == nil:
			return field.NewPath(k)
		case strings.ContainsAny(k, "/."):
			return p.Key(k) // a label, an annotation, a resource name
		}
		return p.Child(k)
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return p
		}
		keys := map[string]bool{}
		for k := range x {
			keys[k] = true
		}
		for k := range y {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		slices.Sort(sorted)
		for _, k := range sorted {
			if d := diffPath(child(k), x[k], y[k]); d != nil {
				return d
			}
		}
		return nil
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return p
		}
		for i := range x {
			if d := diffPath(p.Index(i), x[i], y[i]); d != nil {
				return d
			}
		}
		return nil
	}
	if !reflect.DeepEqual(a, b) {
		if p == nil {
			return field.NewPath("object")
		}
		return p
	}
	return nil
}
