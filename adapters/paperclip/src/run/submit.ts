// Submitting a run: its prompt, env and objects are built, Paperclip is
// told what runs it (onMeta), its Secrets are created, then its bare Job.
// An earlier attempt at this very run that already made them is followed
// instead, and an orphaned Job of the agent that holds its claim is
// deleted so this run can start.

import { randomBytes } from "node:crypto";

import type { AdapterExecutionResult } from "@paperclipai/adapter-utils";
import type { V1Job } from "@kubernetes/client-node";

import { ANNOTATION_PROFILE, ANNOTATION_QUEUE_HOLDER, ANNOTATION_QUEUE_POSITION, ANNOTATION_QUEUED, ANNOTATION_WORKING_DIR, LABEL_AGENT_ID, LABEL_RUN_ID } from "../contract.js";
import { paperclipClient, runHome } from "../deps.js";
import { classifyCreateError, createFailureResult, ErrorCodes, failureResult, isNotFound, readKubeError, secretFailureResult } from "../errors.js";
import { buildRunObjects, isLabelValue, renameRunSecret, retryJobName, RunIdentityError, type RunObjects } from "../job.js";
import { ENDED_RUN_STATUSES } from "../paperclip.js";
import { ensureRunDirs, mountedRunDirs, RunDirsError } from "../rundirs.js";
import { buildPrompt, buildRunEnv, sessionToResume, taskIdOf, type BuiltPrompt } from "../prompt.js";
import { sleep } from "../relay.js";
import { planSkills, skillsPrompt, skillWarnings } from "../skills.js";
import { serverStopping, watchServerStop } from "../shutdown.js";
import { cancelledBeforeStart, waitGone } from "./cancel.js";
import { ownershipOf } from "./ownership.js";
import { jobFinished, type FollowTarget, type Run, type RunEnds } from "./run.js";

/** What is submitted for the run. */
interface Submission {
  objects: RunObjects;
  prompt: BuiltPrompt;
  /** The Job's name: the run's own, or another after another run's Job took it. */
  jobName: string;
  /** The session the run resumes; empty for a new one. */
  resumeSession: string;
}

/**
 * Submits the run: the Job it created (to follow, unless it was
 * cancelled meanwhile), an earlier attempt's Job found before that (to
 * follow as it is), or the result the run ends with.
 */
export async function submit(run: Run): Promise<RunEnds | { existing: FollowTarget } | { created: FollowTarget }> {
  const sub = await prepare(run);
  if ("result" in sub) return sub;
  await announce(run, sub);
  const secrets = await createSecrets(run, sub);
  if (secrets) return secrets;
  if (run.ctx.signal?.aborted) {
    await run.dropSecrets();
    return { result: cancelledBeforeStart("before its Job was created") };
  }
  // The server is stopping: Paperclip will not follow this run again.
  // From here on a stop is heard, so one that comes after the Job is
  // created and before its follow starts still deletes it.
  watchServerStop();
  const stopping = serverStopping();
  if (stopping) {
    await run.dropSecrets();
    return { result: cancelledBeforeStart(`before its Job was created: the Paperclip server is stopping (${stopping})`) };
  }
  try {
    const home = runHome(run.deps);
    for (const n of await ensureRunDirs({ agentId: run.agentId, companyId: run.ctx.agent.companyId ?? "" }, home, home.sharedVolume)) await run.notice(n);
  } catch (err) {
    if (!(err instanceof RunDirsError)) throw err;
    await run.dropSecrets();
    return { result: failureResult(ErrorCodes.jobCreateFailed, `The run is not submitted: ${err.message}`) };
  }
  const created = await createJob(run, sub);
  if ("result" in created) return created;
  await announceAdmitted(run, sub, created.admitted);
  return { created: target(run, sub, created.admitted) };
}

/** The run's Job, as the follow stage takes it. */
function target(run: Run, sub: Submission, job: V1Job | null): FollowTarget {
  return { runId: run.ctx.runId, namespace: run.ns, job: sub.jobName, resumedSessionId: sub.resumeSession || null, jobUid: job?.metadata?.uid };
}

