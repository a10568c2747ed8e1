// The adapter's settings, checked and given defaults in one place, so every
// other module reads typed values and the README's tables of keys have one
// source. Two sources, by who may set them: where the server's credentials
// go (the cluster, the relay, the namespaces, the files the server reads)
// comes from the server's environment, which only its operator sets; how
// an agent runs comes from the agent's adapterConfig (Paperclip's
// `ctx.config`), which whoever may edit the agent sets. An agent's config
// naming a relay URL and a token file would otherwise send the server's
// token wherever it liked.

import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, resolve } from "node:path";

/** How the Job is deleted on cancellation. */
export type DeletePropagation = "Foreground" | "Background";

export interface ClipjobSettings {
  /** Namespace the Jobs and run Secrets are created in. */
  namespace: string;
  /** Directories an instructions file may resolve into (CLIPJOB_INSTRUCTIONS_ROOTS). */
  instructionsRoots: string[];
  /** Kubeconfig file; empty: the in-cluster ServiceAccount (then ~/.kube/config). */
  kubeconfig: string;
  /** The relay API's base URL. */
  relayUrl: string;
  /** File holding a token for the relay's audience (a projected ServiceAccount token). */
  relayTokenFile: string;
  /** PEM bundle to verify the relay's certificate; empty: the system's CAs. */
  relayCaFile: string;
  /** Value of paperclip.io/adapter-type: the clipjob profile that runs the agent. */
  profile: string;
  model: string;
  /** 0: no limit (no annotation). */
  maxTurnsPerRun: number;
  /** Working directory when the run's workspace names none. */
  cwd: string;
  instructionsFilePath: string;
  promptTemplate: string;
  bootstrapPromptTemplate: string;
  /** Extra env vars for the agent, carried in the run's env Secret. */
  env: Record<string, string>;
  /** PAPERCLIP_API_URL for the agent; empty: what clipjob inherits from the server. */
  paperclipApiUrl: string;
  /** The server's own API URL (PAPERCLIP_API_URL): loopback URLs to it are rewritten to paperclipApiUrl in the pod. */
  serverApiUrl: string;
  /** The Job's activeDeadlineSeconds; 0: the profile's. */
  timeoutSec: number;
  /** The Job's ttlSecondsAfterFinished; 0: the profile's. */
  ttlSecondsAfterFinished: number;
  /** A prompt larger than this (bytes, UTF-8) goes in a Secret instead of an annotation. */
  promptAnnotationMaxBytes: number;
  /** Follow the agent's running run (found through the relay) instead of creating one. */
  reattach: boolean;
  deletePropagation: DeletePropagation;
  /** How long to wait for a cancelled run's Job to be gone. */
  cancelGraceSec: number;
  /** How long the relay may not know a run whose Job already finished, or not answer before a run starts. */
  relayGraceSec: number;
  /** How long a run asks again to create its Job while clipjob's admission webhook cannot be reached (a webhook pod restarting). */
  webhookGraceSec: number;
  /** How often the run's liveness is refreshed with Paperclip (onSpawn). */
  livenessRefreshSec: number;
}

/** Where a projected token for the relay is mounted by default. */
export const DEFAULT_RELAY_TOKEN_FILE = "/var/run/secrets/clipjob-relay/token";
/** The chart's relay Service, release `clipjob` in `clipjob-system`. */
export const DEFAULT_RELAY_URL = "https://clipjob-relay.clipjob-system.svc";
/**
 * Kubernetes limits all annotations of an object to 256 KiB together; a
 * quarter of that leaves room for the other annotations and clipjob's.
 */
export const DEFAULT_PROMPT_ANNOTATION_MAX_BYTES = 64 * 1024;

const SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/**
 * The namespace the Paperclip server runs in, where its agents run by
 * default (clipjob's source namespace is an agent namespace by default).
 */
export function defaultNamespace(env: NodeJS.ProcessEnv = process.env, readNamespaceFile = readServiceAccountNamespace): string {
  return env.PAPERCLIP_NAMESPACE?.trim() || env.POD_NAMESPACE?.trim() || readNamespaceFile() || "default";
}

