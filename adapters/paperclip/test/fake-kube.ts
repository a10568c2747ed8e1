// An in-memory KubeApi: what the adapter asked of the cluster, and knobs
// for what the API server (with clipjob's webhooks) answers.

import { randomUUID } from "node:crypto";

import { ApiException, type V1Job, type V1Secret } from "@kubernetes/client-node";

import type { DeletePropagation } from "../src/config.js";
import type { AccessQuestion, KubeApi } from "../src/kube.js";

export function statusError(code: number, reason: string, message: string, causes?: Array<{ reason: string; message: string }>): ApiException<string> {
  const body = JSON.stringify({ kind: "Status", apiVersion: "v1", status: "Failure", code, reason, message, ...(causes ? { details: { causes } } : {}) });
  return new ApiException(code, `HTTP-Code: ${code}`, body, {});
}

export class FakeKube implements KubeApi {
  readonly jobs = new Map<string, V1Job>();
  readonly secrets = new Map<string, V1Secret>();
  readonly calls: string[] = [];
  readonly deletions: Array<{ name: string; propagation: DeletePropagation }> = [];
  /** Decides a (non-dry-run) create: return the stored Job, or throw. Default: stores it as given. */
  onCreateJob: (job: V1Job) => V1Job = (job) => job;
  /** Called after a Job is stored (tests start the fake relay's run from here). */
  afterCreateJob: (job: V1Job) => void = () => {};
  /** Called after a Job is read (tests change it between two reads from here). */
  afterReadJob: (job: V1Job) => void = () => {};
  onDryRun: (job: V1Job) => V1Job = (job) => ({
    ...job,
    metadata: {
      ...job.metadata,
      annotations: { ...job.metadata?.annotations, "clipjob.paperclip.io/profile": "claude_local", "clipjob.paperclip.io/created-by": this.user },
    },
    spec: { ...job.spec!, template: { ...job.spec!.template, spec: { containers: [{ name: "agent", image: "ghcr.io/paperclipai/paperclip:v1" }] } } },
  });
  denied = new Set<string>();
  /** Who the API server says this client is; clipjob records it on the Jobs it creates. */
  user = "system:serviceaccount:paperclip:paperclip";
  /** Makes whoAmI fail (an API server that cannot be asked). */
  whoAmIError: Error | null = null;
  /** Deleted Jobs linger this long (Foreground deletion waits for pods). */
  deleteDelayMs = 0;

  async createSecret(_namespace: string, secret: V1Secret): Promise<void> {
    const name = secret.metadata!.name!;
    this.calls.push(`create secret ${name}`);
    if (this.secrets.has(name)) throw statusError(409, "AlreadyExists", `secrets "${name}" already exists`);
    this.secrets.set(name, secret);
  }

  async deleteSecret(_namespace: string, name: string): Promise<void> {
    this.calls.push(`delete secret ${name}`);
    if (!this.secrets.delete(name)) throw statusError(404, "NotFound", `secrets "${name}" not found`);
  }

  async createJob(_namespace: string, job: V1Job, opts?: { dryRun?: boolean }): Promise<V1Job> {
    const name = job.metadata!.name!;
    if (opts?.dryRun) {
      this.calls.push(`dry-run job ${name}`);
      return this.onDryRun(structuredClone(job));
    }
    this.calls.push(`create job ${name}`);
    if (this.jobs.has(name)) throw statusError(409, "AlreadyExists", `jobs.batch "${name}" already exists`);
    // clipjob's mutating webhook records the creating user.
    const created = structuredClone(job);
    created.metadata!.annotations = { ...created.metadata?.annotations, "clipjob.paperclip.io/created-by": this.user };
    created.metadata!.uid = randomUUID();
    const stored = this.onCreateJob(created);
    this.jobs.set(name, stored);
    this.afterCreateJob(stored);
    return stored;
  }

  async readJob(_namespace: string, name: string): Promise<V1Job> {
    const job = this.jobs.get(name);
    if (!job) throw statusError(404, "NotFound", `jobs.batch "${name}" not found`);
    const read = structuredClone(job);
    this.afterReadJob(job);
    return read;
  }

  async listJobs(_namespace: string, labelSelector: string): Promise<V1Job[]> {
    this.calls.push(`list jobs ${labelSelector}`);
    const [key, value] = labelSelector.split("=");
    return [...this.jobs.values()].filter((j) => j.metadata?.labels?.[key] === value);
  }

  async deleteJob(_namespace: string, name: string, propagation: DeletePropagation, uid?: string): Promise<void> {
    this.calls.push(`delete job ${name}`);
    const job = this.jobs.get(name);
    if (!job) throw statusError(404, "NotFound", `jobs.batch "${name}" not found`);
    if (uid && job.metadata?.uid !== uid) {
      throw statusError(409, "Conflict", `Precondition failed: UID in precondition: ${uid}, UID in object meta: ${job.metadata?.uid}`);
    }
    this.deletions.push({ name, propagation });
    setTimeout(() => this.jobs.delete(name), this.deleteDelayMs);
  }

  async whoAmI(): Promise<string> {
    if (this.whoAmIError) throw this.whoAmIError;
    return this.user;
  }

  async canI(q: AccessQuestion): Promise<{ allowed: boolean }> {
    return { allowed: !this.denied.has(`${q.verb} ${q.resource}${q.subresource ? `/${q.subresource}` : ""}`) };
  }
}
