package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runProfileCommand runs a built-in profile's command with sh, a stand-in
// CLI on PATH that prints its arguments one per line, and env.
func runProfileCommand(t *testing.T, profile, cli string, env ...string) []string {
	t.Helper()
	dir := t.TempDir()
	stub := "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n"
	if err := os.WriteFile(filepath.Join(dir, cli), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	p, ok := Default().Profile(profile)
	if !ok {
		t.Fatalf("no profile %s", profile)
	}
	cmd := exec.Command(p.Command[0], p.Command[1:]...)
	cmd.Env = append([]string{"PATH=" + dir + ":/usr/bin:/bin", "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", profile, err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// The built-in commands build the line Paperclip's adapters build, from
// the run's env: a value with spaces or shell syntax stays one argument.
func TestBuiltinCommandsTakeTheRunsOptions(t *testing.T) {
	for _, tc := range []struct {
		profile, cli string
		env          []string
		want         string
	}{
		{"claude_local", "claude", nil, "--print - --output-format stream-json --verbose --dangerously-skip-permissions"},
		{"claude_local", "claude", []string{"PAPERCLIP_SESSION_ID=s-1", "PAPERCLIP_MODEL=claude-sonnet-4-5", "PAPERCLIP_MAX_TURNS=40"},
			"--print - --output-format stream-json --verbose --resume s-1 --model claude-sonnet-4-5 --max-turns 40 --dangerously-skip-permissions"},
		{"claude_local", "claude", []string{"PAPERCLIP_PERMISSION_MODE=ask", "PAPERCLIP_SESSION_ID=a b;c"},
			"--print - --output-format stream-json --verbose --resume a b;c"},
		{"opencode_local", "opencode", []string{"PAPERCLIP_SESSION_ID=ses_1", "PAPERCLIP_MODEL=anthropic/claude-sonnet-4-5"},
			"run --format json --session ses_1 --model anthropic/claude-sonnet-4-5"},
	} {
		got := runProfileCommand(t, tc.profile, tc.cli, tc.env...)
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s %v: %q, want %q", tc.profile, tc.env, got, tc.want)
		}
	}
	// One argument, however odd.
	got := runProfileCommand(t, "claude_local", "claude", "PAPERCLIP_SESSION_ID=a b;c")
	if got[6] != "a b;c" {
		t.Errorf("a session id with spaces split: %q", got)
	}
}

// OpenCode in skip mode is allowed outside its project, as the adapter
// does; in ask mode it is not told so.
func TestOpenCodePermissionConfig(t *testing.T) {
	for mode, want := range map[string]bool{"skip": true, "ask": false} {
		dir := t.TempDir()
		stub := filepath.Join(dir, "bin")
		_ = os.Mkdir(stub, 0o755)
		_ = os.WriteFile(filepath.Join(stub, "opencode"), []byte("#!/bin/sh\n"), 0o755)
		p, _ := Default().Profile("opencode_local")
		cmd := exec.Command(p.Command[0], p.Command[1:]...)
		cmd.Env = []string{"PATH=" + stub + ":/usr/bin:/bin", "HOME=" + dir, "PAPERCLIP_PERMISSION_MODE=" + mode}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		data, err := os.ReadFile(filepath.Join(dir, ".config", "opencode", "opencode.json"))
		if got := err == nil && strings.Contains(string(data), `"external_directory":"allow"`); got != want {
			t.Errorf("mode %s: config written %v (%s)", mode, got, data)
		}
	}
}
