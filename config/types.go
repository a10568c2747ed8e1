package config

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// APIVersion is the only configuration version this build reads.
	APIVersion = "clipjob.paperclip.io/v1alpha1"
	// Kind is the kind every configuration file declares.
	Kind = "Config"
)

// TypeMeta is what a configuration document declares, for readers of
// manifest streams to keep it for Parse.
var TypeMeta = metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind}

// Config is the whole configuration file.
type Config struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// Source is the workload agent Jobs inherit from.
	Source Source `json:"source,omitempty"`

	// TenantNamespaces (globs, e.g. "paperclip-*") are namespaces where
	// agents run apart from the Paperclip server, as Paperclip's Kubernetes
	// plugin runs them per company: clipjob enforces its policy and the
	// claim there but inherits nothing from the source Deployment (its
	// image, env, secrets, pull secrets, DNS and PVC are the server's
	// namespace's, which do not resolve there). Agents get an emptyDir
	// workspace at the data mount path unless the Job mounts its own
	// volume there, and their image from their profile or their own
	// containers.
	TenantNamespaces []string `json:"tenantNamespaces,omitempty"`
	// DefaultProfile names the profile for a Job that names no adapter.
	// Default "default", a profile with no command: such a Job must bring
	// its own container with a command.
	DefaultProfile string `json:"defaultProfile,omitempty"`

	// Defaults apply to every profile; a profile's own fields win.
	Defaults Profile `json:"defaults,omitempty"`

	// Profiles by adapter type. A profile named like a built-in one
	// (claude_local, codex_local, …) is layered over the built-in.
	Profiles map[string]Profile `json:"profiles,omitempty"`

	// Isolation is what of the shared volume each agent run mounts.
	Isolation Isolation `json:"isolation,omitempty"`

	// Policy is what the validating webhook enforces on the final Job.
	Policy Policy `json:"policy,omitempty"`

	// Derived at load time; a Config is immutable afterwards.
	resolved map[string]Resolved
	aliases  map[string]string
	hash     string
}

// Source names the Paperclip workload whose pod template agent Jobs inherit
// image, pull secrets, DNS, the shared volume, secret volumes and env from.
type Source struct {
	// Namespace of the Deployment. Default "paperclip".
	Namespace string `json:"namespace,omitempty"`
	// Deployment name. Default "paperclip".
	Deployment string `json:"deployment,omitempty"`
	// Container in the pod template to inherit from. Default "paperclip".
	Container string `json:"container,omitempty"`
	// DataMountPath is where the source mounts the shared ReadWriteMany
	// PersistentVolumeClaim; agent containers mount it at the same path and
	// get it as HOME. Default "/paperclip".
	DataMountPath string `json:"dataMountPath,omitempty"`
	// Env selects what of the source container's env, valueFrom and
	// envFrom agents inherit: by allowlist, so a server credential under a
	// name nobody thought to deny stays the server's.
	Env EnvFilter `json:"env,omitempty"`
	// SecretVolumes lists the Secrets (names or globs) whose volumes, as
	// the source container mounts them, agents inherit: a Claude login or
	// a CA bundle the agents need. Default: none, as a secret volume may
	// hold the server's own keys. A volume mounted on the shared volume's
	// path, or holding a file a denied env var names, is never inherited.
	SecretVolumes []string `json:"secretVolumes,omitempty"`
}

// IsolationMode is how much of Paperclip's home an agent run sees.
type IsolationMode string

const (
	// IsolationAgent: a run mounts its own agent's workspace and home,
	// its company's project checkouts, and its instructions and its
	// company's skills read-only. Nothing else of the volume.
	IsolationAgent IsolationMode = "Agent"
	// IsolationCompany: as Agent, but the agents of one company share a
	// home (their CLI sessions and settings), as Paperclip's own Codex
	// adapter shares one CODEX_HOME per company.
	IsolationCompany IsolationMode = "Company"
	// IsolationShared: every run mounts the whole volume read-write, with
	// HOME at its root: Paperclip's secrets, database and every company's
	// data with it. An explicit opt-out, warned on every Job.
	IsolationShared IsolationMode = "Shared"
)