function readServiceAccountNamespace(): string {
  try {
    return readFileSync(SERVICE_ACCOUNT_NAMESPACE_FILE, "utf8").trim();
  } catch {
    return "";
  }
}

function str(value: unknown, fallback = ""): string {
  return typeof value === "string" ? value.trim() || fallback : fallback;
}

function num(value: unknown, fallback: number): number {
  if (typeof value === "number" && Number.isFinite(value)) return value;
  if (typeof value === "string" && value.trim() !== "" && Number.isFinite(Number(value))) return Number(value);
  return fallback;
}

function bool(value: unknown, fallback: boolean): boolean {
  if (typeof value === "boolean") return value;
  if (value === "true") return true;
  if (value === "false") return false;
  return fallback;
}

/**
 * Env names clipjob sets from the run itself (its labels, its annotations,
 * its profile): in the run's env Secret they would fill in for a run
 * option the Job does not name, past clipjob's checks of it (a model name,
 * a turn limit) and the adapter's (a session resumed only in its own
 * working directory).
 */
const RESERVED_ENV = new Set([
  "PAPERCLIP_AGENT_ID",
  "PAPERCLIP_RUN_ID",
  "PAPERCLIP_COMPANY_ID",
  "PAPERCLIP_TASK_ID",
  "PAPERCLIP_SESSION_ID",
  "PAPERCLIP_MODEL",
  "PAPERCLIP_MAX_TURNS",
  "PAPERCLIP_PERMISSION_MODE",
  "PAPERCLIP_PROMPT_FILE",
  "HOME",
]);

/**
 * Env vars from adapterConfig.env: an object of strings, or Paperclip's
 * binding objects `{ type: "plain", value }`. Secret references cannot be
 * resolved here (the server resolves them into ctx.config before execute
 * runs when it can); they are reported and left out.
 */
export function parseEnv(value: unknown, warn: (msg: string) => void = () => {}): Record<string, string> {
  const out: Record<string, string> = {};
  if (!value || typeof value !== "object" || Array.isArray(value)) return out;
  for (const [key, raw] of Object.entries(value as Record<string, unknown>)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) {
      warn(`env ${JSON.stringify(key)} is not a valid variable name; left out`);
      continue;
    }
    if (RESERVED_ENV.has(key)) {
      warn(`env ${key} is clipjob's to set from the run (its labels, annotations and profile); left out`);
      continue;
    }
    if (typeof raw === "string") {
      out[key] = raw;
    } else if (raw && typeof raw === "object" && typeof (raw as { value?: unknown }).value === "string") {
      out[key] = (raw as { value: string }).value;
    } else {
      warn(`env ${key} is not a plain string value; left out`);
    }
  }
  return out;
}

/** A setting that cannot be used: the run is refused before anything is created. */
export class SettingsError extends Error {}

/** The server-wide settings, from the Paperclip server's environment. */
export interface ServerSettings {
  /** CLIPJOB_NAMESPACE: where Jobs go unless an agent picks another allowed one. */
  namespace: string;
  /** CLIPJOB_NAMESPACES: the namespaces an agent's `namespace` may pick (always includes `namespace`). */
  namespaces: string[];
  /**
   * CLIPJOB_PROFILES: the clipjob profiles an agent's `profile` may pick
   * besides its adapter type's own. A profile is the operator's sandbox
   * (runtime class, egress, ServiceAccount, env it hands over), so whoever
   * edits an agent does not choose it unless the operator lists it.
   */
  profiles: string[];
  kubeconfig: string;
  relayUrl: string;
  relayTokenFile: string;
  relayCaFile: string;
  instructionsRoots: string[];
  /** CLIPJOB_PAPERCLIP_API_URL: where pods reach Paperclip's API ("" when not set). */
  podApiUrl: string;
  /** PAPERCLIP_API_URL: the server's own API URL, which Paperclip writes into runs' env. */
  serverApiUrl: string;
}

