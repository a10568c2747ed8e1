package contract

import (
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels of the bare-Job contract. A Job is an agent run when it carries
// LabelAgentID.
const (
	Prefix           = "paperclip.io/"
	LabelAgentID     = "paperclip.io/agent-id"
	LabelRunID       = "paperclip.io/run-id"
	LabelCompanyID   = "paperclip.io/company-id"
	LabelAdapterType = "paperclip.io/adapter-type"
	// LabelAdapter is the alias Paperclip's sandbox plugin writes.
	LabelAdapter   = "paperclip.io/adapter"
	LabelTaskID    = "paperclip.io/task-id"
	LabelSessionID = "paperclip.io/session-id"
)

// Labels clipjob sets on an agent run's pods, for NetworkPolicies and for
// the checks that the pods belong to the run.
const (
	LabelRole   = "paperclip.io/role"
	LabelEgress = "paperclip.io/egress-profile"
	RoleAgent   = "agent"
)

// ReservedPrefix begins the name of every volume clipjob adds to an agent
// pod (the shared data volume, the source's secret volumes, the prompt,
// writable paths, a tenant's workspace), so none meets a volume of the
// Job's own. A Job volume named like one clipjob adds, with another
// source, is refused.
const ReservedPrefix = "clipjob-"

// DataVolume is the pod volume of the shared PersistentVolumeClaim,
// whatever the source calls it: clipjob alone mounts it.
const DataVolume = ReservedPrefix + "data"

// Pod-template annotations that carry the prompt.
const (
	// AnnotationPrompt holds a small prompt inline.
	AnnotationPrompt = "paperclip.io/prompt"
	// AnnotationPromptSecret names a Secret holding the prompt, as
	// "name" (key DefaultPromptKey) or "name/key".
	AnnotationPromptSecret = "paperclip.io/prompt-secret"
	DefaultPromptKey       = "prompt"
)

// AnnotationEnvSecret, on the Job, names the run's own Secret of env vars
// (its callback token, wake context): every key becomes an env var of the
// agent containers (envFrom), so per-run values are not literals anyone
// who reads Jobs can see. The Secret must be labeled LabelRunID with the
// Job's run id: made for this run, not one of the server's.
const AnnotationEnvSecret = "paperclip.io/env-secret"

// Per-run options of the agent's command, as Job annotations. They reach
// the agent container as env vars (RunOptionEnv), never spliced into a
// command line, so a value cannot inject arguments; the built-in profiles'
// commands read them.
const (
	AnnotationModel    = "paperclip.io/model"
	AnnotationMaxTurns = "paperclip.io/max-turns"
)

// RunOptionEnv maps the run-option annotations to their env vars.
var RunOptionEnv = []struct{ Annotation, Env string }{
	{AnnotationModel, "PAPERCLIP_MODEL"},
	{AnnotationMaxTurns, "PAPERCLIP_MAX_TURNS"},
}

// EnvPermissionMode carries a profile's permissionMode to its command.
const EnvPermissionMode = "PAPERCLIP_PERMISSION_MODE"

// AnnotationWorkingDir, on the Job, is the run's working directory (a
// per-run worktree), under the shared volume's mount path.
const AnnotationWorkingDir = "paperclip.io/working-dir"

// Where an agent container finds the prompt, whichever way it came.
const (
	PromptDir      = "/var/run/paperclip/prompt"
	PromptFileName = "prompt"
	EnvPromptFile  = "PAPERCLIP_PROMPT_FILE"
)

// Annotations clipjob writes on the Job to say what it did. A client's own
// values for them are dropped at admission: they steer the claim
// controller.
const (
	// ClipjobPrefix is the prefix of every annotation clipjob writes.
	ClipjobPrefix = "clipjob.paperclip.io/"

	AnnotationProfile      = "clipjob.paperclip.io/profile"
	AnnotationTemplateHash = "clipjob.paperclip.io/template-hash"
	AnnotationSource       = "clipjob.paperclip.io/source"
	// AnnotationQueued marks a Job admitted suspended in Queue mode: the
	// claim controller starts it when its agent is free.
	AnnotationQueued = "clipjob.paperclip.io/queued"
	// AnnotationQueueError marks a queued run that could not be started
	// (the last error); the queue moves past it. Remove it to retry.
	AnnotationQueueError = "clipjob.paperclip.io/queue-error"
	// AnnotationStartFailures counts the failed starts of a queued run;
	// the third sets AnnotationQueueError (and clears the count, so
	// removing the error gives the run three more tries).
	AnnotationStartFailures = "clipjob.paperclip.io/start-failures"
	// AnnotationStartTimeout marks a run ended because none of its
	// containers ran within its profile's startTimeoutSeconds; the value
	// says what the pods were waiting for.
	AnnotationStartTimeout = "clipjob.paperclip.io/start-timeout"
	// AnnotationQueuePosition (1 is next) and AnnotationQueueHolder (the
	// active run's Job, "namespace/name") say where a queued run stands.
	AnnotationQueuePosition = "clipjob.paperclip.io/queue-position"
	AnnotationQueueHolder   = "clipjob.paperclip.io/queue-holder"
	// AnnotationCreatedBy is the user the API server authenticated for the
	// Job's CREATE, as the mutating webhook saw it. Labels say whose run a
	// Job claims to be; this says who made it, so a client can tell its
	// own runs from a Job that copied their labels. The validating webhook
	// keeps it equal to the creating user and unchanged afterwards.
	AnnotationCreatedBy = "clipjob.paperclip.io/created-by"
)

// RunEnv maps the contract's labels to the env vars an agent reads them
// from, in the order they are set.
var RunEnv = []struct{ Label, Env string }{
	{LabelAgentID, "PAPERCLIP_AGENT_ID"},
	{LabelRunID, "PAPERCLIP_RUN_ID"},
	{LabelCompanyID, "PAPERCLIP_COMPANY_ID"},
	{LabelTaskID, "PAPERCLIP_TASK_ID"},
	{LabelSessionID, "PAPERCLIP_SESSION_ID"},
}

// SecretMadeForRun reports whether a Secret named secretName, labeled
// secretLabels, was made for the run of the Job named jobName with
// jobLabels: it carries the Job's run id, and either its agent id or a
// name that is the Job's own plus one suffix word ("<job>-env",
// "<job>-prompt"), the way Paperclip's adapters name their runs' Secrets.
// A run id alone is the client's choice and could be another agent's; a
// Job's name is unique in its namespace while the Job exists, and the
// suffix word has no "-", so one Secret name fits one Job name only.
func SecretMadeForRun(jobName string, jobLabels map[string]string, secretName string, secretLabels map[string]string) bool {
	run := jobLabels[LabelRunID]
	if run == "" || secretLabels[LabelRunID] != run {
		return false
	}
	return secretLabels[LabelAgentID] == jobLabels[LabelAgentID] || NamedForJob(jobName, secretName)
}

// NamedForJob reports whether secretName is jobName plus "-" and one
// word of lowercase letters and digits.
func NamedForJob(jobName, secretName string) bool {
	suffix, ok := strings.CutPrefix(secretName, jobName+"-")
	if jobName == "" || !ok || suffix == "" {
		return false
	}
	for _, c := range suffix {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// IsAgentJob reports whether labels mark an agent run.
func IsAgentJob(labels map[string]string) bool {
	_, ok := labels[LabelAgentID]
	return ok
}

// HasContractLabel reports whether any of the label sets carries a
// paperclip.io/ label. A Job or Pod that does is clipjob's to check: the
// relay, the egress policies and Paperclip read those labels, so carrying
// one is claiming to be an agent run.
func HasContractLabel(sets ...map[string]string) bool {
	for _, labels := range sets {
		for k := range labels {
			if strings.HasPrefix(k, Prefix) {
				return true
			}
		}
	}
	return false
}

// AdapterType returns the adapter a Job names, preferring the canonical
// label to its alias.
func AdapterType(labels map[string]string) string {
	if v := labels[LabelAdapterType]; v != "" {
		return v
	}
	return labels[LabelAdapter]
}

// Causes in the Status of a 409 that refuses a run because its agent is
// busy, so a client reads the holder without parsing the message. The API
// server's own 409 for a name taken has reason AlreadyExists and none of
// these; clipjob's has reason Conflict and all four.
const (
	// CauseAgentBusy: the message says why, in words.
	CauseAgentBusy metav1.CauseType = "clipjob.paperclip.io/agent-busy"
	// CauseHolderJob: the message is the active run's Job, "namespace/name".
	CauseHolderJob metav1.CauseType = "clipjob.paperclip.io/holder-job"
	// CauseHolderRunID: the message is the active run's run id.
	CauseHolderRunID metav1.CauseType = "clipjob.paperclip.io/holder-run-id"
	// CauseHolderSince: the message is when it started, RFC 3339 (empty
	// if it has not yet).
	CauseHolderSince metav1.CauseType = "clipjob.paperclip.io/holder-since"
	// CauseQueueFull: in Queue mode, the agent already has as many runs
	// waiting as policy.concurrency.maxQueued allows; the message says how
	// many.
	CauseQueueFull metav1.CauseType = "clipjob.paperclip.io/queue-full"
)

// Suspended reports whether a Job is suspended: queued, or held by its
// client. Unsuspending an agent run is what starts it.
func Suspended(job *batchv1.Job) bool { return job.Spec.Suspend != nil && *job.Spec.Suspend }