// Isolation says where Paperclip's home is on the shared volume and what
// of it each run mounts (docs/security.md, "What a run sees").
type Isolation struct {
	// Mode: Agent (default), Company or Shared.
	Mode IsolationMode `json:"mode,omitempty"`
	// PaperclipHome is the server's PAPERCLIP_HOME as its container sees
	// it: source.dataMountPath or a directory under it. Default
	// source.dataMountPath, where Paperclip's image keeps it.
	PaperclipHome string `json:"paperclipHome,omitempty"`
	// Instance is the server's PAPERCLIP_INSTANCE_ID. Default "default".
	Instance string `json:"instance,omitempty"`
}

// EnvFilter selects inherited env by allowlist. Patterns are shell globs
// (path.Match syntax, e.g. "DATABASE_*").
type EnvFilter struct {
	// Allow lists the env names (literal or valueFrom) agents inherit
	// besides the active profile's envKeys. Empty (the default): only the
	// profile's envKeys. ["*"] inherits every name but the denied ones, as
	// clipjob did before the allowlist.
	Allow []string `json:"allow,omitempty"`
	// AllowFrom lists the ConfigMaps and Secrets whose envFrom entries
	// agents inherit. An envFrom hands over every key of its source, so
	// only sources named here go; a Secret that backs a denied variable is
	// withheld even when listed. Default: none.
	AllowFrom []string `json:"allowFrom,omitempty"`
	// Deny drops matching names; it wins over Allow and envKeys. It adds
	// to DefaultEnvDeny, which always applies: to hand one of those values
	// to agents anyway, set it in a profile's env. A second guard behind
	// the allowlist.
	Deny []string `json:"deny,omitempty"`
}

// DefaultEnvDeny keeps the Paperclip server's own credentials out of agent
// pods: database access, auth and session signing secrets, the master key
// that decrypts stored company secrets.
var DefaultEnvDeny = []string{
	"DATABASE_URL",
	"DATABASE_*",
	"POSTGRES_*",
	"PGPASSWORD",
	"BETTER_AUTH_*",
	"PAPERCLIP_AGENT_JWT_SECRET",
	"PAPERCLIP_SECRETS_MASTER_KEY*",
	"PAPERCLIP_DATABASE_URL",
	"PAPERCLIP_DECISION_SIGNING_SECRET",
	"PAPERCLIP_*_TOKEN",
	"PAPERCLIP_TOOL_OAUTH_CLIENT_SECRET",
	"SESSION_SECRET",
	"JWT_SECRET",
}

