// The few Kubernetes calls the adapter makes, behind a small interface so
// execute() and testEnvironment() can be exercised against a fake, and so
// what the adapter may do in a cluster is listed in one place (the README's
// RBAC table is this interface).

import { existsSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { AuthenticationV1Api, AuthorizationV1Api, BatchV1Api, CoreV1Api, KubeConfig, type V1Job, type V1Secret } from "@kubernetes/client-node";

import type { DeletePropagation } from "./config.js";

export interface AccessQuestion {
  namespace: string;
  verb: string;
  group: string;
  resource: string;
  subresource?: string;
}

export interface KubeApi {
  createSecret(namespace: string, secret: V1Secret): Promise<void>;
  deleteSecret(namespace: string, name: string): Promise<void>;
  /** Creates the Job; with dryRun the API server admits it (webhooks included) and stores nothing. */
  createJob(namespace: string, job: V1Job, opts?: { dryRun?: boolean }): Promise<V1Job>;
  readJob(namespace: string, name: string): Promise<V1Job>;
  /** The Jobs of the namespace matching a label selector. */
  listJobs(namespace: string, labelSelector: string): Promise<V1Job[]>;
  /** Deletes the Job; with uid, only if the Job of that name is still that one (a 409 otherwise). */
  deleteJob(namespace: string, name: string, propagation: DeletePropagation, uid?: string): Promise<void>;
  /** A SelfSubjectAccessReview: may this client do that? */
  canI(q: AccessQuestion): Promise<{ allowed: boolean; reason?: string }>;
  /**
   * A SelfSubjectReview: the user the API server authenticates this client
   * as, which clipjob records on the Jobs it creates (created-by).
   */
  whoAmI(): Promise<string>;
}

const IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/** A client configuration that cannot be used, and what to set instead. */
export class KubeConfigError extends Error {}

// The credential keys of a kubeconfig user with a dash, as client-node
// (like kubectl) reads them. Spelt otherwise (tokenFile, token_file,
// TokenFile) they are ignored: a user holding only those would connect as
// anonymous, so such a spelling is named in the refusal.
const DASHED_USER_KEYS = ["token-file", "client-certificate", "client-certificate-data", "client-key", "client-key-data", "auth-provider"];

/**
 * The client's configuration: a kubeconfig file when given, else the pod's
 * ServiceAccount when running in a cluster, else the usual search
 * (KUBECONFIG, ~/.kube/config). It is refused, naming what to set, when
 * there is none (client-node would otherwise talk to localhost:8080) and
 * when its user carries no credentials client-node reads (it would
 * otherwise connect as anonymous).
 */
export function loadKubeConfig(kubeconfigPath: string, env: NodeJS.ProcessEnv = process.env): KubeConfig {
  const kc = new KubeConfig();
  let source: string;
  let loaded: string[];
  if (kubeconfigPath) {
    if (!existsSync(kubeconfigPath)) {
      throw new KubeConfigError(`CLIPJOB_KUBECONFIG names ${kubeconfigPath}, which does not exist (or the server's user may not read its directory)`);
    }
    source = `CLIPJOB_KUBECONFIG (${kubeconfigPath})`;
    loaded = [kubeconfigPath];
  } else if (env.KUBERNETES_SERVICE_HOST && existsSync(IN_CLUSTER_TOKEN)) {
    kc.loadFromCluster();
    return kc;
  } else {
    const files = (env.KUBECONFIG ?? "").split(":").filter((f) => f !== "");
    const home = join(env.HOME || homedir(), ".kube", "config");
    const found = files.length > 0 ? files.filter((f) => existsSync(f)) : existsSync(home) ? [home] : [];
    if (found.length === 0) {
      throw new KubeConfigError(
        `no Kubernetes client configuration: CLIPJOB_KUBECONFIG is not set, the server is not in a pod with a ServiceAccount, and ${files.length > 0 ? `KUBECONFIG (${files.join(":")}) names no file that exists` : `there is no KUBECONFIG nor ${home}`}. Set CLIPJOB_KUBECONFIG in the server's environment to a kubeconfig file`,
      );
    }
    source = files.length > 0 ? `KUBECONFIG (${found.join(":")})` : home;
    loaded = found;
  }
  loadFiles(kc, loaded, source);
  const cluster = kc.getCurrentCluster();
  if (!cluster?.server) {
    throw new KubeConfigError(`${source}: its current context (${kc.getCurrentContext() || "none"}) names no cluster with a server. Set CLIPJOB_KUBECONFIG to a kubeconfig whose current context has one`);
  }
  const user = kc.getCurrentUser();
  if (!hasCredentials(user)) {
    const misspelled = [...new Set(loaded.flatMap((f) => misspelledUserKeys(readFileSync(f, "utf8"))))];
    throw new KubeConfigError(
      `${source}: user ${user?.name ? JSON.stringify(user.name) : "(none)"} of context ${kc.getCurrentContext() || "(none)"} carries no credentials the client reads (token, token-file, client-certificate with client-key, exec with a command, auth-provider with a name, username with password), so it would connect as anonymous${
        misspelled.length > 0 ? `; it has ${misspelled.map((k) => `${k} (the key is ${rightKey(k)})`).join(", ")}` : ""
      }`,
    );
  }
  return kc;
}

/** Loads kubeconfig files into kc (the first one's current context wins), naming source in an error. */
function loadFiles(kc: KubeConfig, files: string[], source: string): void {
  try {
    kc.loadFromFile(files[0]!);
    for (const f of files.slice(1)) {
      const more = new KubeConfig();
      more.loadFromFile(f);
      kc.mergeConfig(more, true);
    }
  } catch (err) {
    throw new KubeConfigError(`${source}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/**
 * Whether a kubeconfig user carries credentials client-node sends: half of
 * a pair (a certificate without its key, a username without a password)
 * or an exec without a command sends nothing.
 */
function hasCredentials(user: ReturnType<KubeConfig["getCurrentUser"]>): boolean {
  if (!user) return false;
  if (user.token) return true;
  if ((user.certData || user.certFile) && (user.keyData || user.keyFile)) return true;
  if (user.exec && typeof (user.exec as { command?: unknown }).command === "string" && (user.exec as { command: string }).command !== "") return true;
  if (user.authProvider && typeof (user.authProvider as { name?: unknown }).name === "string" && (user.authProvider as { name: string }).name !== "") return true;
  return Boolean(user.username && user.password);
}

/** The misspelled user keys a kubeconfig file's text holds: any spelling of a key that is not the key. */
function misspelledUserKeys(text: string): string[] {
  const known = new Map(DASHED_USER_KEYS.map((k) => [normalizeKey(k), k]));
  const found = new Set<string>();
  for (const m of text.matchAll(/^\s*(?:- )?([A-Za-z][A-Za-z_-]*)\s*:/gm)) {
    const key = m[1]!;
    const right = known.get(normalizeKey(key));
    if (right && key !== right) found.add(key);
  }
  return [...found];
}

function rightKey(k: string): string {
  return DASHED_USER_KEYS.find((r) => normalizeKey(r) === normalizeKey(k)) ?? k;
}

function normalizeKey(k: string): string {
  return k.replace(/[-_]/g, "").toLowerCase();
}

/** The KubeApi of a real cluster. */
export function kubeApi(kc: KubeConfig): KubeApi {
  const core = kc.makeApiClient(CoreV1Api);
  const batch = kc.makeApiClient(BatchV1Api);
  const authz = kc.makeApiClient(AuthorizationV1Api);
  const authn = kc.makeApiClient(AuthenticationV1Api);
  return {
    async createSecret(namespace, body) {
      await core.createNamespacedSecret({ namespace, body });
    },
    async deleteSecret(namespace, name) {
      await core.deleteNamespacedSecret({ namespace, name });
    },
    async createJob(namespace, body, opts) {
      return batch.createNamespacedJob({ namespace, body, ...(opts?.dryRun ? { dryRun: "All" } : {}) });
    },
    async readJob(namespace, name) {
      return batch.readNamespacedJob({ namespace, name });
    },
    async listJobs(namespace, labelSelector) {
      return (await batch.listNamespacedJob({ namespace, labelSelector })).items;
    },
    async deleteJob(namespace, name, propagationPolicy, uid) {
      // With a body, the API server reads the options from it alone: a
      // propagationPolicy left in the query would be dropped, and a Job's
      // default is to orphan its pods.
      await batch.deleteNamespacedJob({ namespace, name, body: { propagationPolicy, ...(uid ? { preconditions: { uid } } : {}) } });
    },
    async canI(q) {
      const review = await authz.createSelfSubjectAccessReview({
        body: {
          apiVersion: "authorization.k8s.io/v1",
          kind: "SelfSubjectAccessReview",
          spec: {
            resourceAttributes: {
              namespace: q.namespace,
              verb: q.verb,
              group: q.group,
              resource: q.resource,
              ...(q.subresource ? { subresource: q.subresource } : {}),
            },
          },
        },
      });
      return { allowed: review.status?.allowed === true, reason: review.status?.reason };
    },
    async whoAmI() {
      const review = await authn.createSelfSubjectReview({ body: { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" } });
      const user = review.status?.userInfo?.username ?? "";
      if (!user) throw new Error("the API server's SelfSubjectReview named no user");
      return user;
    },
  };
}