/** The adapterConfig keys that were connection settings; now the server's (see ServerSettings). */
const SERVER_ONLY_KEYS: Record<string, string> = {
  kubeconfig: "CLIPJOB_KUBECONFIG",
  relayUrl: "CLIPJOB_RELAY_URL",
  relayTokenFile: "CLIPJOB_RELAY_TOKEN_FILE",
  relayCaFile: "CLIPJOB_RELAY_CA_FILE",
};

function list(value: string | undefined, sep: string | RegExp): string[] {
  return (value ?? "")
    .split(sep)
    .map((v) => v.trim())
    .filter((v) => v !== "");
}

// URL.hostname keeps IPv6 brackets.
const LOOPBACK_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);

/**
 * The relay's URL, checked: the server's token goes with every request,
 * so it travels over TLS, or in plain HTTP only to this host (a local
 * port-forward or proxy), never in clear across the network.
 */
function checkRelayUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new SettingsError(`CLIPJOB_RELAY_URL ${JSON.stringify(raw)} is not a URL`);
  }
  if (url.protocol !== "https:" && !(url.protocol === "http:" && LOOPBACK_HOSTS.has(url.hostname))) {
    throw new SettingsError(
      `CLIPJOB_RELAY_URL ${JSON.stringify(raw)} must be https (the server's token goes with every request; plain http only to 127.0.0.1 or localhost)`,
    );
  }
  if (url.username || url.password || url.search || url.hash) {
    throw new SettingsError(`CLIPJOB_RELAY_URL ${JSON.stringify(raw)} must be a base URL: no credentials, query or fragment`);
  }
  return raw.replace(/\/+$/, "");
}

/**
 * Where an agent's instructions may come from by default: in Paperclip's
 * instance (its home's instances/<PAPERCLIP_INSTANCE_ID>), the agent's own
 * managed bundle and its company's project checkouts and the agent's
 * workspace, where a bundle of one's own would live. Never the whole home,
 * whose other companies' documents a board user could otherwise name as an
 * agent's instructions and read back from its pod.
 */
function defaultInstructionsRoots(home: string, env: NodeJS.ProcessEnv): string[] {
  const instance = env.PAPERCLIP_INSTANCE_ID?.trim() || "default";
  if (!/^[A-Za-z0-9_-]+$/.test(instance)) {
    throw new SettingsError(`PAPERCLIP_INSTANCE_ID ${JSON.stringify(instance)} is not a plain path segment (as Paperclip itself requires)`);
  }
  const root = resolve(home, "instances", instance);
  return [
    resolve(root, "companies", "{companyId}", "agents", "{agentId}", "instructions"),
    resolve(root, "projects", "{companyId}"),
    resolve(root, "workspaces", "{agentId}"),
  ];
}

/** Reads the server's settings from its environment. */
function serverSettings(env: NodeJS.ProcessEnv = process.env, readNamespaceFile = readServiceAccountNamespace): ServerSettings {
  const namespace = env.CLIPJOB_NAMESPACE?.trim() || defaultNamespace(env, readNamespaceFile);
  const home = env.PAPERCLIP_HOME?.trim() ? resolve(env.PAPERCLIP_HOME.trim().replace(/^~(?=$|\/)/, homedir())) : resolve(homedir(), ".paperclip");
  const roots = list(env.CLIPJOB_INSTRUCTIONS_ROOTS, ":");
  for (const r of roots) {
    if (!isAbsolute(r)) throw new SettingsError(`CLIPJOB_INSTRUCTIONS_ROOTS: ${JSON.stringify(r)} is not an absolute path`);
  }
  return {
    namespace,
    namespaces: [...new Set([namespace, ...list(env.CLIPJOB_NAMESPACES, ",")])],
    profiles: list(env.CLIPJOB_PROFILES, ","),
    kubeconfig: env.CLIPJOB_KUBECONFIG?.trim() ?? "",
    relayUrl: checkRelayUrl(env.CLIPJOB_RELAY_URL?.trim() || DEFAULT_RELAY_URL),
    relayTokenFile: env.CLIPJOB_RELAY_TOKEN_FILE?.trim() || DEFAULT_RELAY_TOKEN_FILE,
    relayCaFile: env.CLIPJOB_RELAY_CA_FILE?.trim() ?? "",
    instructionsRoots: roots.length > 0 ? roots.map((r) => resolve(r)) : defaultInstructionsRoots(home, env),
    podApiUrl: env.CLIPJOB_PAPERCLIP_API_URL?.trim() ?? "",
    serverApiUrl: env.PAPERCLIP_API_URL?.trim() ?? "",
  };
}