// Profile is how one adapter type's agent container and Job look. Every
// field is optional; unset fields fall back to Defaults, then to the
// built-in defaults.
type Profile struct {
	// Aliases are other adapter-type label values that select this profile
	// (e.g. claude_k8s for claude_local).
	Aliases []string `json:"aliases,omitempty"`

	// Image overrides the inherited image for the agent container.
	Image string `json:"image,omitempty"`
	// ImagePullPolicy of the agent container when it sets none.
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// ContainerName of the agent container added to a Job with none.
	// Default "agent".
	ContainerName string `json:"containerName,omitempty"`
	// Command and Args of the agent container added to a Job with none.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// PermissionMode is how the agent CLI treats its permission prompts,
	// which nobody can answer in a pod: "skip" (Claude's
	// --dangerously-skip-permissions, OpenCode's external_directory allow;
	// what Paperclip's adapters do) or "ask". The built-in commands read it
	// from PAPERCLIP_PERMISSION_MODE. Default "skip".
	PermissionMode string `json:"permissionMode,omitempty"`
	// WorkingDir of containers that set none. Default: the data mount path.
	WorkingDir string `json:"workingDir,omitempty"`
	// Env set on every container, over inherited env and under the Job's.
	Env []corev1.EnvVar `json:"env,omitempty"`
	// EnvKeys are inherited env names the agent needs (its API keys). They
	// pass Source.Env.Allow (never Deny), and a missing one is a warning.
	EnvKeys []string `json:"envKeys,omitempty"`
	// Resources are defaults per resource name; what a container sets wins.
	// Default requests cpu 1 / memory 2Gi, limits cpu 4 / memory 8Gi.
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// EgressProfile is the value of the paperclip.io/egress-profile label
	// that NetworkPolicies select. Default "standard".
	EgressProfile string `json:"egressProfile,omitempty"`

	// Job-level settings, applied when the Job leaves them unset.
	// Default backoffLimit 0, ttlSecondsAfterFinished 300, no deadline.
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
	// StartTimeoutSeconds bounds how long a started run may go without any
	// of its containers ever running (an image that cannot be pulled, a
	// pod that cannot be scheduled or configured). The claim controller
	// then ends the run, so its agent is not busy forever. Default 600.
	StartTimeoutSeconds     *int64 `json:"startTimeoutSeconds,omitempty"`
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	BackoffLimit            *int32 `json:"backoffLimit,omitempty"`

	// Pod-level settings, applied when the Job leaves them unset.
	NodeSelector       map[string]string   `json:"nodeSelector,omitempty"`
	Tolerations        []corev1.Toleration `json:"tolerations,omitempty"`
	RuntimeClassName   *string             `json:"runtimeClassName,omitempty"`
	ServiceAccountName string              `json:"serviceAccountName,omitempty"`
	// AutomountServiceAccountToken default false: agents do not talk to
	// the Kubernetes API unless a profile says so.
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`

	// ReadOnlyRootFilesystem, when true, is enforced on every container of
	// the Job; WritablePaths get emptyDir volumes. Default true with /tmp
	// writable (HOME is on the shared volume).
	ReadOnlyRootFilesystem *bool    `json:"readOnlyRootFilesystem,omitempty"`
	WritablePaths          []string `json:"writablePaths,omitempty"`
}

// Policy is enforced on the final (mutated) Job by the validating webhook
// and by `clipjob check`.
type Policy struct {
	// Images every container image must match. The source Deployment's
	// image and the profiles' own images are always allowed, so the empty
	// default admits exactly the images clipjob itself would put there.
	Images ImagePolicy `json:"images,omitempty"`
	// Namespaces agent Jobs may be created in; empty allows every namespace
	// the webhook is registered for.
	Namespaces []string `json:"namespaces,omitempty"`
	// Concurrency keeps at most one active run per agent.
	Concurrency Concurrency `json:"concurrency,omitempty"`
	// Secrets says which Secrets an agent Job may reference besides those
	// made for its run and those clipjob hands it from the source.
	Secrets SecretPolicy `json:"secrets,omitempty"`
	// Claims (globs) are PersistentVolumeClaims an agent Job may mount
	// itself, besides the shared one clipjob mounts. Default none: a
	// claim of the Job's own could be the shared volume's, or another
	// volume of the server's.
	Claims []string `json:"claims,omitempty"`
	// CSIDrivers (globs) are CSI drivers an agent Job may use in an inline
	// volume. Default none: an inline volume names its storage by
	// attributes the Job writes (an NFS driver's server and share could be
	// the shared volume's). A secrets-store driver, say, may be listed.
	CSIDrivers []string `json:"csiDrivers,omitempty"`
	// StorageClasses (globs) are the StorageClasses an agent Job's
	// ephemeral volume may name. Default none: such a volume uses the
	// cluster's default class. A claim that names a class (or "", no
	// class) binds any Available PersistentVolume of it, another tenant's
	// or a second door to the shared volume's storage.
	StorageClasses []string `json:"storageClasses,omitempty"`
	// SharedClaim says which pods besides agent runs may mount the shared
	// claim (Paperclip's home) in the namespaces agents run in.
	SharedClaim SharedClaimPolicy `json:"sharedClaim,omitempty"`
}

// SharedClaimPolicy: the shared claim holds Paperclip's home (the
// instance's .env, secrets/master.key, every company's data), so in a
// namespace agents run in only agent runs clipjob completes and the
// source Deployment's own pods may mount it, or a clone of it.
type SharedClaimPolicy struct {
	// Mode is Enforce (the default) or Disabled: every pod of the namespace may
	// mount the claim, as before clipjob judged other workloads.
	Mode SharedClaimMode `json:"mode,omitempty"`
	// Deployments ("namespace/name") whose pods may mount the claim too,
	// as the source Deployment's may: a backup, a relay mirroring into the
	// namespace. A pod counts as a Deployment's when the ReplicaSet
	// controller made it from a ReplicaSet that Deployment controls, and
	// it is that Deployment's template. A listed Deployment that does not
	// exist is anyone's who may create one of that name there: `clipjob
	// doctor` warns of it.
	Deployments []string `json:"deployments,omitempty"`
}

