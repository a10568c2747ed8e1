// What the API server (and clipjob's webhooks behind it) answered, read
// from the Status it returns rather than from its message, and the
// Paperclip error code each answer becomes (docs/adapters.md, step 3).

import type { AdapterExecutionResult } from "@paperclipai/adapter-utils";

import { CAUSE_AGENT_BUSY, CAUSE_HOLDER_JOB, CAUSE_HOLDER_RUN_ID, CAUSE_HOLDER_SINCE, CAUSE_QUEUE_FULL } from "./contract.js";

/** An error's message, whatever was thrown. */
export function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * The error codes this adapter returns in AdapterExecutionResult.errorCode.
 * Paperclip's types leave errorCode an open string; these are the names
 * Paperclip's Kubernetes adapters and server already use, so its recovery
 * routing (which reads k8s_concurrency_guard_unreachable, job_failed,
 * claude_truncated, k8s_job_deleted_externally) treats clipjob runs alike.
 * Four are this adapter's own: `k8s_env_secret_create_failed` (nothing
 * before it had a per-run env Secret), `clipjob_relay_unavailable` and
 * `clipjob_relay_run_mismatch` (nor a relay), `clipjob_adapter_config_invalid`.
 * Each is in docs/troubleshooting.md, held there by a test.
 */
export const ErrorCodes = {
  /** Another run of the agent is active (clipjob's 409 agent-busy), or its queue is full. */
  concurrentRunBlocked: "k8s_concurrent_run_blocked",
  /** clipjob's webhook could not be called; it fails closed, so nothing was admitted. */
  guardUnreachable: "k8s_concurrency_guard_unreachable",
  /** The Job was refused (403/422 from a webhook, RBAC, or the API server). */
  jobCreateFailed: "k8s_job_create_failed",
  promptSecretCreateFailed: "k8s_prompt_secret_create_failed",
  envSecretCreateFailed: "k8s_env_secret_create_failed",
  /** The Job disappeared before the relay saw any of its pods. */
  jobDeletedExternally: "k8s_job_deleted_externally",
  /** The relay could not be reached, or would not serve the run. */
  relayUnavailable: "clipjob_relay_unavailable",
  /** The relay's run of this id belongs to another Job (one that copied the run's id): nothing of it is handed on. */
  relayRunMismatch: "clipjob_relay_run_mismatch",
  timeout: "timeout",
  sessionUnavailable: "session_unavailable",
  /** Claude printed output but no result event (killed, OOM, crashed). */
  claudeTruncated: "claude_truncated",
  /** Any other agent ended without a result. */
  jobFailed: "job_failed",
  /** The run was cancelled and its Job deleted. */
  cancelled: "cancelled",
  /** The adapter's settings cannot be used (a namespace not allowed, a relay URL not https); nothing was created. */
  configInvalid: "clipjob_adapter_config_invalid",
} as const;

export type ErrorCode = (typeof ErrorCodes)[keyof typeof ErrorCodes];

/** The parts of a Kubernetes Status this adapter reads. */
export interface KubeStatus {
  kind?: string;
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
  details?: {
    name?: string;
    kind?: string;
    causes?: Array<{ reason?: string; message?: string; field?: string }>;
  };
}

export interface KubeError {
  /** HTTP status, or null when no answer came (network, TLS, timeout). */
  httpStatus: number | null;
  status: KubeStatus | null;
  message: string;
}

/**
 * Reads an error thrown by @kubernetes/client-node: an ApiException has
 * the HTTP code in `code` and the response body (a Status as JSON text) in
 * `body`; anything else never got an answer.
 */
export function readKubeError(err: unknown): KubeError {
  const e = err as { code?: unknown; body?: unknown; message?: unknown } | null;
  const fallbackMessage = err instanceof Error ? err.message : String(err);
  let httpStatus: number | null = typeof e?.code === "number" && e.code >= 100 && e.code < 600 ? e.code : null;
  if (httpStatus === null) {
    const m = /HTTP-Code:\s*(\d{3})/.exec(fallbackMessage);
    if (m) httpStatus = Number(m[1]);
  }
  let status: KubeStatus | null = null;
  const body = e?.body;
  if (typeof body === "string") {
    try {
      const parsed = JSON.parse(body) as unknown;
      if (parsed && typeof parsed === "object") status = parsed as KubeStatus;
    } catch {
      // Not JSON (a proxy's HTML page): the message below says what came.
    }
  } else if (body && typeof body === "object") {
    status = body as KubeStatus;
  }
  if (httpStatus === null && typeof status?.code === "number") httpStatus = status.code;
  const message = status?.message || (httpStatus !== null && typeof body === "string" && body.trim() ? body.trim() : fallbackMessage);
  return { httpStatus, status, message };
}

/** The message of the Status cause of type t, if the Status has one. */
export function causeMessage(status: KubeStatus | null, t: string): string | undefined {
  const cause = status?.details?.causes?.find((c) => c.reason === t);
  return cause ? (cause.message ?? "") : undefined;
}

export function isNotFound(err: unknown): boolean {
  return readKubeError(err).httpStatus === 404;
}

