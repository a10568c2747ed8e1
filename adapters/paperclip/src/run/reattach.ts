// Re-attaching: before anything is created, whether this very run is
// already going (an earlier attempt at it, or the run it retries), so it
// is followed instead of started twice. Runs the relay lists and runs
// clipjob holds in its queue are both looked at.

import type { V1Job } from "@kubernetes/client-node";

import { ANNOTATION_QUEUED, LABEL_AGENT_ID, LABEL_COMPANY_ID, LABEL_RUN_ID, LABEL_SESSION_ID, LABEL_TASK_ID } from "../contract.js";
import { ErrorCodes, failureResult, isNotFound, message, readKubeError } from "../errors.js";
import { RelayHttpError, sleep, type RelayRun } from "../relay.js";
import { cancelledBeforeStart } from "./cancel.js";
import { ownershipOf } from "./ownership.js";
import { jobFinished, type FollowTarget, type Run, type RunEnds } from "./run.js";

/** The phase this adapter gives a run clipjob queued, which the relay does not know yet. */
const QUEUED_PHASE = "Queued";

// This very run already going: an earlier attempt at it submitted its
// Job (the server restarted mid-run and Paperclip runs it again). Only
// that is followed. Another run of the agent is another run, whatever its
// task, even the one Paperclip retries with this one (retryOfRunId):
// following it would hand its output and its cost to this run as well
// (Paperclip lets an agent have 20 runs at once by default), and the
// agent's other runs would take its Job for an orphan and delete it
// (submit.ts, reapOrphan: Paperclip says the retried run ended). For
// another run clipjob decides: it refuses this run (Reject mode) or
// queues it (Queue mode). A run whose pod has not started yet (Pending)
// is as active as one whose pod runs; so is one clipjob queued (no pod at
// all, so the relay does not know it yet: found from the agent's Jobs).
function mine(run: Run, id: string): boolean {
  return id === run.ctx.runId;
}

/**
 * The run to follow instead of submitting this one, the result the run
 * ends with (cancelled, or the relay cannot be asked), or null to submit
 * it. Nothing is looked at when re-attaching is turned off.
 */
export async function reattach(run: Run): Promise<{ follow: FollowTarget } | RunEnds | null> {
  if (!run.settings.reattach) return null;
  const running = await activeRuns(run);
  if ("result" in running) return running;
  const found = await pick(run, running.runs);
  if (!found) return null;
  const { existing, uid } = found;
  await run.notice(
    `re-attaching to the agent's ${existing.phase === QUEUED_PHASE ? "queued" : "running"} run ${existing.id} (Job ${existing.namespace}/${existing.job ?? "?"}) instead of starting another; its log is followed from the start`,
  );
  // Without a uid this run's own Job is gone: there is no Job to
  // watch or delete, and a Job now of its name is another.
  return {
    follow: { runId: existing.id, namespace: existing.namespace, job: uid ? (existing.job ?? "") : "", resumedSessionId: existing.session ?? null, jobUid: uid },
  };
}

/**
 * Whether asking the relay again may get an answer: it was not reached,
 * or answered that it cannot now (5xx). A relay that refuses this server
 * (401, 403) or the request (4xx) says the same again.
 */
function passing(err: unknown): boolean {
  return !(err instanceof RelayHttpError) || err.status >= 500;
}

/** The agent's active runs: the relay's Running and Pending ones, then those clipjob queued. */
async function activeRuns(run: Run): Promise<{ runs: RelayRun[] } | RunEnds> {
  const { ctx, relay, agentId, settings, deps } = run;
  // A relay being replaced (its pod killed, its store reopened) answers
  // again within seconds: the run waits for it as long as a run's follow
  // would (relayGraceSec), rather than failing before it started.
  const deadline = Date.now() + (deps.follow?.relayGraceMs ?? settings.relayGraceSec * 1000);
  let backoff = deps.follow?.initialBackoffMs ?? 500;
  const maxBackoff = Math.min(deps.follow?.maxBackoffMs ?? 5_000, 5_000);
  let running: RelayRun[];
  for (;;) {
    try {
      running = [
        ...(await relay.listRuns({ agent: agentId, phase: "Running" }, ctx.signal)),
        ...(await relay.listRuns({ agent: agentId, phase: "Pending" }, ctx.signal)),
      ];
      break;
    } catch (err) {
      if (ctx.signal?.aborted) return { result: cancelledBeforeStart("before anything was created") };
      if (passing(err) && Date.now() + backoff < deadline) {
        await run.notice(`the relay at ${relay.baseUrl} cannot say whether the agent has a running run (${message(err)}); asking again in ${backoff} ms`);
        await sleep(backoff, ctx.signal);
        backoff = Math.min(backoff * 2, maxBackoff);
        continue;
      }
      return {
        result: failureResult(
          ErrorCodes.relayUnavailable,
          `Asking the relay at ${relay.baseUrl} for a running run of agent ${agentId} (nothing was created; the run could not be followed without it): ${message(err)}`,
        ),
      };
    }
  }
  running.push(...(await queuedRuns(run)));
  return { runs: running };
}

