// testEnvironment(): checks from the Paperclip server's side what a run
// needs of the cluster, as `clipjob doctor` checks it from an operator's.
// One function a check, in the order they are reported (README "Checks").

import { randomBytes } from "node:crypto";

import type { AdapterEnvironmentCheck, AdapterEnvironmentTestContext, AdapterEnvironmentTestResult } from "@paperclipai/adapter-utils";
import type { V1Job } from "@kubernetes/client-node";

import { resolveSettings, SettingsError, type ClipjobSettings } from "./config.js";
import { ANNOTATION_CREATED_BY, ANNOTATION_PROFILE, RELAY_TOKEN_AUDIENCE } from "./contract.js";
import type { AdapterDefinition } from "./definitions.js";
import { kubeClient, relayClient, type AdapterDeps } from "./deps.js";
import { classifyCreateError, message, readKubeError } from "./errors.js";
import { buildRunObjects } from "./job.js";
import type { KubeApi } from "./kube.js";
import type { RelayClient } from "./relay.js";
import { ownership } from "./run/ownership.js";

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
  const done = (): AdapterEnvironmentTestResult => ({
    adapterType: def.type,
    status: checks.some((c) => c.level === "error") ? "fail" : checks.some((c) => c.level === "warn") ? "warn" : "pass",
    checks,
    testedAt: new Date().toISOString(),
  });
  const settings = checkSettings(def, tctx, deps, checks);
  if (!settings) return done();
  const kube = checkKubeConfig(settings, deps, checks);
  if (kube) {
    await checkAccess(kube, settings, checks);
    await checkWebhook(kube, settings, checks);
  }
  await checkRelay(relayClient(settings, deps), settings, checks);
  return done();
}

/** The settings, their warnings as checks; null (with the error as a check) when they cannot be resolved. */
function checkSettings(def: AdapterDefinition, tctx: AdapterEnvironmentTestContext, deps: AdapterDeps, checks: AdapterEnvironmentCheck[]): ClipjobSettings | null {
  const warnings: string[] = [];
  let settings: ClipjobSettings;
  try {
    settings = resolveSettings(tctx.config ?? {}, { profile: def.profile }, (w) => warnings.push(w), deps.env);
  } catch (err) {
    if (!(err instanceof SettingsError)) throw err;
    for (const w of warnings) checks.push({ code: "clipjob_config", level: "warn", message: w });
    checks.push({ code: "clipjob_config", level: "error", message: err.message, hint: "See this adapter's README, \"Configuration\"" });
    return null;
  }
  for (const w of warnings) checks.push({ code: "clipjob_config", level: "warn", message: w });
  return settings;
}

/** The cluster's client, or null when there is no configuration for one. */
function checkKubeConfig(settings: ClipjobSettings, deps: AdapterDeps, checks: AdapterEnvironmentCheck[]): KubeApi | null {
  try {
    const kube = kubeClient(settings, deps);
    checks.push({
      code: "clipjob_kube_config",
      level: "info",
      message: `Kubernetes client configured (${settings.kubeconfig ? `kubeconfig ${settings.kubeconfig}` : "in-cluster ServiceAccount or default kubeconfig"}); Jobs go to namespace ${settings.namespace}`,
    });
    return kube;
  } catch (err) {
    checks.push({
      code: "clipjob_kube_config",
      level: "error",
      message: `No Kubernetes client configuration: ${message(err)}`,
      hint: "Run the server in the cluster with a ServiceAccount, or set CLIPJOB_KUBECONFIG in the server's environment to a kubeconfig file",
    });
    return null;
  }
}

/** Whether the server has REQUIRED_ACCESS in the namespace (SelfSubjectAccessReviews). */
async function checkAccess(kube: KubeApi, settings: ClipjobSettings, checks: AdapterEnvironmentCheck[]): Promise<void> {
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
}

/** Whether clipjob's webhooks complete a bare Job, and record this server as its creator. */
async function checkWebhook(kube: KubeApi, settings: ClipjobSettings, checks: AdapterEnvironmentCheck[]): Promise<void> {
  // A bare Job created with dryRun=All goes through both webhooks and is
  // stored nowhere: it must come back completed by clipjob.
  const probe = buildRunObjects({
    identity: { agentId: "clipjob-adapter-check", runId: `check-${Date.now()}`, companyId: "clipjob-adapter-check" },
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
      await checkCreatedBy(kube, got, checks);
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

/** Whether clipjob recorded this server as the creator of the dry-run Job `got`. */
async function checkCreatedBy(kube: KubeApi, got: V1Job, checks: AdapterEnvironmentCheck[]): Promise<void> {
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
}

/** Whether the server has a token for the relay, and the relay answers and accepts it. */
async function checkRelay(relay: RelayClient, settings: ClipjobSettings, checks: AdapterEnvironmentCheck[]): Promise<void> {
  try {
    await relay.token();
  } catch (err) {
    checks.push({
      code: "clipjob_relay_token",
      level: "error",
      message: `No token for the relay at ${settings.relayTokenFile}: ${message(err)}`,
      hint: `Mount a projected ServiceAccount token with audience ${RELAY_TOKEN_AUDIENCE} at that path (see this adapter's README), or set CLIPJOB_RELAY_TOKEN_FILE in the server's environment`,
    });
    return;
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
}
