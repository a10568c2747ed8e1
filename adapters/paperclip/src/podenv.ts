// What of the run's env may reach the pod. Paperclip builds a run's env for
// an agent it starts on its own machine: some values name that machine's
// paths (its scratch directory as TMPDIR, the agent's home, a gh config
// directory, a PATH with its launchers) or its loopback address (the
// runtime tools' MCP URL). In a pod those mean nothing, or worse: a
// loopback URL reaches whatever listens in the pod, with the run's token.
// The rule, documented in the README ("The run's env in the pod"):
//
//   1. A variable Paperclip sets to a path on the server (SERVER_PATH_VARS)
//      reaches the pod only when every path in it lies on the shared volume
//      (SHARED_ROOT), which the pod mounts at the same path; otherwise it is
//      left out, and the pod keeps its image's value (TMPDIR unset means
//      /tmp, which clipjob makes writable).
//   2. Any variable whose value is a URL to a loopback host (localhost,
//      127.0.0.0/8, ::1, 0.0.0.0) is rewritten to the URL pods reach
//      Paperclip at (CLIPJOB_PAPERCLIP_API_URL, or the agent's
//      paperclipApiUrl) when it points at the server's own API, and left
//      out otherwise.
// Nothing here touches the cluster.

/** The path the shared volume is mounted at, on the server and in the pod. */
export const SHARED_ROOT = "/paperclip";

/**
 * Variables Paperclip (2026.916) sets to a path, or a list of paths, on the
 * server: its run scratch directory, the agent's home and workspace, the
 * GitHub launchers and their config, the git metadata it allows.
 */
export const SERVER_PATH_VARS = new Set([
  "TMPDIR",
  "TMP",
  "TEMP",
  "PAPERCLIP_TMPDIR",
  "PAPERCLIP_RUN_SCRATCH_DIR",
  "PAPERCLIP_TASK_SCRATCH_DIR",
  "PAPERCLIP_SCRATCH_DIR",
  "AGENT_HOME",
  "PAPERCLIP_WORKSPACE_CWD",
  "PAPERCLIP_WORKSPACE_WORKTREE_PATH",
  "GH_CONFIG_DIR",
  "PATH",
  "ZDOTDIR",
  "BASH_ENV",
  "PAPERCLIP_GITHUB_LAUNCHER_DIR",
  "PAPERCLIP_GITHUB_HOST_HOME",
  "PAPERCLIP_GIT_METADATA_ROOTS",
  "PAPERCLIP_RUNNER_NETWORK_ROOTS",
  "SSH_AUTH_SOCK",
  "GIT_ASKPASS",
  "SSH_ASKPASS",
  "GIT_CONFIG_GLOBAL",
  "GIT_CONFIG_SYSTEM",
]);

// Paths every pod has, with the same meaning as on the server.
const SAME_EVERYWHERE = new Set(["/dev/null"]);

export interface PodEnvOptions {
  /** The server's own API URL (its PAPERCLIP_API_URL, a loopback one by default). */
  serverApiUrl: string;
  /** The URL pods reach Paperclip's API at; "" when none is configured. */
  podApiUrl: string;
  /**
   * The directories the pod mounts, when the server's home is on the
   * shared volume and clipjob mounts only the run's own (runDirs): a
   * server path elsewhere on the volume (the server's own $HOME/.config/gh,
   * say) is not in the pod either.
   */
  podDirs?: string[];
}

export interface PodEnv {
  env: Record<string, string>;
  /** Why each variable left out was (names only: values may be secrets). */
  dropped: { name: string; why: string }[];
  /** The variables rewritten to the pods' URL. */
  rewritten: string[];
}

