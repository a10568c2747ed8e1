// The bare-Job contract between Paperclip and clipjob, as the adapter
// writes and reads it. These are the names in clipjob's Go package
// `contract` (contract/contract.go) and docs/contract.md;
// they are repeated here because the adapter is a separate npm package,
// and a test of clipjob's (or a reviewer) compares the two lists.

/** Labels a client puts on an agent Job (copied to its pods by clipjob). */
export const LABEL_AGENT_ID = "paperclip.io/agent-id";
export const LABEL_RUN_ID = "paperclip.io/run-id";
export const LABEL_COMPANY_ID = "paperclip.io/company-id";
export const LABEL_ADAPTER_TYPE = "paperclip.io/adapter-type";
export const LABEL_TASK_ID = "paperclip.io/task-id";
export const LABEL_SESSION_ID = "paperclip.io/session-id";

/** Pod-template annotations that carry the prompt. */
export const ANNOTATION_PROMPT = "paperclip.io/prompt";
/** Names a Secret holding the prompt, as "name" (key `prompt`) or "name/key". */
export const ANNOTATION_PROMPT_SECRET = "paperclip.io/prompt-secret";
export const PROMPT_SECRET_KEY = "prompt";

/** Job annotations: the run's env Secret and the agent command's options. */
export const ANNOTATION_ENV_SECRET = "paperclip.io/env-secret";
export const ANNOTATION_MODEL = "paperclip.io/model";
export const ANNOTATION_MAX_TURNS = "paperclip.io/max-turns";
export const ANNOTATION_WORKING_DIR = "paperclip.io/working-dir";

/** Annotations clipjob writes on the Job it admitted. */
export const ANNOTATION_PROFILE = "clipjob.paperclip.io/profile";
export const ANNOTATION_QUEUED = "clipjob.paperclip.io/queued";
export const ANNOTATION_QUEUE_POSITION = "clipjob.paperclip.io/queue-position";
export const ANNOTATION_QUEUE_HOLDER = "clipjob.paperclip.io/queue-holder";
/** On a queued run clipjob will not start: why (its start check refused it, or its agent's queue was full). */
export const ANNOTATION_QUEUE_ERROR = "clipjob.paperclip.io/queue-error";
/** The user the API server authenticated for the Job's CREATE; clipjob keeps it immutable. */
export const ANNOTATION_CREATED_BY = "clipjob.paperclip.io/created-by";

/**
 * Causes in the Status of clipjob's 409 (reason Conflict). The API server's
 * own 409 for a taken name has reason AlreadyExists and none of them.
 */
export const CAUSE_AGENT_BUSY = "clipjob.paperclip.io/agent-busy";
export const CAUSE_HOLDER_JOB = "clipjob.paperclip.io/holder-job";
export const CAUSE_HOLDER_RUN_ID = "clipjob.paperclip.io/holder-run-id";
export const CAUSE_HOLDER_SINCE = "clipjob.paperclip.io/holder-since";
export const CAUSE_QUEUE_FULL = "clipjob.paperclip.io/queue-full";

/**
 * Where the shared volume is mounted in agent pods (and in the Paperclip
 * server's pod): a working directory outside it is refused with 422.
 */
export const SHARED_VOLUME_PATH = "/paperclip";

/** The audience the relay's tokens must be made for (chart default). */
export const RELAY_TOKEN_AUDIENCE = "clipjob-relay";
