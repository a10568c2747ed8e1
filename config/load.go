package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Load reads and parses the configuration file at path.
func Load(path string) (*Config, error) {
	cfg, _, err := load(path)
	return cfg, err
}

func load(path string) (*Config, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, data, nil
}

// Parse decodes a configuration strictly (an unknown or duplicated field is
// an error naming its path), applies defaults and validates the result.
func Parse(data []byte) (*Config, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
		return nil, errors.New("empty file: want apiVersion " + APIVersion + ", kind " + Kind)
	}
	cfg := &Config{}
	strict, err := sigsjson.UnmarshalStrict(js, cfg, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if len(strict) > 0 {
		for i, e := range strict {
			if hint, ok := removedFields[strings.TrimPrefix(e.Error(), "unknown field ")]; ok {
				strict[i] = fmt.Errorf("%w: %s", e, hint)
			}
		}
		return nil, fmt.Errorf("decoding: %w", errors.Join(strict...))
	}
	cfg.setDefaults()
	cfg.resolveProfiles()
	if errs := cfg.validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	// After validation, so errors index the user's own list.
	cfg.Source.Env.Deny = union(DefaultEnvDeny, cfg.Source.Env.Deny)
	sum := sha256.Sum256(js)
	cfg.hash = hex.EncodeToString(sum[:8])
	return cfg, nil
}

// removedFields are fields earlier versions read, by the strict decoder's
// quoted path, with what replaces them: an old file is refused (the
// previous config keeps serving) with the way forward, not only "unknown".
var removedFields = map[string]string{
	`"source.inheritEnvFrom"`: "removed: agents inherit envFrom only from the ConfigMaps and Secrets listed in source.env.allowFrom (docs/migration.md)",
}

// Default returns the configuration of an empty file: the default source
// and the built-in profiles.
func Default() *Config {
	cfg, err := Parse([]byte("apiVersion: " + APIVersion + "\nkind: " + Kind + "\n"))
	if err != nil {
		panic("built-in default config is invalid: " + err.Error())
	}
	return cfg
}

// Hash identifies the file content this Config was parsed from.
func (c *Config) Hash() string { return c.hash }

func (c *Config) setDefaults() {
	s := &c.Source
	if s.Namespace == "" {
		s.Namespace = "paperclip"
	}
	if s.Deployment == "" {
		s.Deployment = "paperclip"
	}
	if s.Container == "" {
		s.Container = "paperclip"
	}
	if s.DataMountPath == "" {
		s.DataMountPath = "/paperclip"
	}
	iso := &c.Isolation
	if iso.Mode == "" {
		iso.Mode = IsolationAgent
	}
	if iso.PaperclipHome == "" {
		iso.PaperclipHome = s.DataMountPath
	}
	if iso.Instance == "" {
		iso.Instance = "default"
	}
	cc := &c.Policy.Concurrency
	if cc.Mode == "" {
		cc.Mode = ModeReject
	}
	if cc.Scope == "" {
		cc.Scope = ScopeNamespace
	}
	if cc.ClaimNamespace == "" {
		cc.ClaimNamespace = s.Namespace
	}
	if cc.PendingGraceSeconds == 0 {
		cc.PendingGraceSeconds = 60
	}
	if c.Policy.SharedClaim.Mode == "" {
		c.Policy.SharedClaim.Mode = SharedClaimEnforce
	}
	if c.DefaultProfile == "" {
		c.DefaultProfile = DefaultProfileName
	}
}

// InMode is a copy of c whose concurrency mode is m, for judging a Job as
// it was completed in that mode (a queued run when it starts, whatever
// the mode now). Hash still names the file c was parsed from.
func (c *Config) InMode(m ConcurrencyMode) *Config {
	cp := *c
	cp.Policy.Concurrency.Mode = m
	return &cp
}
