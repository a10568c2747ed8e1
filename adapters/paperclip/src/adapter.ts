// Paperclip's server adapter interface (ServerAdapterModule) over clipjob:
// execute() submits the run as a bare Job and follows it through the relay;
// testEnvironment() checks from the server's side what `clipjob doctor`
// checks from an operator's. What a run does, step by step, is README
// "How a run goes" in this package.

import { randomBytes } from "node:crypto";

import type {
  AdapterEnvironmentCheck,
  AdapterEnvironmentTestContext,
  AdapterEnvironmentTestResult,
  AdapterExecutionContext,
  AdapterExecutionResult,
  AdapterModel,
  AdapterSessionCodec,
  ServerAdapterModule,
} from "@paperclipai/adapter-utils";
import { getAdapterSessionManagement } from "@paperclipai/adapter-utils/session-compaction";
import type { V1Job } from "@kubernetes/client-node";

import { resolveSettings, SettingsError, type ClipjobSettings } from "./config.js";
import {
  ANNOTATION_CREATED_BY,
  ANNOTATION_PROFILE,
  ANNOTATION_QUEUE_HOLDER,
  ANNOTATION_QUEUE_POSITION,
  ANNOTATION_QUEUED,
  ANNOTATION_WORKING_DIR,
  LABEL_AGENT_ID,
  LABEL_COMPANY_ID,
  LABEL_RUN_ID,
  LABEL_SESSION_ID,
  LABEL_TASK_ID,
  RELAY_TOKEN_AUDIENCE,
} from "./contract.js";
import {
  classifyCreateError,
  createFailureResult,
  ErrorCodes,
  failureResult,
  isNotFound,
  message,
  readKubeError,
  secretFailureResult,
} from "./errors.js";
import { buildRunObjects, isLabelValue, jobNameFor, renameRunSecret, retryJobName, RunIdentityError, type RunObjects } from "./job.js";
import { kubeApi, loadKubeConfig, type KubeApi } from "./kube.js";
import { builtinModels, CLAUDE_MODELS, OPENCODE_MODELS } from "./models.js";
import { ENDED_RUN_STATUSES, paperclipRuns, type PaperclipRuns } from "./paperclip.js";
import { buildPrompt, buildRunEnv, retryOfRunId, sessionToResume, taskIdOf, workspaceOf } from "./prompt.js";
import { followRun, RelayClient, type FollowOptions, type JobState, type RelayRun } from "./relay.js";
import { toExecutionResult } from "./result.js";
import { followUntilShutdown } from "./shutdown.js";

/** The phase this adapter gives a run clipjob queued, which the relay does not know yet. */
const QUEUED_PHASE = "Queued";

/** One Paperclip adapter type and the clipjob profile its runs use. */
export interface AdapterDefinition {
  /**
   * Paperclip's adapter type. Not a built-in type: Paperclip would let it
   * take one over, which would move every local agent of that type to
   * Kubernetes at once (see the README).
   */
  type: string;
  label: string;
  /** The paperclip.io/adapter-type label: the clipjob profile (config key `profile` overrides it). */
  profile: string;
  /** The models an agent may pick, and the built-in adapter package whose list they follow. */
  models?: AdapterModel[];
  builtinPackage?: string;
}

export const CLAUDE_ADAPTER: AdapterDefinition = {
  type: "claude_k8s",
  label: "Claude (Kubernetes, clipjob)",
  profile: "claude_local",
  models: CLAUDE_MODELS,
  builtinPackage: "@paperclipai/adapter-claude-local",
};
export const OPENCODE_ADAPTER: AdapterDefinition = {
  type: "opencode_k8s",
  label: "OpenCode (Kubernetes, clipjob)",
  profile: "opencode_local",
  models: OPENCODE_MODELS,
  builtinPackage: "@paperclipai/adapter-opencode-local",
};

/** Seams for tests: the cluster, the relay, and the follower's timings. */
export interface AdapterDeps {
  kube?: (settings: ClipjobSettings) => KubeApi;
  relay?: (settings: ClipjobSettings) => RelayClient;
  follow?: Partial<
    Pick<FollowOptions, "initialBackoffMs" | "maxBackoffMs" | "unknownRunPollMs" | "jobCheckEveryMs" | "relayGraceMs" | "idleTimeoutMs" | "maxAuthFailures">
  >;
  /** How often a cancelled Job is checked for being gone. Default 1 s. */
  cancelPollMs?: number;
  env?: NodeJS.ProcessEnv;
  /** Paperclip's API, as the run (whether a run is still live there). */
  paperclip?: (settings: ClipjobSettings, token: string | undefined) => PaperclipRuns;
}

const defaultKube = (s: ClipjobSettings): KubeApi => kubeApi(loadKubeConfig(s.kubeconfig));
const defaultRelay = (s: ClipjobSettings): RelayClient =>
  new RelayClient({ baseUrl: s.relayUrl, tokenFile: s.relayTokenFile, caFile: s.relayCaFile || undefined });

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Whether the Job has finished (a Complete or Failed condition). */
function jobFinished(job: V1Job): boolean {
  return (job.status?.conditions ?? []).some((c) => (c.type === "Complete" || c.type === "Failed") && c.status === "True");
}