/** The session to resume, the prompt, the env and the run's objects; each one's notes said as notices. */
async function prepare(run: Run): Promise<Submission | RunEnds> {
  const { ctx, settings, agentId, ns, workingDir } = run;
  let resumeSession = sessionToResume(ctx.runtime, workingDir);
  if (resumeSession && !isLabelValue(resumeSession)) {
    await run.notice(`session ${JSON.stringify(resumeSession)} cannot be a label value, so it is not resumed: the agent starts a new session`);
    resumeSession = "";
  }
  const home = runHome(run.deps);
  // The company's skills the pod can read, named in the prompt; an enabled
  // one it cannot read is a warning, never a failed run (skills.ts).
  const skills = await planSkills(ctx.config ?? {}, ctx.agent.companyId ?? "", home);
  for (const w of skillWarnings(skills)) await run.notice(w);
  const prompt = await buildPrompt(ctx, settings, resumeSession !== "", undefined, skillsPrompt(skills));
  for (const n of prompt.notes) await run.notice(n);
  const runEnv = buildRunEnv(ctx, settings, mountedRunDirs(agentId, ctx.agent.companyId ?? "", home, home.sharedVolume));
  for (const n of runEnv.notes) await run.notice(n);
  let objects: RunObjects;
  try {
    objects = buildRunObjects({
      identity: { agentId, runId: ctx.runId, companyId: ctx.agent.companyId, taskId: taskIdOf(ctx.context ?? {}) },
      namespace: ns,
      profile: settings.profile,
      prompt: prompt.prompt,
      env: runEnv.env,
      sessionId: resumeSession || null,
      model: settings.model || null,
      maxTurns: settings.maxTurnsPerRun || null,
      workingDir: workingDir || null,
      timeoutSec: settings.timeoutSec,
      ttlSecondsAfterFinished: settings.ttlSecondsAfterFinished,
      promptAnnotationMaxBytes: settings.promptAnnotationMaxBytes,
    });
  } catch (err) {
    if (err instanceof RunIdentityError) return { result: failureResult(ErrorCodes.jobCreateFailed, `The run cannot be submitted: ${err.message}`) };
    throw err;
  }
  for (const n of objects.notes) await run.notice(n);
  return { objects, prompt, jobName: objects.jobName, resumeSession };
}

/** Tells Paperclip what runs the run (onMeta): the Job, where, and with what. */
async function announce(run: Run, { objects, prompt, jobName, resumeSession }: Submission): Promise<void> {
  const { ctx, settings, ns } = run;
  await ctx.onMeta?.({
    adapterType: run.def.type,
    command: `clipjob bare Job ${ns}/${jobName}`,
    ...(objects.job.metadata?.annotations?.[ANNOTATION_WORKING_DIR] ? { cwd: run.workingDir } : {}),
    commandNotes: [
      `Namespace: ${ns}`,
      `Profile (paperclip.io/adapter-type): ${settings.profile}`,
      `Prompt: ${objects.promptDelivery === "secret" ? `Secret ${objects.promptSecret?.metadata?.name}` : "pod-template annotation"}`,
      ...(resumeSession ? [`Resuming session ${resumeSession}`] : []),
      ...(settings.model ? [`Model: ${settings.model}`] : []),
      `Relay: ${run.relay.baseUrl}`,
    ],
    prompt: prompt.prompt,
    promptMetrics: prompt.metrics,
    context: ctx.context,
  });
}

/**
 * Creates the run's Secrets: null when they were, an earlier attempt's
 * Job to follow, or the result the run ends with.
 */
