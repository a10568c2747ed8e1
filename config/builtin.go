package config

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// DefaultProfileName is the profile of a Job whose adapter has no profile of
// its own choosing: it brings its own container and command.
const DefaultProfileName = "default"

// promptCommand runs an agent CLI with the prompt file on stdin; the file's
// path is in PAPERCLIP_PROMPT_FILE (see the templates package).
func promptCommand(cli string) []string {
	return []string{"sh", "-c", `set -eu; exec ` + cli + ` < "${PAPERCLIP_PROMPT_FILE:-/dev/null}"`}
}

// Permission modes of a profile.
const (
	PermissionSkip = "skip"
	PermissionAsk  = "ask"
)

// claudeCommand runs Claude Code as Paperclip's Claude adapters do, with
// the run's options from env (never spliced into the line): the session to
// resume, the model, the turn limit, and the permission mode.
var claudeCommand = []string{"sh", "-c", `set -eu
set -- --print - --output-format stream-json --verbose
if [ -n "${PAPERCLIP_SESSION_ID:-}" ]; then set -- "$@" --resume "$PAPERCLIP_SESSION_ID"; fi
if [ -n "${PAPERCLIP_MODEL:-}" ]; then set -- "$@" --model "$PAPERCLIP_MODEL"; fi
if [ -n "${PAPERCLIP_MAX_TURNS:-}" ]; then set -- "$@" --max-turns "$PAPERCLIP_MAX_TURNS"; fi
if [ "${PAPERCLIP_PERMISSION_MODE:-skip}" = skip ]; then set -- "$@" --dangerously-skip-permissions; fi
exec claude "$@" < "${PAPERCLIP_PROMPT_FILE:-/dev/null}"`}

// opencodeCommand runs OpenCode as Paperclip's OpenCode adapter does:
// external directories allowed in skip mode (nobody answers a prompt in a
// pod), the session and model from env.
var opencodeCommand = []string{"sh", "-c", `set -eu
if [ "${PAPERCLIP_PERMISSION_MODE:-skip}" = skip ]; then
  mkdir -p "$HOME/.config/opencode"
  printf '%s\n' '{"permission":{"external_directory":"allow"}}' > "$HOME/.config/opencode/opencode.json"
fi
set -- run --format json
if [ -n "${PAPERCLIP_SESSION_ID:-}" ]; then set -- "$@" --session "$PAPERCLIP_SESSION_ID"; fi
if [ -n "${PAPERCLIP_MODEL:-}" ]; then set -- "$@" --model "$PAPERCLIP_MODEL"; fi
exec opencode "$@" < "${PAPERCLIP_PROMPT_FILE:-/dev/null}"`}

// builtinDefaults is the bottom layer under every profile: the values
// Paperclip's Kubernetes adapters use today, with a read-only root.
func builtinDefaults() Profile {
	return Profile{
		ContainerName: "agent",
		// Every agent calls the Paperclip server back.
		EnvKeys: []string{"PAPERCLIP_API_URL"},
		Resources: &corev1.ResourceRequirements{
			// ephemeral-storage bounds what a run writes outside the shared
			// volume (/tmp and the other writable paths, its logs): past the
			// limit kubelet evicts the pod, before the node's disk fills.
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:              resource.MustParse("1"),
				corev1.ResourceMemory:           resource.MustParse("2Gi"),
				corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceCPU:              resource.MustParse("4"),
				corev1.ResourceMemory:           resource.MustParse("8Gi"),
				corev1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
			},
		},
		EgressProfile:                "standard",
		TTLSecondsAfterFinished:      ptr.To[int32](300),
		StartTimeoutSeconds:          ptr.To[int64](DefaultStartTimeoutSeconds),
		BackoffLimit:                 ptr.To[int32](0),
		AutomountServiceAccountToken: ptr.To(false),
		ReadOnlyRootFilesystem:       ptr.To(true),
		WritablePaths:                []string{"/tmp"},
		PermissionMode:               PermissionSkip,
	}
}

// DefaultStartTimeoutSeconds is how long a run may take to start its first
// container: long enough for a cold pull of a large agent image.
const DefaultStartTimeoutSeconds = 600

// builtinProfiles are the adapters Paperclip ships, with the env keys and
// egress destinations of its adapter registry. Only what differs per
// adapter lives here; everything else comes from the defaults.
func builtinProfiles() map[string]Profile {
	return map[string]Profile{
		DefaultProfileName: {},
		"claude_local": {
			Aliases:       []string{"claude_k8s", "claude"},
			Command:       claudeCommand,
			EnvKeys:       []string{"ANTHROPIC_API_KEY"},
			EgressProfile: "anthropic",
		},
		"codex_local": {
			Aliases:       []string{"codex"},
			Command:       promptCommand("codex exec --json --skip-git-repo-check -"),
			EnvKeys:       []string{"OPENAI_API_KEY"},
			EgressProfile: "openai",
		},
		"opencode_local": {
			Aliases: []string{"opencode_k8s", "opencode"},
			Command: opencodeCommand,
			Env: []corev1.EnvVar{
				{Name: "OPENCODE_DISABLE_PROJECT_CONFIG", Value: "true"},
			},
			EnvKeys:       []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"},
			EgressProfile: "opencode",
		},
		"gemini_local": {
			Aliases:       []string{"gemini"},
			Command:       promptCommand("gemini --output-format stream-json"),
			EnvKeys:       []string{"GOOGLE_API_KEY", "GEMINI_API_KEY"},
			EgressProfile: "gemini",
		},
		"cursor_local": {
			Aliases:       []string{"cursor"},
			Command:       promptCommand("cursor-agent --print --output-format stream-json"),
			EnvKeys:       []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"},
			EgressProfile: "cursor",
		},
		"pi_local": {
			Aliases:       []string{"pi"},
			Command:       promptCommand("pi --print --mode json"),
			EnvKeys:       []string{"ANTHROPIC_API_KEY"},
			EgressProfile: "anthropic",
		},
	}
}