/**
 * Paperclip stores sessionParams as the adapter returns them and hands
 * them back on the next run; the codec keeps the session id and the
 * working directory it belongs to.
 */
export const sessionCodec: AdapterSessionCodec = {
  deserialize(raw) {
    if (!raw || typeof raw !== "object" || Array.isArray(raw)) return null;
    const r = raw as Record<string, unknown>;
    const sessionId = typeof r.sessionId === "string" ? r.sessionId.trim() : typeof r.session_id === "string" ? r.session_id.trim() : "";
    if (!sessionId) return null;
    return { sessionId, ...(typeof r.cwd === "string" && r.cwd ? { cwd: r.cwd } : {}) };
  },
  serialize(params) {
    return params ? this.deserialize(params) : null;
  },
  getDisplayId(params) {
    return typeof params?.sessionId === "string" ? params.sessionId : null;
  },
};

/** Runs one Paperclip run as a clipjob bare Job. */
export async function executeRun(def: AdapterDefinition, ctx: AdapterExecutionContext, deps: AdapterDeps = {}): Promise<AdapterExecutionResult> {
  // The adapter's own notices go to stderr, so stdout is exactly the
  // agent's output, which Paperclip's transcript parsers read.
  const notice = async (msg: string) => {
    await ctx.onLog("stderr", `[clipjob] ${msg}\n`);
  };
  const warnings: string[] = [];
  let settings: ClipjobSettings;
  try {
    settings = resolveSettings(ctx.config ?? {}, { profile: def.profile }, (w) => warnings.push(w), deps.env);
  } catch (err) {
    if (!(err instanceof SettingsError)) throw err;
    for (const w of warnings) await notice(w);
    return failureResult(ErrorCodes.configInvalid, `The run cannot be submitted (nothing was created): ${err.message}`);
  }
  for (const w of warnings) await notice(w);

  // Cancellation arrives on ctx.signal once the adapter says it can honour it.
  await ctx.onCancellationReady?.();
  if (ctx.signal?.aborted) return cancelledBeforeStart("before anything was created");

  let kube: KubeApi;
  try {
    kube = (deps.kube ?? defaultKube)(settings);
  } catch (err) {
    return failureResult(ErrorCodes.jobCreateFailed, `Loading the Kubernetes client configuration${settings.kubeconfig ? ` from ${settings.kubeconfig}` : ""}: ${message(err)}`);
  }
  const relay = (deps.relay ?? defaultRelay)(settings);
  const ns = settings.namespace;
  const agentId = ctx.agent.id;
  const workspace = workspaceOf(ctx.context ?? {});
  const workingDir = workspace.cwd || settings.cwd;
  // The Secrets this execution created, removed again if its Job is not
  // admitted or is cancelled before clipjob could take them.
  const createdSecrets: string[] = [];
  const dropSecrets = async () => {
    for (const name of createdSecrets) {
      await kube.deleteSecret(ns, name).catch(async (err) => {
        if (!isNotFound(err)) await notice(`could not delete the run's Secret ${ns}/${name}: ${readKubeError(err).message}`);
      });
    }
  };

  // Who the API server says this server is, asked once it is known (a
  // failed answer is asked again): clipjob records the creating user on
  // every Job, and only Jobs this server created are its runs (labels can
  // be copied by anyone who may create Jobs here).
  let self: Promise<string> | null = null;
  const ownershipOf = async (job: V1Job): Promise<Ownership> => {
    try {
      self ??= kube.whoAmI().catch((err) => {
        self = null;
        throw err;
      });
      return ownership(job, await self);
    } catch (err) {
      return ownership(job, { error: readKubeError(err).message });
    }
  };

  /**
   * Why a run the relay lists as active is not one to follow: its Job is
   * not this server's, is gone, being deleted, finished, or replaced by
   * another Job of the name; null to follow it. This run's own record is
   * followed whatever its Job's state (that is how this run ended), but
   * only if the Job, when it is still there, is this server's.
   */
  const notToFollow = async (r: RelayRun): Promise<{ why: string } | { uid: string | undefined }> => {
    if (!r.job) return { why: "the relay names no Job for it, so who created it cannot be checked" };
    const ref = `${r.namespace}/${r.job}`;
    // The retried run's Job is followed only while it runs: when it ended,
    // its outcome was the retried run's, and the retry runs anew.
    const own = r.id === ctx.runId;
    let job: V1Job;
    try {
      job = await kube.readJob(r.namespace, r.job);
    } catch (err) {
      if (isNotFound(err)) return own ? { uid: undefined } : { why: `its Job ${ref} is gone` };
      return { why: `its Job ${ref} could not be read to check it (${readKubeError(err).message})` };
    }
    if (r.jobUid && job.metadata?.uid && job.metadata.uid !== r.jobUid) {
      return own ? { uid: undefined } : { why: `its Job ${ref} is gone (another Job has its name)` };
    }
    const o = await ownershipOf(job);
    if ("foreign" in o) return { why: `its Job ${ref} is not this server's: ${o.foreign}` };
    if ("unknown" in o) return { why: `its Job ${ref} is not known to be this server's: ${o.unknown}` };
    if (!own && job.metadata?.deletionTimestamp) return { why: `its Job ${ref} is being deleted` };
    if (!own && jobFinished(job)) return { why: `its Job ${ref} has finished` };
    return { uid: job.metadata?.uid };
  };

  /**
   * The Job an earlier attempt at this very run created (its name, its
   * labels, and clipjob says this server made it); none when there is no
   * such Job; unknown when that cannot be told, and then nothing more may
   * be created: a second Job would run the run twice.
   */
  const priorAttempt = async (): Promise<{ job: V1Job } | { none: true } | { unknown: string }> => {
    let job: V1Job;
    try {
      job = await kube.readJob(ns, jobName);
    } catch (err) {
      return isNotFound(err) ? { none: true } : { unknown: `Job ${ns}/${jobName} could not be read (${readKubeError(err).message})` };
    }
    const labels = job.metadata?.labels ?? {};
    if (labels[LABEL_RUN_ID] !== ctx.runId || labels[LABEL_AGENT_ID] !== agentId) return { none: true };
    const o = await ownershipOf(job);
    if ("ours" in o) return { job };
    if ("unknown" in o) return { unknown: `Job ${ns}/${jobName} carries this run's labels, and whether this server created it cannot be told: ${o.unknown}` };
    await notice(`Job ${ns}/${jobName} carries this run's labels but is not this server's: ${o.foreign}`);
    return { none: true };
  };

  /** The run cannot go on without risking a second Job: what this execution created is removed. */
  const undecided = async (why: string): Promise<AdapterExecutionResult> => {
    await dropSecrets();
    return failureResult(ErrorCodes.jobCreateFailed, `The run was not submitted: ${why}. A second Job could run it twice, so nothing more was created`);
  };

  /**
   * The agent's runs clipjob holds in its queue (Queue mode): suspended
   * Jobs with no pod, which the relay learns of only once they start. In
   * the shape the relay lists runs, so the same checks apply. A list that
   * fails is a notice: the relay's runs are still looked at.
   */
  async function queuedRuns(): Promise<RelayRun[]> {
    let jobs: V1Job[];
    try {
      jobs = await kube.listJobs(ns, `${LABEL_AGENT_ID}=${agentId}`);
    } catch (err) {
      await notice(`listing the agent's Jobs for a queued run: ${readKubeError(err).message}; only the relay's runs are looked at`);
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

  // This very run already going: an earlier attempt at it submitted its
  // Job (the server restarted mid-run and Paperclip runs it again), or
  // Paperclip retries it as a new run that names it (retryOfRunId). Only
  // those are followed. Another run of the agent is another run, whatever
  // its task: following it would hand its output and its cost to this run
  // as well (Paperclip lets an agent have 20 runs at once by default). For
  // that one clipjob decides: it refuses this run (Reject mode) or queues
  // it (Queue mode). A run whose pod has not started yet (Pending) is as
  // active as one whose pod runs; so is one clipjob queued (no pod at all,
  // so the relay does not know it yet: found from the agent's Jobs).
  const retryOf = retryOfRunId(ctx.context ?? {});
  const mine = (id: string) => id === ctx.runId || (retryOf !== "" && id === retryOf);
  if (settings.reattach) {
    let running: RelayRun[];
    try {
      running = [
        ...(await relay.listRuns({ agent: agentId, phase: "Running" }, ctx.signal)),
        ...(await relay.listRuns({ agent: agentId, phase: "Pending" }, ctx.signal)),
      ];
    } catch (err) {
      if (ctx.signal?.aborted) return cancelledBeforeStart("before anything was created");
      return failureResult(
        ErrorCodes.relayUnavailable,
        `Asking the relay at ${relay.baseUrl} for a running run of agent ${agentId} (nothing was created; the run could not be followed without it): ${message(err)}`,
      );
    }
    running.push(...(await queuedRuns()));
    let existing: RelayRun | undefined;
    let existingUid: string | undefined;
    // This run's own record first, then the run it retries. Only runs this
    // adapter could have started: its namespace and the agent's company.
    // The relay lists every namespace the server's token may read, and a
    // run elsewhere with the agent's id is someone else's Job wearing its
    // label.
    running.sort((a, b) => Number(b.id === ctx.runId) - Number(a.id === ctx.runId));
    for (const r of running) {
      if (r.agent !== agentId || r.done) continue;
      if (!mine(r.id)) {
        await notice(
          `the agent's run ${r.id} is another run: not re-attaching to it (Paperclip may run an agent several times at once); clipjob decides whether this run waits or is refused`,
        );
        continue;
      }
      if (r.namespace !== settings.namespace || (r.company ?? "") !== (ctx.agent.companyId ?? "")) {
        await notice(
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
      const verdict = await notToFollow(r);
      if ("why" in verdict) {
        await notice(`not re-attaching to the agent's run ${r.id}, which the relay lists as ${r.phase}: ${verdict.why}`);
        continue;
      }
      existing = r;
      existingUid = verdict.uid;
      break;
    }
    if (existing) {
      await notice(
        `re-attaching to the agent's ${existing.phase === QUEUED_PHASE ? "queued" : "running"} run ${existing.id} (Job ${existing.namespace}/${existing.job ?? "?"}) instead of starting another; its log is followed from the start`,
      );
      // Without a uid this run's own Job is gone: there is no Job to
      // watch or delete, and a Job now of its name is another.
      return follow(existing.id, existing.namespace, existingUid ? (existing.job ?? "") : "", existing.session ?? null, existingUid);
    }
  }

  let resumeSession = sessionToResume(ctx.runtime, workingDir);
  if (resumeSession && !isLabelValue(resumeSession)) {
    await notice(`session ${JSON.stringify(resumeSession)} cannot be a label value, so it is not resumed: the agent starts a new session`);
    resumeSession = "";
  }
  const prompt = await buildPrompt(ctx, settings, resumeSession !== "");
  for (const n of prompt.notes) await notice(n);
  const runEnv = buildRunEnv(ctx, settings);
  for (const n of runEnv.notes) await notice(n);
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
    if (err instanceof RunIdentityError) return failureResult(ErrorCodes.jobCreateFailed, `The run cannot be submitted: ${err.message}`);
    throw err;
  }
  for (const n of objects.notes) await notice(n);
  let jobName = objects.jobName;

  await ctx.onMeta?.({
    adapterType: def.type,
    command: `clipjob bare Job ${ns}/${jobName}`,
    ...(objects.job.metadata?.annotations?.[ANNOTATION_WORKING_DIR] ? { cwd: workingDir } : {}),
    commandNotes: [
      `Namespace: ${ns}`,
      `Profile (paperclip.io/adapter-type): ${settings.profile}`,
      `Prompt: ${objects.promptDelivery === "secret" ? `Secret ${objects.promptSecret?.metadata?.name}` : "pod-template annotation"}`,
      ...(resumeSession ? [`Resuming session ${resumeSession}`] : []),
      ...(settings.model ? [`Model: ${settings.model}`] : []),
      `Relay: ${relay.baseUrl}`,
    ],
    prompt: prompt.prompt,
    promptMetrics: prompt.metrics,
    context: ctx.context,
  });

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
        const prior = await priorAttempt();
        if ("job" in prior) {
          await notice(`Job ${ns}/${jobName} of this run already exists; following it`);
          return follow(ctx.runId, ns, jobName, resumeSession || null, prior.job.metadata?.uid);
        }
        if ("unknown" in prior) return undecided(prior.unknown);
        const renamed = renameRunSecret(objects, which, randomBytes(3).toString("hex"));
        await notice(`a Secret ${ns}/${name} already exists and is not known to be this run's; the run's ${which} Secret is ${renamed} instead`);
        try {
          await kube.createSecret(ns, secret);
        } catch (again) {
          await dropSecrets();
          return secretFailureResult(which, `${ns}/${renamed}`, again);
        }
      } else {
        await dropSecrets();
        return secretFailureResult(which, `${ns}/${name}`, err);
      }
    }
    createdSecrets.push(secret.metadata!.name!); // renamed, perhaps
  }
  if (ctx.signal?.aborted) {
    await dropSecrets();
    return cancelledBeforeStart("before its Job was created");
  }

  ctx.onDispatch?.();
  let admitted: V1Job | null = null;
  let reaped = false;
  for (let attempt = 0; attempt < 2 && !admitted; attempt++) {
    try {
      admitted = await kube.createJob(ns, objects.job);
    } catch (err) {
      const f = classifyCreateError(err);
      if (f.kind === "agent-busy" && !reaped && f.holderJob && f.holderRunId !== ctx.runId) {
        reaped = true;
        if (await reapOrphan(f.holderJob, f.holderRunId)) {
          attempt--;
          continue;
        }
      }
      if (f.kind === "name-taken") {
        const prior = await priorAttempt();
        if ("job" in prior) {
          await notice(`Job ${ns}/${jobName} of this run already exists; following it`);
          admitted = prior.job;
          break;
        }
        if ("unknown" in prior) return undecided(prior.unknown);
        if (attempt === 0) {
          // Another run's Job has the name (two run ids with the same
          // slug and hash prefix): take another.
          jobName = retryJobName(objects.jobName, randomBytes(3).toString("hex"));
          objects.job.metadata!.name = jobName;
          continue;
        }
      }
      await dropSecrets();
      const result = createFailureResult(f, `${ns}/${jobName}`);
      await notice(result.errorMessage ?? "the Job was not created");
      return result;
    }
  }
  const annotations = admitted?.metadata?.annotations ?? {};
  await notice(
    `created Job ${ns}/${jobName}${annotations[ANNOTATION_PROFILE] ? ` (clipjob profile ${annotations[ANNOTATION_PROFILE]})` : ""}; prompt by ${objects.promptDelivery}`,
  );
  if (ANNOTATION_QUEUED in annotations) {
    // Queue mode: admitted suspended; clipjob starts it when the agent is
    // free. The follow below has no scheduling timeout, so it just waits.
    const holder = annotations[ANNOTATION_QUEUE_HOLDER];
    const position = annotations[ANNOTATION_QUEUE_POSITION];
    await notice(
      `queued by clipjob: the run starts when the agent's active run${holder ? ` (Job ${holder})` : ""} ends${position ? `; position ${position} in the agent's queue` : ""}`,
    );
    // An orphan ahead of it would hold it until the orphan's deadline.
    if (holder) await reapOrphan(holder.includes("/") ? holder : `${ns}/${holder}`);
  }
  if (ctx.signal?.aborted) return cancelRun(jobName, ns, admitted?.metadata?.uid);
  return follow(ctx.runId, ns, jobName, resumeSession || null, admitted?.metadata?.uid);

  /**
   * Deletes the agent's active Job `holderRef` (namespace/name) when it is
   * an orphan: this server's Job of another run of this agent that
   * Paperclip says has ended (a server that stopped mid-run left it, and
   * nobody follows it). True when it was deleted and is gone. Anything
   * that cannot be shown leaves the Job alone.
   */
  async function reapOrphan(holderRef: string, holderRunId?: string): Promise<boolean> {
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
    if (!("ours" in (await ownershipOf(job)))) return false;
    const paperclip = deps.paperclip ? deps.paperclip(settings, ctx.authToken) : paperclipRuns(settings.serverApiUrl, ctx.authToken);
    const state = await paperclip.runStatus(runId, ctx.signal);
    if ("unknown" in state) {
      await notice(`the agent's run ${runId} holds it (Job ${holderRef}); whether Paperclip still runs it is not known (${state.unknown}), so it is left alone`);
      return false;
    }
    if (!ENDED_RUN_STATUSES.has(state.status)) return false;
    await notice(
      `the agent's run ${runId} ended in Paperclip (${state.status}) but its Job ${holderRef} is still active: a server that stopped mid-run left it, and nobody follows it. Deleting it`,
    );
    try {
      await kube.deleteJob(holderNs, holderName, settings.deletePropagation, job.metadata?.uid);
    } catch (err) {
      if (!isNotFound(err)) {
        await notice(`deleting the orphaned Job ${holderRef}: ${readKubeError(err).message}`);
        return false;
      }
    }
    return waitGone(holderNs, holderName);
  }

  /** Waits (cancelGraceSec at most) until Job namespace/name is gone. */
  async function waitGone(namespace: string, name: string): Promise<boolean> {
    const deadline = Date.now() + settings.cancelGraceSec * 1000;
    for (;;) {
      try {
        await kube.readJob(namespace, name);
      } catch (err) {
        if (isNotFound(err)) return true;
      }
      if (Date.now() >= deadline) return false;
      await sleep(deps.cancelPollMs ?? 1000);
    }
  }

  /**
   * Why the relay's record of the run is not the run of Job `job`
   * (uid `jobUid` when known), or null. The relay binds a run id to the
   * first Job it sees carrying it, in any namespace it follows; anyone who
   * may create Jobs can put this run's id (which its labels show) on one.
   * Without a uid (this run's own Job is gone), the record must name the
   * Job this run would have had.
   */
  function recordMismatch(rec: RelayRun, runId: string, namespace: string, job: string, jobUid: string | undefined): string | null {
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

  /** Follows a run to its end and maps what the relay reports. */
  async function follow(runId: string, namespace: string, job: string, resumedSessionId: string | null, jobUid?: string): Promise<AdapterExecutionResult> {
    const startedAt = new Date().toISOString();
    let lastLiveness = -Infinity;
    // Paperclip's stale-run reaper reads the run's liveness, which a remote
    // run refreshes through onSpawn (there is no local process to watch).
    const refreshLiveness = async (force: boolean) => {
      const now = Date.now();
      if (!ctx.onSpawn || (!force && now - lastLiveness < settings.livenessRefreshSec * 1000)) return;
      lastLiveness = now;
      await ctx.onSpawn({ pid: process.pid, processGroupId: null, startedAt }).catch(() => {});
    };
    // The agent's container, from the relay's record of the run.
    let mainContainer: string | undefined;
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    ctx.signal?.addEventListener("abort", onAbort, { once: true });
    // A cancel that came before this point fired no event.
    if (ctx.signal?.aborted) stop.abort();
    // A graceful stop of the server deletes the Job (shutdown.ts).
    const forget = job ? followUntilShutdown({ kube, namespace, job, uid: jobUid, propagation: settings.deletePropagation, notice }) : () => {};
    let outcome;
    try {
      outcome = await followRun({
        client: relay,
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
            await notice(`following run ${runId} through the relay`);
            await refreshLiveness(true);
          }
        },
        onNotice: notice,
        jobUid,
        verifyRun: (rec) => {
          mainContainer = rec.mainContainer;
          return recordMismatch(rec, runId, namespace, job, jobUid);
        },
        checkJob: job
          ? async (): Promise<JobState> => {
              try {
                const j = await kube.readJob(namespace, job);
                return jobFinished(j) ? "finished" : "active";
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
    const jobRef = job ? `${namespace}/${job}` : null;
    switch (outcome.kind) {
      case "aborted":
        return cancelRun(job, namespace, jobUid);
      case "mismatch":
        return failureResult(ErrorCodes.relayRunMismatch, `Following run ${runId}: ${outcome.message}`, { job: jobRef });
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
        let run: RelayRun | null = null;
        try {
          run = await relay.getRun(runId, ctx.signal, jobUid);
        } catch (err) {
          await notice(`reading run ${runId}'s record from the relay: ${message(err)}; using its log's end`);
        }
        if (!run && !outcome.end) {
          return failureResult(ErrorCodes.relayUnavailable, `Run ${runId} ended, but the relay has no record of its result`, { job: jobRef });
        }
        const mismatch = run ? recordMismatch(run, runId, namespace, job, jobUid) : null;
        if (mismatch) return failureResult(ErrorCodes.relayRunMismatch, `Run ${runId} ended: ${mismatch}`, { job: jobRef });
        return toExecutionResult(run, outcome.end, {
          workingDir: workingDir || null,
          configuredModel: settings.model || null,
          resumedSessionId,
          job: jobRef,
        });
      }
    }
  }

  /** Deletes the run's Job (its pods, claim and Secrets go with it) and waits for it to be gone. */
  async function cancelRun(job: string, namespace = ns, uid?: string): Promise<AdapterExecutionResult> {
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
    await notice(`cancelled: deleting Job ${namespace}/${job} (propagation ${settings.deletePropagation})`);
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
    const gone = await waitGone(namespace, job);
    // A Job deleted at once may go before clipjob made it the owner of the
    // run's Secrets; with the Job gone they serve nothing, so remove them
    // (already gone with the Job is fine).
    if (gone) await dropSecrets();
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
}

/** Whether clipjob says this server created a Job, or why that cannot be told. */
type Ownership = { ours: true } | { foreign: string } | { unknown: string };

/** The Job's created-by (written by clipjob's webhook) against this server's user `me`. */
function ownership(job: V1Job, me: string | { error: string }): Ownership {
  const by = job.metadata?.annotations?.[ANNOTATION_CREATED_BY];
  if (by === undefined) return { unknown: `it does not record who created it (no ${ANNOTATION_CREATED_BY}: clipjob did not admit it, or is older than that annotation)` };
  if (typeof me !== "string") return { unknown: `this server's own user could not be read to compare (SelfSubjectReview: ${me.error})` };
  return by === me ? { ours: true } : { foreign: `it was created by ${by}, not by this server (${me})` };
}

/** A run cancelled before any agent work started: nothing to stop, safe to run again. */
function cancelledBeforeStart(when: string): AdapterExecutionResult {
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

/** The permissions a run needs, in the Jobs' namespace. */
export const REQUIRED_ACCESS = [
  { verb: "create", group: "batch", resource: "jobs", why: "submit runs" },
  { verb: "get", group: "batch", resource: "jobs", why: "notice a Job deleted before it ran, and a listed run that is ending" },
  { verb: "list", group: "batch", resource: "jobs", why: "find the agent's queued run after a restart (the relay knows a run only once it has a pod)" },
  { verb: "delete", group: "batch", resource: "jobs", why: "cancel runs" },
  { verb: "create", group: "", resource: "secrets", why: "the run's env and prompt Secrets" },
  { verb: "delete", group: "", resource: "secrets", why: "remove the Secrets of a run that was refused" },
  { verb: "get", group: "", resource: "pods", subresource: "log", why: "the relay serves a run's log to whoever may read its pods' logs" },
] as const;

/** Checks, from the Paperclip server, what a run needs of the cluster. */
export async function testClipjobEnvironment(
  def: AdapterDefinition,
  tctx: AdapterEnvironmentTestContext,
  deps: AdapterDeps = {},
): Promise<AdapterEnvironmentTestResult> {
  const checks: AdapterEnvironmentCheck[] = [];
  const warnings: string[] = [];
  const done = (): AdapterEnvironmentTestResult => ({
    adapterType: def.type,
    status: checks.some((c) => c.level === "error") ? "fail" : checks.some((c) => c.level === "warn") ? "warn" : "pass",
    checks,
    testedAt: new Date().toISOString(),
  });
  let settings: ClipjobSettings;
  try {
    settings = resolveSettings(tctx.config ?? {}, { profile: def.profile }, (w) => warnings.push(w), deps.env);
  } catch (err) {
    if (!(err instanceof SettingsError)) throw err;
    for (const w of warnings) checks.push({ code: "clipjob_config", level: "warn", message: w });
    checks.push({ code: "clipjob_config", level: "error", message: err.message, hint: "See this adapter's README, \"Configure\"" });
    return done();
  }
  for (const w of warnings) checks.push({ code: "clipjob_config", level: "warn", message: w });

  let kube: KubeApi | null = null;
  try {
    kube = (deps.kube ?? defaultKube)(settings);
    checks.push({
      code: "clipjob_kube_config",
      level: "info",
      message: `Kubernetes client configured (${settings.kubeconfig ? `kubeconfig ${settings.kubeconfig}` : "in-cluster ServiceAccount or default kubeconfig"}); Jobs go to namespace ${settings.namespace}`,
    });
  } catch (err) {
    checks.push({
      code: "clipjob_kube_config",
      level: "error",
      message: `No Kubernetes client configuration: ${message(err)}`,
      hint: "Run the server in the cluster with a ServiceAccount, or set CLIPJOB_KUBECONFIG in the server's environment to a kubeconfig file",
    });
  }

  if (kube) {
    const missing: string[] = [];
    let reviewError = "";
    for (const a of REQUIRED_ACCESS) {
      const what = `${a.verb} ${a.group ? `${a.resource}.${a.group}` : a.resource}${"subresource" in a ? `/${a.subresource}` : ""}`;
      try {
        const { allowed } = await kube.canI({ namespace: settings.namespace, ...a });
        if (!allowed) missing.push(`${what} (${a.why})`);
      } catch (err) {
        reviewError = readKubeError(err).message;
        break;
      }
    }
    if (reviewError) {
      checks.push({ code: "clipjob_rbac", level: "warn", message: `Could not check permissions (SelfSubjectAccessReview): ${reviewError}` });
    } else if (missing.length > 0) {
      checks.push({
        code: "clipjob_rbac",
        level: "error",
        message: `The server may not, in namespace ${settings.namespace}: ${missing.join("; ")}`,
        hint: "Bind the server's ServiceAccount to a Role with these rules (see this adapter's README, \"What it needs in the cluster\")",
      });
    } else {
      checks.push({ code: "clipjob_rbac", level: "info", message: `The server may create, read and delete Jobs and run Secrets and read pod logs in ${settings.namespace}` });
    }

    // A bare Job created with dryRun=All goes through both webhooks and is
    // stored nowhere: it must come back completed by clipjob.
    const probe = buildRunObjects({
      identity: { agentId: "clipjob-adapter-check", runId: `check-${Date.now()}` },
      namespace: settings.namespace,
      profile: settings.profile,
      prompt: "clipjob adapter environment check: a dry run, never stored",
      env: {},
      promptAnnotationMaxBytes: Number.MAX_SAFE_INTEGER,
      jobName: `clipjob-adapter-check-${randomBytes(3).toString("hex")}`,
    });
    try {
      const got = await kube.createJob(settings.namespace, probe.job, { dryRun: true });
      const profile = got.metadata?.annotations?.[ANNOTATION_PROFILE];
      const container = got.spec?.template?.spec?.containers?.[0];
      if (profile && container) {
        checks.push({
          code: "clipjob_webhook",
          level: "info",
          message: `clipjob completed a dry-run bare Job: profile ${profile}, image ${container.image ?? "(none)"}`,
        });
        // Re-attaching after a restart follows only Jobs clipjob says
        // this server created.
        const me = await kube.whoAmI().catch((err) => ({ error: readKubeError(err).message }));
        const o = ownership(got, me);
        if ("ours" in o) {
          checks.push({ code: "clipjob_created_by", level: "info", message: `clipjob records this server (${me as string}) as the creator of its Jobs` });
        } else if ("foreign" in o) {
          checks.push({ code: "clipjob_created_by", level: "error", message: `clipjob recorded the dry run's creator wrongly: ${o.foreign}` });
        } else {
          checks.push({
            code: "clipjob_created_by",
            level: "warn",
            message: `whether clipjob records this server as the creator of its Jobs cannot be told (${o.unknown}): after a server restart the adapter will not re-attach to its running runs, and a retried run whose Job exists is refused`,
            hint: got.metadata?.annotations?.[ANNOTATION_CREATED_BY] === undefined ? "Upgrade clipjob" : undefined,
          });
        }
      } else {
        checks.push({
          code: "clipjob_webhook",
          level: "error",
          message: `A dry-run bare Job came back without clipjob's mutation (no ${ANNOTATION_PROFILE} annotation or no container)`,
          hint: `Check that clipjob is installed and its mutating webhook matches Jobs labeled paperclip.io/agent-id in namespace ${settings.namespace} (clipjob doctor)`,
        });
      }
    } catch (err) {
      const f = classifyCreateError(err);
      checks.push({
        code: "clipjob_webhook",
        level: f.kind === "agent-busy" || f.kind === "queue-full" ? "warn" : "error",
        message:
          f.kind === "guard-unreachable"
            ? `clipjob's webhook could not be called: ${f.error.message}`
            : `A dry-run bare Job was refused (HTTP ${f.error.httpStatus ?? "none"}): ${f.error.message}`,
        hint:
          f.kind === "guard-unreachable"
            ? "Check clipjob's webhook pods and Service (kubectl -n clipjob-system get pods; clipjob doctor)"
            : "The message names the field and the fix; `clipjob doctor` checks the whole install",
      });
    }
  }

  const relay = (deps.relay ?? defaultRelay)(settings);
  try {
    await relay.token();
  } catch (err) {
    checks.push({
      code: "clipjob_relay_token",
      level: "error",
      message: `No token for the relay at ${settings.relayTokenFile}: ${message(err)}`,
      hint: `Mount a projected ServiceAccount token with audience ${RELAY_TOKEN_AUDIENCE} at that path (see this adapter's README), or set CLIPJOB_RELAY_TOKEN_FILE in the server's environment`,
    });
    return done();
  }
  try {
    const { status, body } = await relay.probe();
    if (status === 200) {
      checks.push({ code: "clipjob_relay", level: "info", message: `The relay at ${relay.baseUrl} answers and accepts the server's token` });
    } else if (status === 401) {
      checks.push({
        code: "clipjob_relay",
        level: "error",
        message: `The relay at ${relay.baseUrl} refused the token: ${body.trim().slice(0, 300)}`,
        hint: `The token must be made for audience ${RELAY_TOKEN_AUDIENCE} (a projected ServiceAccount token with that audience)`,
      });
    } else {
      checks.push({ code: "clipjob_relay", level: "error", message: `The relay at ${relay.baseUrl} answered ${status}: ${body.trim().slice(0, 300)}` });
    }
  } catch (err) {
    checks.push({
      code: "clipjob_relay",
      level: "error",
      message: `The relay at ${relay.baseUrl} cannot be reached: ${message(err)}`,
      hint: "Check CLIPJOB_RELAY_URL in the server's environment, and CLIPJOB_RELAY_CA_FILE when the relay's certificate is signed by clipjob's own CA",
    });
  }
  return done();
}

/** The documentation Paperclip shows for an agent of this adapter. */
export function agentConfigurationDoc(def: AdapterDefinition): string {
  return `# ${def.type} agent configuration

Adapter: ${def.type} (clipjob)

Runs the agent as a bare Kubernetes Job that clipjob completes (image, volumes,
env, security context, one run per agent) and follows its log through
clipjob's relay. Jobs are labeled with profile ${def.profile} unless \`profile\` says otherwise.

Agent fields:
- model (string): passed as paperclip.io/model
- maxTurnsPerRun (number): passed as paperclip.io/max-turns (0: none)
- promptTemplate, bootstrapPromptTemplate (string): Paperclip's prompt templates
- instructionsFilePath (string): read on the server and prepended to the prompt (only under the server's CLIPJOB_INSTRUCTIONS_ROOTS)
- cwd (string): working directory when the workspace names none (must be under /paperclip)
- env (object): extra env vars, delivered in the run's env Secret
- timeoutSec (number): the Job's activeDeadlineSeconds (0: the profile's)

Cluster fields:
- namespace (one the server allows: CLIPJOB_NAMESPACE, CLIPJOB_NAMESPACES), profile, ttlSecondsAfterFinished
- promptAnnotationMaxBytes, reattach, deletePropagation, cancelGraceSec, relayGraceSec, paperclipApiUrl

The cluster connection and the relay (CLIPJOB_KUBECONFIG, CLIPJOB_RELAY_URL,
CLIPJOB_RELAY_TOKEN_FILE, CLIPJOB_RELAY_CA_FILE) are the server's
environment, not the agent's config.
`;
}

/** A ServerAdapterModule for one adapter type. */
export function createClipjobAdapter(def: AdapterDefinition, deps: AdapterDeps = {}): ServerAdapterModule {
  const sessionManagement = getAdapterSessionManagement(def.profile);
  return {
    type: def.type,
    execute: (ctx) => executeRun(def, ctx, deps),
    testEnvironment: (ctx) => testClipjobEnvironment(def, ctx, deps),
    sessionCodec,
    ...(sessionManagement ? { sessionManagement } : {}),
    // The agent calls Paperclip back with the run's token (PAPERCLIP_API_KEY).
    supportsLocalAgentJwt: true,
    ...(def.models ? { models: def.models } : {}),
    ...(def.models && def.builtinPackage ? { listModels: () => builtinModels(def.builtinPackage!, def.models!) } : {}),
    agentConfigurationDoc: agentConfigurationDoc(def),
  };
}