async function createSecrets(run: Run, sub: Submission): Promise<RunEnds | { existing: FollowTarget } | null> {
  const { kube, ns } = run;
  const { objects } = sub;
  // The run's Secrets first, labeled for the run: the Job refers to them,
  // and clipjob makes the Job their owner once it exists.
  for (const [which, secret] of [
    ["env", objects.envSecret],
    ["prompt", objects.promptSecret],
  ] as const) {
    if (!secret) continue;
    const name = secret.metadata!.name!;
    try {
      await kube.createSecret(ns, secret);
    } catch (err) {
      const e = readKubeError(err);
      if (e.httpStatus === 409 && e.status?.reason === "AlreadyExists") {
        // Made by an earlier attempt at this run? If that attempt's Job
        // exists, follow it. If not, the name is taken by a Secret this
        // adapter cannot vouch for (it may not read Secrets): use another
        // name, leaving that one alone.
        const prior = await priorAttempt(run, sub.jobName);
        if ("job" in prior) {
          await run.notice(`Job ${ns}/${sub.jobName} of this run already exists; following it`);
          return { existing: target(run, sub, prior.job) };
        }
        if ("unknown" in prior) return { result: await undecided(run, prior.unknown) };
        const renamed = renameRunSecret(objects, which, randomBytes(3).toString("hex"));
        await run.notice(`a Secret ${ns}/${name} already exists and is not known to be this run's; the run's ${which} Secret is ${renamed} instead`);
        try {
          await kube.createSecret(ns, secret);
        } catch (again) {
          await run.dropSecrets();
          return { result: secretFailureResult(which, `${ns}/${renamed}`, again) };
        }
      } else {
        await run.dropSecrets();
        return { result: secretFailureResult(which, `${ns}/${name}`, err) };
      }
    }
    run.createdSecrets.push(secret.metadata!.name!); // renamed, perhaps
  }
  return null;
}

/**
 * Creates the run's Job: the Job clipjob admitted (or an earlier
 * attempt's, found under the name), or the result the run ends with. A
 * name another run's Job took is changed once; an orphan holding the
 * agent's claim is deleted once, and the Job created again.
 */
async function createJob(run: Run, sub: Submission): Promise<RunEnds | { admitted: V1Job | null }> {
  const { ctx, kube, ns } = run;
  const { objects } = sub;
  ctx.onDispatch?.();
  let admitted: V1Job | null = null;
  let reaped = false;
  const webhookWait = webhookWaits(run);
  const releaseWait = releaseWaits(run);
  for (let attempt = 0; attempt < 2 && !admitted; attempt++) {
    try {
      admitted = await kube.createJob(ns, objects.job);
    } catch (err) {
      const f = classifyCreateError(err);
      const again =
        f.kind === "guard-unreachable"
          ? await webhookWait(f.error.message)
          : f.kind === "agent-busy" && f.holderJob && f.holderRunId !== ctx.runId && (await releaseWait(f.holderJob));
      if (again) {
        attempt--;
        continue;
      }
      // Cancelled, perhaps while waiting: nothing of it runs, and no
      // orphan is reaped for it.
      if (ctx.signal?.aborted) {
        await run.dropSecrets();
        return { result: cancelledBeforeStart("before its Job was created") };
      }
      if (f.kind === "agent-busy" && !reaped && f.holderJob && f.holderRunId !== ctx.runId) {
        reaped = true;
        // Read running just now, the holder may be marked finished by the
        // time reapOrphan reads it (the Job controller marks a Job a
        // moment after its pod ends): then it is no orphan, and the run
        // waits for clipjob to let go as for a Job read finished at once.
        if ((await reapOrphan(run, f.holderJob, f.holderRunId)) || (await releaseWait(f.holderJob))) {
          attempt--;
          continue;
        }
        if (ctx.signal?.aborted) {
          await run.dropSecrets();
          return { result: cancelledBeforeStart("before its Job was created") };
        }
      }
      if (f.kind === "name-taken") {
        const prior = await priorAttempt(run, sub.jobName);
        if ("job" in prior) {
          await run.notice(`Job ${ns}/${sub.jobName} of this run already exists; following it`);
          admitted = prior.job;
          break;
        }
        if ("unknown" in prior) return { result: await undecided(run, prior.unknown) };
        if (attempt === 0) {
          // Another run's Job has the name (two run ids with the same
          // slug and hash prefix): take another.
          sub.jobName = retryJobName(objects.jobName, randomBytes(3).toString("hex"));
          objects.job.metadata!.name = sub.jobName;
          continue;
        }
      }
      await run.dropSecrets();
      const result = createFailureResult(f, `${ns}/${sub.jobName}`);
      await run.notice(result.errorMessage ?? "the Job was not created");
      return { result };
    }
  }
  return { admitted };
}

