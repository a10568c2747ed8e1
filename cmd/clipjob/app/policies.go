package app

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/templates"
)

// renderPolicies prints the MutatingAdmissionPolicies, with their
// bindings, that complete bare Jobs in the source's namespace as the
// webhook would: what a controller keeps current in a cluster, for review
// or to apply by hand.
func renderPolicies(cfgFile, srcFile string, stdout io.Writer) error {
	cfg, err := loadConfig(cfgFile)
	if err != nil {
		return err
	}
	facts, err := readFacts(cfg, srcFile, nil)
	if err != nil {
		return err
	}
	inh, err := templates.InheritFromDeployment(facts.sourceDeployment(cfg), cfg.Source)
	if err != nil {
		return fmt.Errorf("%s: %w", srcFile, err)
	}
	policies, err := compile.Mutating(compile.Input{Namespace: cfg.Source.Namespace, Inherited: inh, Config: cfg})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for i, p := range policies {
		for j, obj := range []any{p.Policy, p.Binding} {
			if i+j > 0 {
				out.WriteString("---\n")
			}
			y, err := yaml.Marshal(obj)
			if err != nil {
				return err
			}
			fmt.Fprintf(&out, "# profiles %s\n", strings.Join(p.Profiles, ", "))
			out.Write(y)
		}
	}
	_, err = stdout.Write(out.Bytes())
	return err
}