// SharedClaimMode switches the shared-claim rule for other workloads.
type SharedClaimMode string

const (
	// SharedClaimEnforce refuses a pod that is no agent run's nor an
	// allowed Deployment's and mounts the shared claim.
	SharedClaimEnforce SharedClaimMode = "Enforce"
	// SharedClaimDisabled lets every pod mount it (not "Off", which YAML
	// 1.1 reads as false).
	SharedClaimDisabled SharedClaimMode = "Disabled"
)

// SecretPolicy is what the run-secret rule admits beyond a run's own
// Secrets (labeled for the run) and the source's shared ones.
type SecretPolicy struct {
	// Shared (globs) are Secrets many runs may reference as they are, e.g.
	// an LLM key: no run label is needed, and no run's Job ever owns or
	// deletes one. A Secret the server reads under a denied env name stays
	// refused even when listed. A Secret named here is never a run's env or
	// prompt Secret.
	Shared []string `json:"shared,omitempty"`
	// CreatedAfterJob lets a Job reference a Secret that does not exist
	// yet when its name is the Job's own name plus a suffix
	// ("<job>-env"): Paperclip's Kubernetes plugin creates its run's
	// Secret after the Job, owned by it. Whoever creates that Secret later
	// decides what the pod reads. Default false.
	CreatedAfterJob bool `json:"createdAfterJob,omitempty"`
}

// ImagePolicy is the image allowlist.
type ImagePolicy struct {
	// Allow are image globs compared to normalized references: "*" stays
	// within one path segment, "busybox" means docker.io/library/busybox,
	// and a glob without a tag or digest allows every tag of its
	// repositories (e.g. "ghcr.io/paperclipai/*", "busybox:1.*").
	Allow []string `json:"allow,omitempty"`
	// RequireDigest refuses images referenced by tag only.
	RequireDigest bool `json:"requireDigest,omitempty"`
}

// ConcurrencyScope is where "one active run per agent" applies.
type ConcurrencyScope string

// ConcurrencyMode is what happens to a second run of a busy agent.
type ConcurrencyMode string

const (
	// ScopeNamespace: one active run per agent id in each namespace.
	ScopeNamespace ConcurrencyScope = "Namespace"
	// ScopeCluster: one active run per agent id in the whole cluster.
	ScopeCluster ConcurrencyScope = "Cluster"
	// ModeReject refuses the second run with HTTP 409 naming the active Job.
	ModeReject ConcurrencyMode = "Reject"
	// ModeQueue admits a busy agent's run suspended and starts it when the
	// agent's previous run ends, oldest first.
	ModeQueue ConcurrencyMode = "Queue"
	// ModeDisabled does not limit runs per agent. (Not "Off": YAML 1.1
	// reads an unquoted Off as the boolean false.)
	ModeDisabled ConcurrencyMode = "Disabled"
)

// Concurrency configures the per-agent run claim.
type Concurrency struct {
	// Mode: Reject (default), Queue or Disabled.
	Mode ConcurrencyMode `json:"mode,omitempty"`
	// Scope: Namespace (default) or Cluster.
	Scope ConcurrencyScope `json:"scope,omitempty"`
	// ClaimNamespace holds the claims (Leases) when Scope is Cluster.
	// Default: the source namespace.
	ClaimNamespace string `json:"claimNamespace,omitempty"`
	// PendingGraceSeconds is how long a claim holds for a Job that was
	// admitted but has not appeared (its create may still be in flight, or
	// may have failed after admission). It must outlast the slowest
	// admission: validating webhooks may take up to 30s each. Default 60.
	PendingGraceSeconds int32 `json:"pendingGraceSeconds,omitempty"`
	// MaxQueued bounds, in Queue mode, how many runs of one agent may wait;
	// the next is refused with 409 (cause clipjob.paperclip.io/queue-full).
	// 0: unbounded.
	MaxQueued int32 `json:"maxQueued,omitempty"`
}
