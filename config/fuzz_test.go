package config

import (
	"testing"

	"sigs.k8s.io/yaml"
)

// FuzzParse: any bytes give a Config or an error, never a panic; a Config
// that parsed survives a round trip unchanged in what it resolves to.
func FuzzParse(f *testing.F) {
	f.Add([]byte(header))
	f.Add([]byte(header + "profiles:\n  x:\n    command: [a]\n    resources: {limits: {cpu: '1'}}\n"))
	f.Add([]byte(header + "policy:\n  images:\n    allow: ['ghcr.io/*']\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			return
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("a parsed config does not parse again: %v\n%s", err, out)
		}
		if len(again.ProfileNames()) != len(cfg.ProfileNames()) || again.DefaultProfile != cfg.DefaultProfile {
			t.Fatalf("round trip changed the profiles")
		}
	})
}