/**
 * Resolves settings: the server's from env, the agent's from its
 * adapterConfig. Throws SettingsError for a setting that cannot be used;
 * warns about keys it ignores.
 */
export function resolveSettings(
  config: Record<string, unknown>,
  defaults: { profile: string },
  warn: (msg: string) => void = () => {},
  env: NodeJS.ProcessEnv = process.env,
): ClipjobSettings {
  const server = serverSettings(env);
  for (const [key, envName] of Object.entries(SERVER_ONLY_KEYS)) {
    if (config[key] !== undefined && config[key] !== "") {
      warn(`the agent's ${key} is ignored: where the server's credentials go is set in the server's environment (${envName})`);
    }
  }
  const namespace = str(config.namespace) || server.namespace;
  if (!server.namespaces.includes(namespace)) {
    throw new SettingsError(
      `the agent's namespace ${JSON.stringify(namespace)} is not one this server runs agents in (${server.namespaces.join(", ")}); the server's operator lists them in CLIPJOB_NAMESPACES`,
    );
  }
  const profile = str(config.profile, defaults.profile);
  if (profile !== defaults.profile && !server.profiles.includes(profile)) {
    throw new SettingsError(
      `the agent's profile ${JSON.stringify(profile)} is not one this server lets agents pick (${[defaults.profile, ...server.profiles].join(", ")}); the server's operator lists them in CLIPJOB_PROFILES`,
    );
  }
  const propagation = str(config.deletePropagation, "Foreground");
  return {
    namespace,
    instructionsRoots: server.instructionsRoots,
    kubeconfig: server.kubeconfig,
    relayUrl: server.relayUrl,
    relayTokenFile: server.relayTokenFile,
    relayCaFile: server.relayCaFile,
    profile,
    model: str(config.model),
    maxTurnsPerRun: Math.max(0, Math.trunc(num(config.maxTurnsPerRun, 0))),
    cwd: str(config.cwd),
    instructionsFilePath: str(config.instructionsFilePath),
    promptTemplate: typeof config.promptTemplate === "string" ? config.promptTemplate : "",
    bootstrapPromptTemplate: typeof config.bootstrapPromptTemplate === "string" ? config.bootstrapPromptTemplate : "",
    env: parseEnv(config.env, warn),
    // The server's setting first: the operator knows where pods reach it.
    paperclipApiUrl: server.podApiUrl || str(config.paperclipApiUrl),
    serverApiUrl: server.serverApiUrl,
    timeoutSec: Math.max(0, Math.trunc(num(config.timeoutSec, 0))),
    ttlSecondsAfterFinished: Math.max(0, Math.trunc(num(config.ttlSecondsAfterFinished, 0))),
    promptAnnotationMaxBytes: Math.max(0, Math.trunc(num(config.promptAnnotationMaxBytes, DEFAULT_PROMPT_ANNOTATION_MAX_BYTES))),
    reattach: bool(config.reattach, true),
    deletePropagation: propagation === "Background" ? "Background" : "Foreground",
    cancelGraceSec: Math.max(0, num(config.cancelGraceSec, 60)),
    relayGraceSec: Math.max(0, num(config.relayGraceSec, 60)),
    webhookGraceSec: Math.max(0, num(config.webhookGraceSec, 30)),
    livenessRefreshSec: Math.max(1, num(config.livenessRefreshSec, 180)),
  };
}
