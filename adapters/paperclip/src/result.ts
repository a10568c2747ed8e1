// A finished run, as the relay reports it, in the shape Paperclip records
// (AdapterExecutionResult): the session to resume, usage and cost, the
// summary, and the outcome with the error code Paperclip's Kubernetes
// adapters used for it (docs/relay.md, the result table).

import type { AdapterExecutionResult, UsageSummary } from "@paperclipai/adapter-utils";

import { ErrorCodes, type ErrorCode } from "./errors.js";
import type { RelayEnd, RelayResult, RelayRun } from "./relay.js";

export interface ResultContext {
  /** The working directory the run was given, kept with the session so a resume happens in the same place. */
  workingDir?: string | null;
  /** The model configured for the run, when the log does not say which ran. */
  configuredModel?: string | null;
  /** The session the run was asked to resume, kept when the log names none. */
  resumedSessionId?: string | null;
  /** The Job that ran it, "namespace/name". */
  job?: string | null;
}

/** The run's end: the relay's run record, else the log's end event. */
export function endOf(run: RelayRun | null, end: RelayEnd | null): { phase: string; exitCode: number | null; reason: string; result: RelayResult } {
  return {
    phase: run?.phase ?? end?.phase ?? "Unknown",
    exitCode: run?.exitCode ?? end?.exitCode ?? null,
    reason: run?.reason ?? end?.reason ?? "",
    result: run?.result ?? end?.result ?? {},
  };
}

/**
 * Bounds on what one run reports. The figures are what the agent printed,
 * not a bill: a negative cost or token count would credit the agent's
 * budget, an absurd one exhaust its company's. No single run costs more
 * or reads and writes more tokens than this.
 */
export const MAX_RUN_COST_USD = 10_000;
export const MAX_RUN_TOKENS = 10_000_000_000;

/** The longest summary kept (characters); the whole text stays in the relay. */
export const MAX_SUMMARY_CHARS = 64 * 1024;

function boundedSummary(text: string): string {
  return text.length <= MAX_SUMMARY_CHARS ? text : `${text.slice(0, MAX_SUMMARY_CHARS)}\n… (cut at ${MAX_SUMMARY_CHARS} characters; the whole result is in the relay's record of the run)`;
}

/** A count or an amount the agent printed, within [0, max]. */
function amount(v: unknown, max: number): number {
  return typeof v === "number" && Number.isFinite(v) && v > 0 ? Math.min(v, max) : 0;
}

function usageOf(r: RelayResult): UsageSummary | undefined {
  if (!r.usage) return undefined;
  const tokens = (v: unknown) => Math.trunc(amount(v, MAX_RUN_TOKENS));
  const usage: UsageSummary = { inputTokens: tokens(r.usage.inputTokens), outputTokens: tokens(r.usage.outputTokens) };
  const cached = tokens(r.usage.cacheReadInputTokens);
  if (cached) usage.cachedInputTokens = cached;
  return usage;
}

/** The provider a model belongs to, where the format says so. */
function providerOf(r: RelayResult, model: string | null): string | null {
  if (r.format === "claude-stream-json") return "anthropic";
  const slash = model?.indexOf("/") ?? -1;
  if (model && slash > 0) return model.slice(0, slash); // OpenCode's provider/model
  return null;
}

/** The signal an exit code says the agent was stopped by. */
function signalOf(exitCode: number | null): string | null {
  if (exitCode === 137) return "SIGKILL";
  if (exitCode === 143) return "SIGTERM";
  return null;
}

/**
 * Maps the relay's account of a finished run to Paperclip's result.
 * `run` is `GET /v1/runs/{run}`; `end` the log's end event, used when the
 * run record could not be read.
 */
export function toExecutionResult(run: RelayRun | null, end: RelayEnd | null, ctx: ResultContext = {}): AdapterExecutionResult {
  const { phase, exitCode, reason, result: r } = endOf(run, end);
  const outcome = r.outcome ?? (phase === "Succeeded" ? "succeeded" : "failed");
  const model = r.model || ctx.configuredModel || null;
  const sessionId = r.sessionId || ctx.resumedSessionId || null;
  const errors = (r.errors ?? []).filter((e) => e.trim() !== "");

  const out: AdapterExecutionResult = {
    exitCode,
    signal: outcome === "killed" ? signalOf(exitCode) : null,
    timedOut: outcome === "timed_out",
    usage: usageOf(r),
    // Claude's result and OpenCode's step totals count this invocation only.
    usageBasis: r.usage ? "per_run" : null,
    costUsd: r.costUsd === undefined || r.costUsd === null ? null : amount(r.costUsd, MAX_RUN_COST_USD),
    model,
    provider: providerOf(r, model),
    summary: r.text?.trim() ? boundedSummary(r.text) : null,
    sessionId,
    sessionDisplayId: sessionId,
    sessionParams: sessionId ? { sessionId, ...(ctx.workingDir ? { cwd: ctx.workingDir } : {}) } : null,
    // The agent's own result event is kept whole but under its own key:
    // at the top it could set what Paperclip reads there
    // (executionCancellation, say).
    resultJson: {
      ...(r.raw !== undefined ? { raw: r.raw } : {}),
      clipjob: {
        run: run?.id ?? null,
        job: ctx.job ?? (run?.job ? `${run.namespace}/${run.job}` : null),
        phase,
        exitCode,
        reason: reason || null,
        outcome,
        format: r.format ?? null,
        subtype: r.subtype ?? null,
        errors,
        truncated: r.truncated ?? false,
        truncatedReason: r.reason ?? null,
        sessionUnavailable: r.sessionUnavailable ?? false,
        emptyResponse: r.emptyResponse ?? false,
      },
    },
  };

  // The session cannot be resumed: the agent no longer has it, or Claude
  // stopped at its turn limit (Paperclip's Claude adapters clear it then).
  if (r.sessionUnavailable || r.subtype === "error_max_turns") out.clearSession = true;

  let errorCode: ErrorCode | null = null;
  let errorMessage: string | null = null;
  const truncatedWhy = r.reason ? ` (${r.reason})` : reason ? ` (${reason})` : "";
  switch (outcome) {
    case "succeeded":
      // An empty response is still a success; resultJson.clipjob says so.
      break;
    case "timed_out":
      errorCode = ErrorCodes.timeout;
      errorMessage = `The run's Job passed its deadline${reason ? ` (${reason})` : ""}`;
      break;
    case "killed":
    case "failed":
    default:
      if (r.sessionUnavailable) {
        errorCode = ErrorCodes.sessionUnavailable;
        errorMessage = errors[0] ?? "The session to resume is no longer available; the next run starts a new one";
      } else if (r.truncated || outcome === "killed") {
        errorCode = r.format === "claude-stream-json" ? ErrorCodes.claudeTruncated : ErrorCodes.jobFailed;
        errorMessage =
          outcome === "killed"
            ? `The agent was killed (exit ${exitCode ?? "?"})${truncatedWhy} before it wrote a result`
            : `The agent ended without a result (exit ${exitCode ?? "?"})${truncatedWhy}`;
      } else {
        // The agent reported its own failure: its words are the message,
        // with no code, as Paperclip's local adapters do.
        errorMessage = errors.length > 0 ? errors.join("; ") : `The agent exited with code ${exitCode ?? "?"}${reason ? ` (${reason})` : ""}`;
      }
  }
  out.errorCode = errorCode;
  out.errorMessage = errorMessage;
  return out;
}