/** The part of env that may reach the pod, by the rule above. */
export function podEnv(env: Record<string, string>, opts: PodEnvOptions): PodEnv {
  const out: PodEnv = { env: {}, dropped: [], rewritten: [] };
  for (const [name, value] of Object.entries(env)) {
    if (SERVER_PATH_VARS.has(name)) {
      const outside = pathsIn(value).filter((p) => !SAME_EVERYWHERE.has(p) && !underSharedRoot(p));
      if (outside.length > 0) {
        out.dropped.push({ name, why: `a path on the Paperclip server outside ${SHARED_ROOT}, not in the pod` });
        continue;
      }
      const dirs = opts.podDirs;
      if (dirs && pathsIn(value).some((p) => !SAME_EVERYWHERE.has(p) && !dirs.some((d) => p === d || p.startsWith(`${d}/`)))) {
        out.dropped.push({ name, why: "a path on the shared volume outside the run's own directories, which the pod does not mount" });
        continue;
      }
    }
    const loop = loopbackUrl(value);
    if (loop) {
      const rewritten = rewriteToPods(loop, opts);
      if (rewritten === null) {
        out.dropped.push({
          name,
          why: opts.podApiUrl
            ? "a loopback URL that is not the Paperclip server's API"
            : "a loopback URL of the Paperclip server, which pods cannot reach (set CLIPJOB_PAPERCLIP_API_URL to the URL pods reach Paperclip at)",
        });
        continue;
      }
      out.env[name] = rewritten;
      out.rewritten.push(name);
      continue;
    }
    out.env[name] = value;
  }
  return out;
}

/**
 * The entries of a value: one path, a colon-separated list, or a JSON
 * array. A server path variable passes only when every entry is an
 * absolute path on the shared volume: a relative entry ("bin", ".")
 * would resolve against whatever directory the pod starts in.
 */
function pathsIn(value: string): string[] {
  const v = value.trim();
  if (v.startsWith("[")) {
    try {
      const list: unknown = JSON.parse(v);
      if (Array.isArray(list)) return list.map((p) => (typeof p === "string" ? p : ""));
    } catch {
      // not JSON: read as a list below
    }
  }
  return v.split(":");
}

/** Whether path lies on the shared volume (lexically: absolute, no "..", no "." parts). */
function underSharedRoot(path: string): boolean {
  if (path !== SHARED_ROOT && !path.startsWith(`${SHARED_ROOT}/`)) return false;
  return !path.split("/").some((part) => part === ".." || part === ".");
}

/**
 * The value as a URL, when it is one (of any scheme: a database or a
 * cache on the server's loopback is as unreachable) to a loopback host.
 */
function loopbackUrl(value: string): URL | null {
  const v = value.trim();
  if (!/^[a-z][a-z0-9+.-]*:/i.test(v)) return null;
  let url: URL;
  try {
    url = new URL(v);
  } catch {
    return null;
  }
  const host = url.hostname.replace(/^\[|\]$/g, "").replace(/\.$/, "").toLowerCase();
  if (host === "") return null;
  const loopback =
    host === "localhost" ||
    host.endsWith(".localhost") ||
    host === "::1" ||
    host === "::" ||
    host === "0.0.0.0" ||
    /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host) ||
    // IPv4-mapped IPv6, as the URL parser writes it (::ffff:7f00:1)
    /^::ffff:(127\.|7f[0-9a-f]{2}:)/.test(host) ||
    host === "::ffff:0:0";
  return loopback ? url : null;
}

/**
 * A loopback URL of the server's own API, with the pods' URL in its place
 * (path and query kept); null when it is not the server's or pods have no
 * URL to reach Paperclip at.
 */
function rewriteToPods(url: URL, opts: PodEnvOptions): string | null {
  const server = apiBase(opts.serverApiUrl);
  const pods = apiBase(opts.podApiUrl);
  if (!server || !pods || url.origin !== server.origin) return null;
  if (server.path && url.pathname !== server.path && !url.pathname.startsWith(`${server.path}/`)) return null;
  const rest = url.pathname.slice(server.path.length);
  return `${pods.origin}${pods.path}${rest || "/"}${url.search}${url.hash}`;
}

/**
 * A Paperclip API URL as Paperclip reads it: origin and base path, with no
 * trailing slash and no trailing "/api" (Paperclip accepts
 * PAPERCLIP_API_URL with or without it, and adds "/api" to its routes
 * itself); null when it is not a URL.
 */
export function apiBase(raw: string): { origin: string; path: string } | null {
  if (!raw) return null;
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return null;
  }
  return { origin: u.origin, path: u.pathname.replace(/\/+$/, "").replace(/\/api$/, "") };
}
