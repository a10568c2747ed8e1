package config

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	yamlv3 "go.yaml.in/yaml/v3"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"
)

const header = "apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\n"

func TestParseErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr []string
	}{
		{"unknown top-level field", header + "sorce: {}\n", []string{`unknown field "sorce"`}},
		{"unknown nested field", header + "profiles:\n  claude_local:\n    imagee: x\n", []string{`unknown field "profiles.claude_local.imagee"`}},
		{"duplicate key", header + "defaultProfile: a\ndefaultProfile: b\n", []string{`"defaultProfile" already set`}},
		{"wrong type", header + "defaults:\n  backoffLimit: lots\n", []string{"backoffLimit"}},
		{"wrong version", "apiVersion: v9\nkind: Config\n", []string{`apiVersion: Unsupported value: "v9"`}},
		{"empty file", "", []string{"empty file"}},
		{"not yaml", "a: [\n", []string{"not valid YAML"}},
		{"bad source names", header + "source:\n  namespace: Paperclip\n  dataMountPath: rel/path\n",
			[]string{"source.namespace: Invalid value: \"Paperclip\"", "source.dataMountPath: Invalid value: \"rel/path\""}},
		{"bad glob", header + "source:\n  env:\n    deny: ['[A-']\n", []string{"source.env.deny[0]: Invalid value: \"[A-\""}},
		{"unknown default profile", header + "defaultProfile: nope\n", []string{`defaultProfile: Unsupported value: "nope"`}},
		{"requests over limits across layers", header + "defaults:\n  resources:\n    requests: {cpu: '6'}\n",
			[]string{"defaults.resources.requests[cpu]: Invalid value: \"6\": must be less than or equal to the cpu limit 4"}},
		{"profile name not a label value", header + "profiles:\n  'bad name':\n    command: [x]\n", []string{"profiles[bad name]: Invalid value"}},
		{"alias shadows a profile", header + "profiles:\n  mine:\n    aliases: [claude_local]\n", []string{`profiles[mine].aliases[0]: Invalid value: "claude_local": is the name of a profile`}},
		{"alias used twice", header + "profiles:\n  mine:\n    aliases: [claude_k8s]\n", []string{`is already an alias of profile`}},
		{"duplicate env", header + "profiles:\n  mine:\n    env: [{name: A, value: '1'}, {name: A, value: '2'}]\n", []string{"profiles[mine].env[1].name: Duplicate value"}},
		{"bad env name", header + "defaults:\n  env: [{name: '1A', value: x}]\n", []string{"defaults.env[0].name: Invalid value"}},
		{"negative ttl", header + "defaults:\n  ttlSecondsAfterFinished: -1\n", []string{"defaults.ttlSecondsAfterFinished: Invalid value: -1"}},
		{"tenants everywhere", header + "tenantNamespaces: ['*']\n", []string{"tenantNamespaces[0]: Invalid value: \"*\""}},
		{"tenant is the server's namespace", header + "tenantNamespaces: [paper*]\n", []string{"matches the source namespace paperclip"}},
		{"start timeout off", header + "profiles:\n  claude_local:\n    startTimeoutSeconds: 0\n", []string{"profiles[claude_local].startTimeoutSeconds: Invalid value: 0", "never starts"}},
		{"start timeout beyond a week", header + "defaults:\n  startTimeoutSeconds: 9300000000\n", []string{"defaults.startTimeoutSeconds: Invalid value: 9300000000: must be 1 to 604800"}},
		{"relative writable path", header + "defaults:\n  writablePaths: [tmp]\n", []string{"defaults.writablePaths[0]: Invalid value: \"tmp\""}},
		{"bad image glob", header + "policy:\n  images:\n    allow: ['ghcr.io/Bad Name/*']\n", []string{"policy.images.allow[0]: Invalid value"}},
		{"bad concurrency", header + "policy:\n  concurrency:\n    mode: Later\n    scope: Galaxy\n",
			[]string{`policy.concurrency.mode: Unsupported value: "Later"`, `policy.concurrency.scope: Unsupported value: "Galaxy"`}},
		{"bad namespace", header + "policy:\n  namespaces: [Agents]\n", []string{"policy.namespaces[0]: Invalid value"}},
		{"YAML 1.1 boolean for a mode", header + "policy:\n  concurrency:\n    mode: Off\n", []string{"policy.concurrency.mode"}},
		{"a shared-claim Deployment by name alone", header + "policy:\n  sharedClaim:\n    deployments: [paperclip-backup]\n",
			[]string{`policy.sharedClaim.deployments[0]: Invalid value: "paperclip-backup": a Deployment is named with its namespace, namespace/name`}},
		{"bad pull policy", header + "defaults:\n  imagePullPolicy: Sometimes\n", []string{"defaults.imagePullPolicy: Unsupported value"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatal("want an error, got a config")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	cfg := Default()
	want := Source{Namespace: "paperclip", Deployment: "paperclip", Container: "paperclip", DataMountPath: "/paperclip",
		Env: EnvFilter{Deny: DefaultEnvDeny}}
	if diff := cmp.Diff(want, cfg.Source); diff != "" {
		t.Errorf("source defaults (-want +got):\n%s", diff)
	}
	if len(cfg.Source.Env.Allow) != 0 || len(cfg.Source.Env.AllowFrom) != 0 {
		t.Error("by default agents inherit only their profile's envKeys, and no envFrom")
	}
	if diff := cmp.Diff([]string{"claude_local", "codex_local", "cursor_local", "default", "gemini_local", "opencode_local", "pi_local"}, cfg.ProfileNames()); diff != "" {
		t.Errorf("profiles (-want +got):\n%s", diff)
	}
	p, ok := cfg.Profile("")
	if !ok || p.Name != DefaultProfileName {
		t.Fatalf("empty adapter selects %q, got %q", DefaultProfileName, p.Name)
	}
	if got := p.Resources.Limits.Memory().String(); got != "8Gi" {
		t.Errorf("default memory limit %s, want 8Gi", got)
	}
	if *p.BackoffLimit != 0 || *p.TTLSecondsAfterFinished != 300 || *p.AutomountServiceAccountToken {
		t.Errorf("job defaults: backoff %d ttl %d automount %v", *p.BackoffLimit, *p.TTLSecondsAfterFinished, *p.AutomountServiceAccountToken)
	}
}

func TestUserDenyAddsToDefaults(t *testing.T) {
	cfg, err := Parse([]byte(header + "source:\n  env:\n    deny: [NODE_*]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"NODE_ENV", "DATABASE_URL", "BETTER_AUTH_SECRET"} {
		if !MatchAny(cfg.Source.Env.Deny, name) {
			t.Errorf("%s is not denied", name)
		}
	}
}

func TestProfileLayering(t *testing.T) {
	cfg, err := Parse([]byte(header + `
defaults:
  ttlSecondsAfterFinished: 60
  env: [{name: A, value: defaults}, {name: B, value: defaults}]
  resources:
    limits: {memory: 1Gi}
    requests: {memory: 512Mi}
profiles:
  claude_local:
    env: [{name: B, value: profile}]
    aliases: [cc]
`))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := cfg.Profile("cc")
	if !ok || p.Name != "claude_local" {
		t.Fatalf("alias cc resolves to %q", p.Name)
	}
	if *p.TTLSecondsAfterFinished != 60 {
		t.Errorf("ttl %d, want 60 from defaults", *p.TTLSecondsAfterFinished)
	}
	if got := p.Resources.Limits.Cpu().String(); got != "4" {
		t.Errorf("cpu limit %s, want the built-in 4 kept beside the configured memory", got)
	}
	if got := p.Resources.Limits.Memory().String(); got != "1Gi" {
		t.Errorf("memory limit %s, want 1Gi", got)
	}
	var env []string
	for _, e := range p.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	if diff := cmp.Diff([]string{"A=defaults", "B=profile"}, env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if p.EgressProfile != "anthropic" || len(p.Command) == 0 {
		t.Errorf("built-in profile fields lost: egress %q command %v", p.EgressProfile, p.Command)
	}
	if _, ok := cfg.Profile("claude_k8s"); !ok {
		t.Error("built-in alias claude_k8s lost")
	}
}

// TestFullExample pins testdata/full.yaml to what it claims: it parses,
// it shows every field, each "# default X" comment is the default, and its
// defaults block is the built-in one.
func TestFullExample(t *testing.T) {
	path := filepath.Join("testdata", "full.yaml")
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	claimed := map[string]string{}
	walkYAML(doc.Content[0], "", func(path string, key, value *yamlv3.Node) {
		shown[path] = true
		if m := defaultComment.FindStringSubmatch(key.LineComment + value.LineComment); m != nil {
			claimed[path] = m[1]
		}
	})

	for _, f := range configFields(reflect.TypeFor[Config](), "") {
		if !shown[f] {
			t.Errorf("full.yaml does not show field %s", f)
		}
	}
	for _, f := range configFields(reflect.TypeFor[Profile](), "profiles.claude_local") {
		if !shown[f] {
			t.Errorf("full.yaml does not show profile field %s", f)
		}
	}

	if len(claimed) < 8 {
		t.Fatalf("found %d \"# default\" comments; the walk lost them", len(claimed))
	}
	js, err := json.Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := json.Unmarshal(js, &defaults); err != nil {
		t.Fatal(err)
	}
	for path, want := range claimed {
		var v any = defaults
		for _, k := range strings.Split(path, ".") {
			m, _ := v.(map[string]any)
			v = m[k]
		}
		if v == nil { // omitted as empty
			v = map[string]string{"false": "false", "0": "0"}[want]
		}
		if got := fmt.Sprint(v); got != want {
			t.Errorf("%s: full.yaml says the default is %s, it is %s", path, want, got)
		}
	}

	var raw Config
	if err := yaml.UnmarshalStrict(data, &raw); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(builtinDefaults(), raw.Defaults); d != "" {
		t.Errorf("full.yaml's defaults block is not the built-in one (-built-in +file):\n%s", d)
	}
}

var defaultComment = regexp.MustCompile(`#\s*default\s+([^\s;,]+)`)

// walkYAML calls visit for every key of every mapping under n, with its
// dotted path; list items are not descended into.
func walkYAML(n *yamlv3.Node, prefix string, visit func(path string, key, value *yamlv3.Node)) {
	if n.Kind != yamlv3.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		path := key.Value
		if prefix != "" {
			path = prefix + "." + path
		}
		visit(path, key, value)
		walkYAML(value, path, visit)
	}
}

// configFields lists the JSON paths of t's fields, descending into the
// config package's own structs (not into Kubernetes types, maps, or a
// Profile, which is checked once on its own).
func configFields(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out = append(out, path)
		ft := f.Type
		if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() && ft != reflect.TypeFor[Profile]() {
			out = append(out, configFields(ft, path)...)
		}
	}
	return out
}

// TestWatchKeepsServingOnRefusedConfig drives the reloader with a fake clock:
// a valid change applies, an invalid one is refused and the previous Config
// keeps serving, a fixed file applies again.
func TestWatchKeepsServingOnRefusedConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	// Replaced whole, as a mounted ConfigMap is, so a read never sees
	// half a file.
	write := func(s string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(header)
	store, err := LoadStore(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	results := make(chan error, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go store.Watch(ctx, path, WatchOptions{Interval: time.Second, Clock: clk,
		OnReload: func(_ *Config, err error) { results <- err }})

	step := func() {
		t.Helper()
		for !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(time.Second)
	}
	tick := func() error {
		t.Helper()
		step()
		select {
		case err := <-results:
			return err
		case <-time.After(time.Minute):
			t.Fatal("no reload reported (a minute after the tick)")
			return nil
		}
	}

	// The content the Store was loaded from is not a change: no reload.
	step()
	step()
	if len(results) != 0 {
		t.Fatalf("unchanged file reloaded: %v", <-results)
	}

	write(header + "defaultProfile: claude_local\n")
	if err := tick(); err != nil {
		t.Fatalf("valid change refused: %v", err)
	}
	if got := store.Current().DefaultProfile; got != "claude_local" {
		t.Fatalf("default profile %q after reload", got)
	}
	good := store.Current()

	write(header + "defaultProfile: claude_local\nbogus: 1\n")
	if err := tick(); err == nil || !strings.Contains(err.Error(), `unknown field "bogus"`) {
		t.Fatalf("invalid change: got %v", err)
	}
	if store.Current() != good {
		t.Fatal("a refused config replaced the serving one")
	}
	if st := store.Status(); !strings.Contains(st.Refused, "bogus") || st.Hash != good.Hash() {
		t.Errorf("status after refusal: %+v", st)
	}

	write(header + "defaultProfile: codex_local\n")
	if err := tick(); err != nil {
		t.Fatalf("fixed file refused: %v", err)
	}
	if st := store.Status(); st.Refused != "" || store.Current().DefaultProfile != "codex_local" {
		t.Errorf("status after fix: %+v, profile %q", st, store.Current().DefaultProfile)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := tick(); err == nil {
		t.Fatal("a missing file must be reported")
	}
	if store.Current().DefaultProfile != "codex_local" {
		t.Error("a missing file replaced the serving config")
	}
}

// TestLoadStore: the first load is strict, since there is no previous
// Config to keep serving, and its errors name the file.
func TestLoadStore(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadStore(filepath.Join(dir, "missing.yaml"), time.Now()); err == nil || !strings.Contains(err.Error(), "reading config") {
		t.Fatalf("missing file: got %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(header+"bogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadStore(bad, time.Now()); err == nil || !strings.Contains(err.Error(), "config "+bad+": ") || !strings.Contains(err.Error(), `unknown field "bogus"`) {
		t.Fatalf("invalid file: got %v", err)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(header+"defaultProfile: claude_local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	store, err := LoadStore(good, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := store.Current().DefaultProfile; got != "claude_local" {
		t.Errorf("default profile %q", got)
	}
	if st := store.Status(); st.Hash != store.Current().Hash() || !st.LoadedAt.Equal(now) || st.Refused != "" {
		t.Errorf("status %+v", st)
	}
}

// A config from before the allowlist is refused with the way forward, not
// only "unknown field".
func TestRemovedFieldSaysWhatReplacesIt(t *testing.T) {
	_, err := Parse([]byte("apiVersion: " + APIVersion + "\nkind: " + Kind + "\nsource:\n  inheritEnvFrom: true\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "source.inheritEnvFrom": removed`) || !strings.Contains(err.Error(), "source.env.allowFrom") {
		t.Errorf("got %v", err)
	}
}
