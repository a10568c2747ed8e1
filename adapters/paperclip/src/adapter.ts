// Paperclip's server adapter interface (ServerAdapterModule) over clipjob:
// execute() submits the run as a bare Job and follows it through the relay;
// testEnvironment() checks from the server's side what `clipjob doctor`
// checks from an operator's (checks.ts). What a run does, step by step, is
// README "How a run goes" in this package; each step is a stage in run/.

import type { AdapterExecutionContext, AdapterExecutionResult, AdapterSessionCodec, ServerAdapterModule } from "@paperclipai/adapter-utils";
import { getAdapterSessionManagement } from "@paperclipai/adapter-utils/session-compaction";

import { testClipjobEnvironment } from "./checks.js";
import type { AdapterDefinition } from "./definitions.js";
import { runHome, type AdapterDeps } from "./deps.js";
import { builtinModels } from "./models.js";
import { cancelledBeforeStart, cancelRun } from "./run/cancel.js";
import { follow } from "./run/follow.js";
import { reattach } from "./run/reattach.js";
import { Run } from "./run/run.js";
import { runClients, runSettings } from "./run/settings.js";
import { submit } from "./run/submit.js";
import { skillSnapshot } from "./skills.js";

export { REQUIRED_ACCESS, testClipjobEnvironment } from "./checks.js";
export { CLAUDE_ADAPTER, OPENCODE_ADAPTER, type AdapterDefinition } from "./definitions.js";
export type { AdapterDeps } from "./deps.js";

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
  const resolved = await runSettings(def, ctx, deps);
  if ("result" in resolved) return resolved.result;

  // Cancellation arrives on ctx.signal once the adapter says it can honour it.
  await ctx.onCancellationReady?.();
  if (ctx.signal?.aborted) return cancelledBeforeStart("before anything was created");

  const clients = runClients(resolved.settings, deps);
  if ("result" in clients) return clients.result;
  const run = new Run(def, ctx, deps, resolved.settings, clients.kube, clients.relay);

  // This very run already going (an earlier attempt, or the run it retries) is followed, not started twice.
  const running = await reattach(run);
  if (running) return "result" in running ? running.result : follow(run, running.follow);

  const submitted = await submit(run);
  if ("result" in submitted) return submitted.result;
  // An earlier attempt's Job, found when its Secret was: followed as it is.
  if ("existing" in submitted) return follow(run, submitted.existing);
  const { created } = submitted;
  if (ctx.signal?.aborted) return cancelRun(run, created.job, created.namespace, created.jobUid);
  return follow(run, created);
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
- instructionsFilePath (string): the entry file of Paperclip's managed instructions bundle (or a file of your own), read on the server and prepended to the prompt (only under the server's CLIPJOB_INSTRUCTIONS_ROOTS); the pod mounts the bundle's directory read-only when Paperclip's home is on the shared volume
- skills: the company's skills enabled for the agent (Paperclip's skills page) whose files are in the company's skills directory, which the pod mounts read-only; the prompt names each one's SKILL.md there. An enabled skill the pod cannot read (one bundled in the server's install, a local path elsewhere) is a warning in the run's log
- cwd (string): working directory when the workspace names none (must be under /paperclip)
- env (object): extra env vars, delivered in the run's env Secret
- timeoutSec (number): the Job's activeDeadlineSeconds (0: the profile's)

Cluster fields:
- namespace (one the server allows: CLIPJOB_NAMESPACE, CLIPJOB_NAMESPACES), profile, ttlSecondsAfterFinished
- promptAnnotationMaxBytes, reattach, deletePropagation, cancelGraceSec, relayGraceSec, webhookGraceSec, paperclipApiUrl

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
    // Paperclip keeps each agent's managed instructions in its home
    // (companies/<company>/agents/<agent>/instructions) and names the entry
    // file in instructionsFilePath: read on the server and prepended to the
    // prompt, and, with the home on the shared volume, mounted read-only
    // in the pod at the same path, so the files beside it resolve there.
    supportsInstructionsBundle: true,
    instructionsPathKey: "instructionsFilePath",
    // The company's skills whose files are in its skills directory, which
    // the pod mounts read-only at the same path: each run's prompt names
    // the enabled ones' SKILL.md there (skills.ts). Paperclip keeps the
    // agent's choice in its config; syncing has nothing to write.
    listSkills: (ctx) => skillSnapshot(def.type, ctx, runHome(deps)),
    syncSkills: (ctx) => skillSnapshot(def.type, ctx, runHome(deps)),
    ...(def.models ? { models: def.models } : {}),
    ...(def.models && def.builtinPackage ? { listModels: () => builtinModels(def.builtinPackage!, def.models!) } : {}),
    agentConfigurationDoc: agentConfigurationDoc(def),
  };
}
