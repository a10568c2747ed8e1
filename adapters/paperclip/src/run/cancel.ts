// Cancelling a run: before anything started there is nothing to stop;
// after its Job was created, the Job is deleted (its pods, claim and
// Secrets go with it) and the run ends once it is gone.

import type { AdapterExecutionResult } from "@paperclipai/adapter-utils";

import { ErrorCodes, isNotFound, readKubeError } from "../errors.js";
import type { Run } from "./run.js";

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A run cancelled before any agent work started: nothing to stop, safe to run again. */
export function cancelledBeforeStart(when: string): AdapterExecutionResult {
  return {
    exitCode: null,
    signal: null,
    timedOut: false,
    errorCode: ErrorCodes.cancelled,
    errorMessage: `Cancelled ${when}`,
    executionRecovery: { kind: "bootstrap", providerWorkStarted: false },
    resultJson: { executionCancellation: { state: "acknowledged", acknowledgedAt: new Date().toISOString(), forced: false } },
  };
}

/** Waits (cancelGraceSec at most) until Job namespace/name is gone. */
export async function waitGone(run: Run, namespace: string, name: string): Promise<boolean> {
  const deadline = Date.now() + run.settings.cancelGraceSec * 1000;
  for (;;) {
    try {
      await run.kube.readJob(namespace, name);
    } catch (err) {
      if (isNotFound(err)) return true;
    }
    if (Date.now() >= deadline) return false;
    await sleep(run.deps.cancelPollMs ?? 1000);
  }
}

/** Deletes the run's Job (its pods, claim and Secrets go with it) and waits for it to be gone. */
export async function cancelRun(run: Run, job: string, namespace = run.ns, uid?: string): Promise<AdapterExecutionResult> {
  const { kube, settings } = run;
  if (!job) {
    // Following a run whose Job is not known: work may be going on
    // that this cancel cannot reach, so no claim that none started.
    return {
      exitCode: null,
      signal: null,
      timedOut: false,
      errorCode: ErrorCodes.cancelled,
      errorMessage: "Cancelled, but the run's Job is not known, so nothing was deleted: the agent may still be running",
    };
  }
  await run.notice(`cancelled: deleting Job ${namespace}/${job} (propagation ${settings.deletePropagation})`);
  try {
    // Only the run's own Job: another may have its name by now.
    await kube.deleteJob(namespace, job, settings.deletePropagation, uid);
  } catch (err) {
    if (!isNotFound(err)) {
      return {
        exitCode: null,
        signal: null,
        timedOut: false,
        errorCode: ErrorCodes.cancelled,
        errorMessage: `Cancelled, but deleting Job ${namespace}/${job} failed: ${readKubeError(err).message}`,
      };
    }
  }
  // With Foreground propagation the Job is gone only once its pods are,
  // so its absence confirms the agent stopped.
  const gone = await waitGone(run, namespace, job);
  // A Job deleted at once may go before clipjob made it the owner of the
  // run's Secrets; with the Job gone they serve nothing, so remove them
  // (already gone with the Job is fine).
  if (gone) await run.dropSecrets();
  return {
    exitCode: null,
    signal: "SIGTERM",
    timedOut: false,
    errorCode: ErrorCodes.cancelled,
    errorMessage: gone
      ? `Cancelled: Job ${namespace}/${job} and its pods were deleted`
      : `Cancelled: Job ${namespace}/${job} is being deleted but was still there after ${settings.cancelGraceSec}s`,
    resultJson: gone
      ? { executionCancellation: { state: "acknowledged", acknowledgedAt: new Date().toISOString(), forced: false } }
      : { clipjob: { job: `${namespace}/${job}`, deletionRequested: true } },
  };
}
