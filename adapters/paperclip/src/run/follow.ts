// Following a run: its log through the relay to its end, each line handed
// on once, the relay's record checked to be this run's Job's, the run's
// liveness kept fresh with Paperclip, and its Job deleted if the server
// stops meanwhile. How it ended becomes the run's result (result.ts maps
// a run that ran to its end).

import type { AdapterExecutionContext, AdapterExecutionResult } from "@paperclipai/adapter-utils";

import { ANNOTATION_QUEUE_ERROR, CAUSE_QUEUE_FULL } from "../contract.js";
import { ErrorCodes, failureResult, isNotFound, message, readKubeError } from "../errors.js";
import { jobNameFor } from "../job.js";
import { followRun, type FollowOutcome, type JobCheck, type RelayRun } from "../relay.js";
import { toExecutionResult } from "../result.js";
import { followUntilShutdown } from "../shutdown.js";
import { cancelRun } from "./cancel.js";
import { jobFinished, type FollowTarget, type Run } from "./run.js";

/**
 * Why the relay's record of the run is not the run of Job `job`
 * (uid `jobUid` when known), or null. The relay binds a run id to the
 * first Job it sees carrying it, in any namespace it follows; anyone who
 * may create Jobs can put this run's id (which its labels show) on one.
 * Without a uid (this run's own Job is gone), the record must name the
 * Job this run would have had.
 */
function recordMismatch(run: Run, rec: RelayRun, { runId, namespace, job, jobUid }: FollowTarget): string | null {
  const { agentId } = run;
  const theirs = `the relay's run ${runId} is Job ${rec.namespace}/${rec.job ?? "?"}${rec.jobUid ? ` (uid ${rec.jobUid})` : ""} of agent ${rec.agent ?? "?"}`;
  const ours = `Job ${namespace}/${job || "?"}${jobUid ? ` (uid ${jobUid})` : ""} of agent ${agentId}`;
  const why = `${theirs}, not this run's ${ours}: another Job carries this run's id, and none of its output is handed on`;
  if (rec.namespace !== namespace || rec.agent !== agentId) return why;
  if (jobUid && rec.jobUid) return rec.jobUid === jobUid ? null : why;
  // A record without a uid (the relay always gives one): by the name of
  // the Job this adapter vetted.
  if (jobUid) return rec.job === job ? null : why;
  // This run's own Job is gone: the name it would have had (not a
  // retry's, whose suffix anyone may choose).
  return rec.job === jobNameFor({ agentId, runId }) ? null : why;
}

// Paperclip's stale-run reaper reads the run's liveness, which a remote
// run refreshes through onSpawn (there is no local process to watch).
function livenessRefresher(ctx: AdapterExecutionContext, refreshSec: number): (force: boolean) => Promise<void> {
  const startedAt = new Date().toISOString();
  let lastLiveness = -Infinity;
  return async (force: boolean) => {
    const now = Date.now();
    if (!ctx.onSpawn || (!force && now - lastLiveness < refreshSec * 1000)) return;
    lastLiveness = now;
    await ctx.onSpawn({ pid: process.pid, processGroupId: null, startedAt }).catch(() => {});
  };
}

/** Follows a run to its end and maps what the relay reports. */
export async function follow(run: Run, target: FollowTarget): Promise<AdapterExecutionResult> {
  const { ctx, settings, kube, deps } = run;
  const { runId, namespace, job, jobUid } = target;
  const refreshLiveness = livenessRefresher(ctx, settings.livenessRefreshSec);
  // The agent's container, from the relay's record of the run.
  let mainContainer: string | undefined;
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  ctx.signal?.addEventListener("abort", onAbort, { once: true });
  // A cancel that came before this point fired no event.
  if (ctx.signal?.aborted) stop.abort();
  // A graceful stop of the server deletes the Job (shutdown.ts).
  const forget = job ? followUntilShutdown({ kube, namespace, job, uid: jobUid, propagation: settings.deletePropagation, notice: run.notice }) : () => {};
  let outcome;
  try {
    outcome = await followRun({
      client: run.relay,
      runId,
      signal: stop.signal,
      onLine: async (line) => {
        // stdout is the agent's output, which Paperclip's transcript
        // parsers read; another container's lines (a client's sidecar
        // or init container) go to stderr, named, so none is lost.
        if (mainContainer && line.container && line.container !== mainContainer) {
          await ctx.onLog("stderr", `[${line.container}] ${line.line}\n`);
        } else {
          await ctx.onLog("stdout", `${line.line}\n`);
        }
        await refreshLiveness(false);
      },
      onKeepalive: () => refreshLiveness(false),
      onAttached: async (first) => {
        if (first) {
          await run.notice(`following run ${runId} through the relay`);
          await refreshLiveness(true);
        }
      },
      onNotice: run.notice,
      jobUid,
      verifyRun: (rec) => {
        mainContainer = rec.mainContainer;
        return recordMismatch(run, rec, target);
      },
      checkJob: job
        ? async (): Promise<JobCheck> => {
            try {
              const j = await kube.readJob(namespace, job);
              const refused = j.metadata?.annotations?.[ANNOTATION_QUEUE_ERROR];
              if (refused && j.spec?.suspend === true && !jobFinished(j)) return { refused };
              if (jobFinished(j)) return "finished";
              return j.spec?.suspend === true ? "waiting" : "active";
            } catch (err) {
              if (isNotFound(err)) return "gone";
              throw err;
            }
          }
        : undefined,
      relayGraceMs: settings.relayGraceSec * 1000,
      ...deps.follow,
    });
  } finally {
    ctx.signal?.removeEventListener("abort", onAbort);
    forget();
  }
  return followedResult(run, target, outcome);
}

