package app

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestRenderPoliciesGolden: `clipjob render --policies` prints, for the
// example source and config, the compiled policies the golden file holds
// (REFRESH_GOLDEN=true rewrites it after an intended change of Render or
// the compiler: review the diff), each bound to the source's namespace.
func TestRenderPoliciesGolden(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	var stdout, stderr bytes.Buffer
	code := Main([]string{"render", "--policies", "--source", filepath.Join(root, "examples", "paperclip.yaml"),
		"--config", filepath.Join(root, "examples", "config.yaml")}, nil, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	golden.Compare(t, filepath.Join(root, "compile", "testdata", "examples.golden.yaml"), stdout.Bytes())

	policies, bindings := 0, 0
	for _, doc := range strings.Split(stdout.String(), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "MutatingAdmissionPolicy":
			var p admissionregistrationv1.MutatingAdmissionPolicy
			if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
				t.Fatal(err)
			}
			policies++
		case "MutatingAdmissionPolicyBinding":
			var b admissionregistrationv1.MutatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
				t.Fatal(err)
			}
			if got := b.Spec.MatchResources.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]; got != "paperclip" {
				t.Errorf("binding %s applies to namespace %q, want the source's, paperclip", b.Name, got)
			}
			bindings++
		default:
			t.Fatalf("unexpected document of kind %q", meta.Kind)
		}
	}
	if policies == 0 || policies != bindings {
		t.Fatalf("%d policies and %d bindings; want one binding each", policies, bindings)
	}
}

// TestRenderPoliciesNeedsASource: the policies are compiled from a source;
// without one, or with Jobs given too, it is a usage error.
func TestRenderPoliciesNeedsASource(t *testing.T) {
	for _, args := range [][]string{{"render", "--policies"}, {"render", "--policies", "-f", "job.yaml", "--source", "s.yaml"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(args, nil, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "render --policies needs --source and no -f") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming what it needs", args, code, stderr.String())
		}
	}
}
