package templates

// Labels of the bare-Job contract. A Job is an agent run when it carries
// LabelAgentID.
const (
	LabelPrefix      = "paperclip.io/"
	LabelAgentID     = "paperclip.io/agent-id"
	LabelRunID       = "paperclip.io/run-id"
	LabelCompanyID   = "paperclip.io/company-id"
	LabelAdapterType = "paperclip.io/adapter-type"
	// LabelAdapter is the alias Paperclip's sandbox plugin writes.
	LabelAdapter     = "paperclip.io/adapter"
	LabelTaskID      = "paperclip.io/task-id"
	LabelSessionID   = "paperclip.io/session-id"
	LabelRole        = "paperclip.io/role"
	LabelEgress      = "paperclip.io/egress-profile"
	RoleAgent        = "agent"
	AnnotationInline = "paperclip.io/prompt"
	// AnnotationPromptSecret names a Secret holding the prompt, as
	// "name" (key "prompt") or "name/key".
	AnnotationPromptSecret = "paperclip.io/prompt-secret"
)

// Annotations clipjob writes on the Job to say what it did.
const (
	AnnotationProfile      = "clipjob.paperclip.io/profile"
	AnnotationTemplateHash = "clipjob.paperclip.io/template-hash"
	AnnotationSource       = "clipjob.paperclip.io/source"
	// AnnotationQueued marks a Job admitted suspended in Queue mode: the
	// claim controller starts it when its agent is free.
	AnnotationQueued = "clipjob.paperclip.io/queued"
	// AnnotationQueueError marks a queued run that could not be started
	// (the last error); the queue moves past it. Remove it to retry.
	AnnotationQueueError = "clipjob.paperclip.io/queue-error"
)

// Names and paths of what Render adds to the pod.
const (
	PromptVolume         = "clipjob-prompt"
	PromptDir            = "/var/run/paperclip/prompt"
	PromptFileName       = "prompt"
	EnvPromptFile        = "PAPERCLIP_PROMPT_FILE"
	DefaultPromptKey     = "prompt"
	writableVolumePrefix = "clipjob-writable-"
	dataVolumeDefault    = "paperclip-data"
)

// runEnv maps contract labels to the env vars agents read them from.
var runEnv = []struct{ label, env string }{
	{LabelAgentID, "PAPERCLIP_AGENT_ID"},
	{LabelRunID, "PAPERCLIP_RUN_ID"},
	{LabelCompanyID, "PAPERCLIP_COMPANY_ID"},
	{LabelTaskID, "PAPERCLIP_TASK_ID"},
	{LabelSessionID, "PAPERCLIP_SESSION_ID"},
}

// IsAgentJob reports whether labels mark an agent run.
func IsAgentJob(labels map[string]string) bool {
	_, ok := labels[LabelAgentID]
	return ok
}

// AdapterType returns the adapter a Job names, preferring the canonical key.
func AdapterType(labels map[string]string) string {
	if v := labels[LabelAdapterType]; v != "" {
		return v
	}
	return labels[LabelAdapter]
}