/**
 * The waits of a run whose Job create clipjob's webhook could not judge.
 * The webhook fails closed, so nothing was created and asking again is
 * safe; a webhook replica that was killed stays in its Service's
 * endpoints for a few seconds, until the kubelet and the endpoint
 * controller see it gone, and the API server's calls that reach it fail
 * meanwhile. The run asks again for webhookGraceSec, each wait said in
 * its log, before it fails with k8s_concurrency_guard_unreachable.
 * Returns whether to ask again (after the wait).
 */
function webhookWaits(run: Run): (why: string) => Promise<boolean> {
  const { ctx, deps, settings } = run;
  const deadline = Date.now() + settings.webhookGraceSec * 1000;
  let backoff = deps.follow?.initialBackoffMs ?? 500;
  const maxBackoff = Math.min(deps.follow?.maxBackoffMs ?? 4_000, 4_000);
  return async (why) => {
    if (ctx.signal?.aborted || Date.now() + backoff > deadline) return false;
    await run.notice(`clipjob's admission webhook could not be reached, so nothing was created (${why}); asking again in ${backoff} ms`);
    await sleep(backoff, ctx.signal);
    backoff = Math.min(backoff * 2, maxBackoff);
    return !ctx.signal?.aborted;
  };
}

/** How long a run waits for clipjob to let go of an agent whose holding Job has ended. */
const RELEASE_GRACE_MS = 15_000;

/**
 * The waits of a run refused because the agent is busy with a Job that
 * has ended (Complete or Failed, being deleted, or gone). The agent's
 * previous run ends in Paperclip when its pod's output ends, a moment
 * before the Job controller marks the Job finished and clipjob's cache
 * sees it; a run woken at once would be refused. It asks again for up to
 * RELEASE_GRACE_MS, each wait said in its log; a holder still running is
 * no reason to wait. Returns whether to ask again (after the wait).
 */
function releaseWaits(run: Run): (holderRef: string) => Promise<boolean> {
  const { ctx, kube, ns } = run;
  const deadline = Date.now() + (run.deps.releaseGraceMs ?? RELEASE_GRACE_MS);
  let backoff = 250;
  return async (holderRef) => {
    const [holderNs, holderName] = holderRef.split("/", 2);
    if (holderNs !== ns || !holderName || ctx.signal?.aborted || Date.now() + backoff > deadline) return false;
    let ended: string;
    try {
      const job = await kube.readJob(holderNs, holderName);
      if (job.metadata?.deletionTimestamp) ended = "is being deleted";
      else if (jobFinished(job)) ended = "has finished";
      else return false;
    } catch (err) {
      if (!isNotFound(err)) return false;
      ended = "is gone";
    }
    await run.notice(`the agent's Job ${holderRef} ${ended}, and clipjob has not let go of the agent yet; asking again in ${backoff} ms`);
    await sleep(backoff, ctx.signal);
    backoff = Math.min(backoff * 2, 2_000);
    return !ctx.signal?.aborted;
  };
}

/** Says the Job was created, and how clipjob admitted it; an orphan ahead of a queued run is deleted. */
async function announceAdmitted(run: Run, sub: Submission, admitted: V1Job | null): Promise<void> {
  const { ns } = run;
  const annotations = admitted?.metadata?.annotations ?? {};
  await run.notice(
    `created Job ${ns}/${sub.jobName}${annotations[ANNOTATION_PROFILE] ? ` (clipjob profile ${annotations[ANNOTATION_PROFILE]})` : ""}; prompt by ${sub.objects.promptDelivery}`,
  );
  if (ANNOTATION_QUEUED in annotations) {
    // Queue mode: admitted suspended; clipjob starts it when the agent is
    // free. The follow below has no scheduling timeout, so it just waits.
    const holder = annotations[ANNOTATION_QUEUE_HOLDER];
    const position = annotations[ANNOTATION_QUEUE_POSITION];
    await run.notice(
      `queued by clipjob: the run starts when the agent's active run${holder ? ` (Job ${holder})` : ""} ends${position ? `; position ${position} in the agent's queue` : ""}`,
    );
    // An orphan ahead of it would hold it until the orphan's deadline.
    if (holder) await reapOrphan(run, holder.includes("/") ? holder : `${ns}/${holder}`);
  }
}