/** What a refused Job create means for the run. */
export type CreateFailure =
  | { kind: "agent-busy"; error: KubeError; holderJob?: string; holderRunId?: string; holderSince?: string }
  | { kind: "queue-full"; error: KubeError }
  | { kind: "name-taken"; error: KubeError }
  | { kind: "guard-unreachable"; error: KubeError }
  | { kind: "refused"; error: KubeError }
  | { kind: "unreachable"; error: KubeError };

/** Classifies an error from creating the Job. */
export function classifyCreateError(err: unknown): CreateFailure {
  const error = readKubeError(err);
  const { httpStatus, status } = error;
  if (httpStatus === 409) {
    // clipjob's 409s are told apart by their causes; the API server's own
    // (a name taken) has reason AlreadyExists and none of them.
    if (causeMessage(status, CAUSE_AGENT_BUSY) !== undefined) {
      return {
        kind: "agent-busy",
        error,
        holderJob: causeMessage(status, CAUSE_HOLDER_JOB),
        holderRunId: causeMessage(status, CAUSE_HOLDER_RUN_ID),
        holderSince: causeMessage(status, CAUSE_HOLDER_SINCE),
      };
    }
    if (causeMessage(status, CAUSE_QUEUE_FULL) !== undefined) return { kind: "queue-full", error };
    if (status?.reason === "AlreadyExists") return { kind: "name-taken", error };
    return { kind: "refused", error };
  }
  if (httpStatus !== null && httpStatus >= 500 && /failed calling webhook/i.test(error.message)) {
    return { kind: "guard-unreachable", error };
  }
  if (httpStatus === null) return { kind: "unreachable", error };
  return { kind: "refused", error };
}

function failed(errorCode: ErrorCode, errorMessage: string, errorMeta?: Record<string, unknown>): AdapterExecutionResult {
  return { exitCode: null, signal: null, timedOut: false, errorCode, errorMessage, ...(errorMeta ? { errorMeta } : {}) };
}

/** How long Paperclip waits before it runs a refused run again (its own bounded retry waits 30 s twice). */
export const BUSY_RETRY_AFTER_MS = 30_000;

/**
 * A run refused because the agent is busy, in the terms Paperclip retries:
 * nothing of the agent ran (bootstrap, no provider work started), and the
 * cause is transient. Paperclip then schedules the run again (twice, 30 s
 * apart, as for a provider's transient error) instead of asking the board
 * to reconcile it; the run's error code still says why.
 */
function busy(result: AdapterExecutionResult, now = Date.now()): AdapterExecutionResult {
  return {
    ...result,
    errorFamily: "transient_upstream",
    retryNotBefore: new Date(now + BUSY_RETRY_AFTER_MS).toISOString(),
    executionRecovery: { kind: "bootstrap", providerWorkStarted: false },
  };
}

/** The result of a run whose Job was not admitted (name-taken is handled by the caller). */
export function createFailureResult(f: CreateFailure, job: string): AdapterExecutionResult {
  const meta: Record<string, unknown> = { httpStatus: f.error.httpStatus, reason: f.error.status?.reason ?? null };
  switch (f.kind) {
    case "agent-busy":
      return busy(
        failed(
          ErrorCodes.concurrentRunBlocked,
          `Concurrent run blocked: the agent already has an active run${f.holderRunId ? ` ${f.holderRunId}` : ""}${f.holderJob ? ` (Job ${f.holderJob}` : ""}${f.holderJob && f.holderSince ? `, since ${f.holderSince})` : f.holderJob ? ")" : ""}. ${f.error.message}`,
          { ...meta, holderJob: f.holderJob ?? null, holderRunId: f.holderRunId ?? null, holderSince: f.holderSince || null },
        ),
      );
    case "queue-full":
      return busy(
        failed(
          ErrorCodes.concurrentRunBlocked,
          `Run blocked: the agent's queue is full (clipjob Queue mode, policy.concurrency.maxQueued); retry when one of its waiting runs has started. ${f.error.message}`,
          { ...meta, queueFull: true },
        ),
      );
    case "guard-unreachable":
      return failed(
        ErrorCodes.guardUnreachable,
        `clipjob's admission webhook could not be reached, and it fails closed: Job ${job} was not created. ${f.error.message}`,
        meta,
      );
    case "unreachable":
      return failed(ErrorCodes.jobCreateFailed, `Creating Job ${job}: the Kubernetes API did not answer: ${f.error.message}`, meta);
    case "name-taken":
    case "refused":
      return failed(ErrorCodes.jobCreateFailed, `Job ${job} was refused (HTTP ${f.error.httpStatus ?? "?"}): ${f.error.message}`, meta);
  }
}

/** The result of a run whose per-run Secret could not be created. */
export function secretFailureResult(which: "env" | "prompt", name: string, err: unknown): AdapterExecutionResult {
  const e = readKubeError(err);
  return failed(
    which === "env" ? ErrorCodes.envSecretCreateFailed : ErrorCodes.promptSecretCreateFailed,
    `Creating the run's ${which} Secret ${name}${e.httpStatus ? ` (HTTP ${e.httpStatus})` : ""}: ${e.message}`,
    { httpStatus: e.httpStatus, reason: e.status?.reason ?? null },
  );
}

export function failureResult(errorCode: ErrorCode, errorMessage: string, errorMeta?: Record<string, unknown>): AdapterExecutionResult {
  return failed(errorCode, errorMessage, errorMeta);
}