/** This run among the agent's active runs, with its Job's uid (none: its own Job is gone); each one passed over is said why. */
async function pick(run: Run, running: RelayRun[]): Promise<{ existing: RelayRun; uid: string | undefined } | null> {
  const { ctx, settings, agentId } = run;
  // This run's own record first, then the run it retries. Only runs this
  // adapter could have started: its namespace and the agent's company.
  // The relay lists every namespace the server's token may read, and a
  // run elsewhere with the agent's id is someone else's Job wearing its
  // label.
  running.sort((a, b) => Number(b.id === ctx.runId) - Number(a.id === ctx.runId));
  for (const r of running) {
    if (r.agent !== agentId || r.done) continue;
    if (!mine(run, r.id)) {
      await run.notice(
        `the agent's run ${r.id} is another run: not re-attaching to it (Paperclip may run an agent several times at once); clipjob decides whether this run waits or is refused`,
      );
      continue;
    }
    if (r.namespace !== settings.namespace || (r.company ?? "") !== (ctx.agent.companyId ?? "")) {
      await run.notice(
        `not re-attaching to run ${r.id} of agent ${agentId} in namespace ${r.namespace} (company ${r.company ?? "none"}): this adapter runs the agent in ${settings.namespace} for company ${ctx.agent.companyId ?? "none"}`,
      );
      continue;
    }
    // The relay marks a run done only once its pod's streams have
    // drained, a few seconds after the pod went. Another run whose Job
    // is gone, being deleted or finished (cancelled a moment ago, say)
    // is ending: following it would hand its output and end on as this
    // run's, and start nothing. A Job another user created is not this
    // agent's run, whatever its labels say.
    const verdict = await notToFollow(run, r);
    if ("why" in verdict) {
      await run.notice(`not re-attaching to the agent's run ${r.id}, which the relay lists as ${r.phase}: ${verdict.why}`);
      continue;
    }
    return { existing: r, uid: verdict.uid };
  }
  return null;
}

/**
 * The agent's runs clipjob holds in its queue (Queue mode): suspended
 * Jobs with no pod, which the relay learns of only once they start. In
 * the shape the relay lists runs, so the same checks apply. A list that
 * fails is a notice: the relay's runs are still looked at.
 */
async function queuedRuns(run: Run): Promise<RelayRun[]> {
  const { kube, ns, agentId } = run;
  let jobs: V1Job[];
  try {
    jobs = await kube.listJobs(ns, `${LABEL_AGENT_ID}=${agentId}`);
  } catch (err) {
    await run.notice(`listing the agent's Jobs for a queued run: ${readKubeError(err).message}; only the relay's runs are looked at`);
    return [];
  }
  return jobs
    .filter((j) => j.spec?.suspend === true && ANNOTATION_QUEUED in (j.metadata?.annotations ?? {}) && !jobFinished(j))
    .map((j) => {
      const l = j.metadata?.labels ?? {};
      return {
        id: l[LABEL_RUN_ID] ?? "",
        namespace: ns,
        job: j.metadata?.name,
        jobUid: j.metadata?.uid,
        agent: l[LABEL_AGENT_ID],
        company: l[LABEL_COMPANY_ID],
        task: l[LABEL_TASK_ID],
        session: l[LABEL_SESSION_ID],
        phase: QUEUED_PHASE,
        done: false,
        lastSeq: 0,
      };
    })
    .filter((r) => r.id !== "");
}

/**
 * Why this run's record, which the relay lists as active, is not one to
 * follow: its Job is not (known to be) this server's. It is followed
 * whatever its Job's state otherwise (that is how this run ended); the
 * uid is that of the Job, or none when the Job is gone or another Job has
 * its name.
 */
async function notToFollow(run: Run, r: RelayRun): Promise<{ why: string } | { uid: string | undefined }> {
  if (!r.job) return { why: "the relay names no Job for it, so who created it cannot be checked" };
  const ref = `${r.namespace}/${r.job}`;
  let job: V1Job;
  try {
    job = await run.kube.readJob(r.namespace, r.job);
  } catch (err) {
    // This run's own record is followed whatever its Job's state: that
    // is how this run ended.
    if (isNotFound(err)) return { uid: undefined };
    return { why: `its Job ${ref} could not be read to check it (${readKubeError(err).message})` };
  }
  if (r.jobUid && job.metadata?.uid && job.metadata.uid !== r.jobUid) return { uid: undefined };
  const o = await ownershipOf(run, job);
  if ("foreign" in o) return { why: `its Job ${ref} is not this server's: ${o.foreign}` };
  if ("unknown" in o) return { why: `its Job ${ref} is not known to be this server's: ${o.unknown}` };
  return { uid: job.metadata?.uid };
}