/**
 * The Job an earlier attempt at this very run created (its name, its
 * labels, and clipjob says this server made it); none when there is no
 * such Job; unknown when that cannot be told, and then nothing more may
 * be created: a second Job would run the run twice.
 */
async function priorAttempt(run: Run, jobName: string): Promise<{ job: V1Job } | { none: true } | { unknown: string }> {
  const { ns } = run;
  let job: V1Job;
  try {
    job = await run.kube.readJob(ns, jobName);
  } catch (err) {
    return isNotFound(err) ? { none: true } : { unknown: `Job ${ns}/${jobName} could not be read (${readKubeError(err).message})` };
  }
  const labels = job.metadata?.labels ?? {};
  if (labels[LABEL_RUN_ID] !== run.ctx.runId || labels[LABEL_AGENT_ID] !== run.agentId) return { none: true };
  const o = await ownershipOf(run, job);
  if ("ours" in o) return { job };
  if ("unknown" in o) return { unknown: `Job ${ns}/${jobName} carries this run's labels, and whether this server created it cannot be told: ${o.unknown}` };
  await run.notice(`Job ${ns}/${jobName} carries this run's labels but is not this server's: ${o.foreign}`);
  return { none: true };
}

/** The run cannot go on without risking a second Job: what this execution created is removed. */
async function undecided(run: Run, why: string): Promise<AdapterExecutionResult> {
  await run.dropSecrets();
  return failureResult(ErrorCodes.jobCreateFailed, `The run was not submitted: ${why}. A second Job could run it twice, so nothing more was created`);
}

/**
 * Deletes the agent's active Job `holderRef` (namespace/name) when it is
 * an orphan: this server's Job of another run of this agent that
 * Paperclip says has ended (a server that stopped mid-run left it, and
 * nobody follows it). True when it was deleted and is gone. Anything
 * that cannot be shown leaves the Job alone.
 */
async function reapOrphan(run: Run, holderRef: string, holderRunId?: string): Promise<boolean> {
  const { ctx, kube, settings, ns, agentId } = run;
  const [holderNs, holderName] = holderRef.split("/", 2);
  if (!holderNs || !holderName || holderNs !== ns) return false;
  let job: V1Job;
  try {
    job = await kube.readJob(holderNs, holderName);
  } catch {
    return false;
  }
  const labels = job.metadata?.labels ?? {};
  const runId = labels[LABEL_RUN_ID] ?? "";
  if (!runId || runId === ctx.runId || (holderRunId && runId !== holderRunId) || labels[LABEL_AGENT_ID] !== agentId) return false;
  if (job.metadata?.deletionTimestamp || jobFinished(job)) return false;
  if (!("ours" in (await ownershipOf(run, job)))) return false;
  const state = await paperclipClient(settings, ctx.authToken, run.deps).runStatus(runId, ctx.signal);
  if ("unknown" in state) {
    await run.notice(`the agent's run ${runId} holds it (Job ${holderRef}); whether Paperclip still runs it is not known (${state.unknown}), so it is left alone`);
    return false;
  }
  if (!ENDED_RUN_STATUSES.has(state.status)) return false;
  await run.notice(
    `the agent's run ${runId} ended in Paperclip (${state.status}) but its Job ${holderRef} is still active: a server that stopped mid-run left it, and nobody follows it. Deleting it`,
  );
  try {
    await kube.deleteJob(holderNs, holderName, settings.deletePropagation, job.metadata?.uid);
  } catch (err) {
    if (!isNotFound(err)) {
      await run.notice(`deleting the orphaned Job ${holderRef}: ${readKubeError(err).message}`);
      return false;
    }
  }
  return waitGone(run, holderNs, holderName);
}