/** The run's result from how following it ended. */
async function followedResult(run: Run, target: FollowTarget, outcome: FollowOutcome): Promise<AdapterExecutionResult> {
  const { runId, namespace, job, jobUid } = target;
  const jobRef = job ? `${namespace}/${job}` : null;
  switch (outcome.kind) {
    case "aborted":
      return cancelRun(run, job, namespace, jobUid);
    case "mismatch":
      return failureResult(ErrorCodes.relayRunMismatch, `Following run ${runId}: ${outcome.message}`, { job: jobRef });
    case "refused":
      return refusedRun(run, target, outcome.message);
    case "job-gone":
      return failureResult(ErrorCodes.jobDeletedExternally, `Job ${jobRef} was deleted before the relay saw any of its pods`, { job: jobRef });
    case "unavailable":
      if (outcome.jobState === "active") {
        // The agent is still working: say so, rather than let the run
        // look failed and its Job forgotten. Paperclip records this run
        // failed, so the agent's next run deletes the Job (reapOrphan).
        return failureResult(
          ErrorCodes.relayUnavailable,
          `Following run ${runId}: ${outcome.message}. Its Job ${jobRef} is still running: this run is over for Paperclip, so the agent's next run that meets the Job deletes it`,
          { job: jobRef, lastSeq: outcome.lastSeq, stillRunning: true },
        );
      }
      return failureResult(ErrorCodes.relayUnavailable, `Following run ${runId}: ${outcome.message}`, {
        job: jobRef,
        lastSeq: outcome.lastSeq,
        ...(outcome.jobState ? { jobState: outcome.jobState } : {}),
      });
    case "ended": {
      let record: RelayRun | null = null;
      try {
        record = await run.relay.getRun(runId, run.ctx.signal, jobUid);
      } catch (err) {
        await run.notice(`reading run ${runId}'s record from the relay: ${message(err)}; using its log's end`);
      }
      if (!record && !outcome.end) {
        return failureResult(ErrorCodes.relayUnavailable, `Run ${runId} ended, but the relay has no record of its result`, { job: jobRef });
      }
      const mismatch = record ? recordMismatch(run, record, target) : null;
      if (mismatch) return failureResult(ErrorCodes.relayRunMismatch, `Run ${runId} ended: ${mismatch}`, { job: jobRef });
      return toExecutionResult(record, outcome.end, {
        workingDir: run.workingDir || null,
        configuredModel: run.settings.model || null,
        resumedSessionId: target.resumedSessionId,
        job: jobRef,
      });
    }
  }
}

/**
 * A queued run clipjob will not start. Its Job would wait suspended
 * forever, so it is deleted (only this run's, by UID); Paperclip records
 * the run failed, as busy when the agent's queue was full.
 */
async function refusedRun(run: Run, target: FollowTarget, why: string): Promise<AdapterExecutionResult> {
  const { runId, namespace, job, jobUid } = target;
  const jobRef = `${namespace}/${job}`;
  await run.notice(`clipjob will not start run ${runId}: ${why}; deleting its Job ${jobRef}`);
  try {
    if (job) await run.kube.deleteJob(namespace, job, run.settings.deletePropagation, jobUid);
  } catch (err) {
    if (!isNotFound(err)) await run.notice(`deleting the refused run's Job ${jobRef}: ${readKubeError(err).message}`);
  }
  const full = why.startsWith(`${CAUSE_QUEUE_FULL}:`);
  return failureResult(full ? ErrorCodes.concurrentRunBlocked : ErrorCodes.jobCreateFailed, `clipjob did not start run ${runId} (Job ${jobRef}): ${why}`, {
    job: jobRef,
  });
}
