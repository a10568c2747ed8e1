// The few Kubernetes calls the adapter makes, behind a small interface so
// execute() and testEnvironment() can be exercised against a fake, and so
// what the adapter may do in a cluster is listed in one place (the README's
// RBAC table is this interface).

import { existsSync } from "node:fs";
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

/**
 * The client's configuration: a kubeconfig file when given, else the pod's
 * ServiceAccount when running in a cluster, else the usual search
 * (KUBECONFIG, ~/.kube/config).
 */
export function loadKubeConfig(kubeconfigPath: string): KubeConfig {
  const kc = new KubeConfig();
  if (kubeconfigPath) {
    kc.loadFromFile(kubeconfigPath);
  } else if (process.env.KUBERNETES_SERVICE_HOST && existsSync(IN_CLUSTER_TOKEN)) {
    kc.loadFromCluster();
  } else {
    kc.loadFromDefault();
  }
  return kc;
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
