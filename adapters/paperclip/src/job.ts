// The bare Job of one run and its per-run Secrets, built from plain values
// with no Kubernetes client, so what the adapter submits is testable on its
// own. The Job names the agent, the run and the profile and carries the
// run's options; it has no containers, image or volumes: clipjob's
// mutating webhook completes it (docs/contract.md).

import { createHash } from "node:crypto";
import { posix } from "node:path";
import type { V1Job, V1Secret } from "@kubernetes/client-node";

import {
  ANNOTATION_ENV_SECRET,
  ANNOTATION_MAX_TURNS,
  ANNOTATION_MODEL,
  ANNOTATION_PROMPT,
  ANNOTATION_PROMPT_SECRET,
  ANNOTATION_WORKING_DIR,
  LABEL_ADAPTER_TYPE,
  LABEL_AGENT_ID,
  LABEL_COMPANY_ID,
  LABEL_RUN_ID,
  LABEL_SESSION_ID,
  LABEL_TASK_ID,
  PROMPT_SECRET_KEY,
  SHARED_VOLUME_PATH,
} from "./contract.js";

export interface RunIdentity {
  agentId: string;
  runId: string;
  companyId?: string | null;
  taskId?: string | null;
}

export interface BuildRunInput {
  identity: RunIdentity;
  namespace: string;
  /** Value of paperclip.io/adapter-type: the clipjob profile. */
  profile: string;
  prompt: string;
  /** The run's env Secret's data; empty: no env Secret. */
  env: Record<string, string>;
  /** The agent session to resume. */
  sessionId?: string | null;
  model?: string | null;
  maxTurns?: number | null;
  workingDir?: string | null;
  timeoutSec?: number | null;
  ttlSecondsAfterFinished?: number | null;
  /** A prompt longer than this (UTF-8 bytes) goes in a Secret. */
  promptAnnotationMaxBytes: number;
  /** Overrides the name derived from the run (a retry after a name clash). */
  jobName?: string;
}

export interface RunObjects {
  jobName: string;
  job: V1Job;
  /** Created before the Job; clipjob makes the Job their owner. */
  envSecret: V1Secret | null;
  promptSecret: V1Secret | null;
  promptDelivery: "annotation" | "secret";
  /** What was left out of the Job and why, for the run's log. */
  notes: string[];
}

const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

/** Whether v can be a label value: at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends. */
export function isLabelValue(v: string): boolean {
  return v.length <= 63 && LABEL_VALUE.test(v);
}

/** Thrown when the run cannot be expressed as a bare Job at all. */
export class RunIdentityError extends Error {}

/**
 * The Job's name, derived from the run so that creating it twice for the
 * same run clashes (409 AlreadyExists) instead of starting a second Job.
 * At most 63 characters: the Job controller copies it into a pod label.
 */
export function jobNameFor(identity: RunIdentity): string {
  const slug = identity.runId
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 40)
    .replace(/-+$/g, "");
  const hash = createHash("sha256").update(`${identity.agentId}:${identity.runId}`).digest("hex").slice(0, 8);
  return slug ? `pc-${slug}-${hash}` : `pc-${hash}`;
}

/**
 * Whether dir is a working directory clipjob accepts: a clean absolute path
 * on the shared volume (it refuses anything else with 422).
 */
export function isSharedVolumePath(dir: string): boolean {
  if (!posix.isAbsolute(dir) || /[\x00-\x1f\x7f]/.test(dir)) return false;
  const clean = posix.normalize(dir);
  if (clean !== dir && `${clean}/` !== dir) return false;
  return clean === SHARED_VOLUME_PATH || clean.startsWith(`${SHARED_VOLUME_PATH}/`);
}

/** Builds the run's bare Job and Secrets. */
export function buildRunObjects(input: BuildRunInput): RunObjects {
  const { identity } = input;
  for (const [what, value] of [["agent id", identity.agentId], ["run id", identity.runId]] as const) {
    if (!value || !isLabelValue(value)) {
      throw new RunIdentityError(
        `the ${what} ${JSON.stringify(value)} cannot be a Kubernetes label value (at most 63 of A-Z a-z 0-9 . _ -, alphanumeric at both ends), which clipjob needs to tell runs apart`,
      );
    }
  }
  const notes: string[] = [];
  const jobName = input.jobName ?? jobNameFor(identity);

  // The run's Secrets carry the run and agent ids: clipjob refuses a Secret
  // not made for the run (403) and makes the Job the owner of those that
  // are, so they go with it.
  const runLabels: Record<string, string> = {
    [LABEL_AGENT_ID]: identity.agentId,
    [LABEL_RUN_ID]: identity.runId,
  };
  const labels: Record<string, string> = { ...runLabels, [LABEL_ADAPTER_TYPE]: input.profile };
  const optionalLabels: Array<[string, string, string | null | undefined]> = [
    [LABEL_COMPANY_ID, "company id", identity.companyId],
    [LABEL_TASK_ID, "task id", identity.taskId],
    [LABEL_SESSION_ID, "session id", input.sessionId],
  ];
  for (const [label, what, value] of optionalLabels) {
    if (!value) continue;
    if (isLabelValue(value)) {
      labels[label] = value;
    } else {
      notes.push(
        label === LABEL_SESSION_ID
          ? `the session ${JSON.stringify(value)} cannot be a label value, so it is not resumed: the agent starts a new session`
          : `the ${what} ${JSON.stringify(value)} cannot be a label value; left off the Job`,
      );
    }
  }

  const annotations: Record<string, string> = {};
  let envSecret: V1Secret | null = null;
  if (Object.keys(input.env).length > 0) {
    envSecret = {
      apiVersion: "v1",
      kind: "Secret",
      metadata: { name: `${jobName}-env`, namespace: input.namespace, labels: { ...runLabels } },
      type: "Opaque",
      stringData: { ...input.env },
    };
    annotations[ANNOTATION_ENV_SECRET] = `${jobName}-env`;
  }
  if (input.model) annotations[ANNOTATION_MODEL] = input.model;
  if (input.maxTurns && input.maxTurns > 0) annotations[ANNOTATION_MAX_TURNS] = String(input.maxTurns);
  if (input.workingDir) {
    if (isSharedVolumePath(input.workingDir)) {
      annotations[ANNOTATION_WORKING_DIR] = input.workingDir;
    } else {
      notes.push(
        `the working directory ${input.workingDir} is not a clean path under ${SHARED_VOLUME_PATH}, the volume agent pods share with the server; the agent starts in its profile's directory`,
      );
    }
  }

  const templateAnnotations: Record<string, string> = {};
  let promptSecret: V1Secret | null = null;
  let promptDelivery: RunObjects["promptDelivery"] = "annotation";
  if (Buffer.byteLength(input.prompt, "utf8") > input.promptAnnotationMaxBytes) {
    promptDelivery = "secret";
    promptSecret = {
      apiVersion: "v1",
      kind: "Secret",
      metadata: { name: `${jobName}-prompt`, namespace: input.namespace, labels: { ...runLabels } },
      type: "Opaque",
      stringData: { [PROMPT_SECRET_KEY]: input.prompt },
    };
    templateAnnotations[ANNOTATION_PROMPT_SECRET] = `${jobName}-prompt`;
  } else {
    templateAnnotations[ANNOTATION_PROMPT] = input.prompt;
  }

  const job: V1Job = {
    apiVersion: "batch/v1",
    kind: "Job",
    metadata: { name: jobName, namespace: input.namespace, labels, annotations },
    spec: {
      // No pod spec at all: clipjob adds the profile's container, the
      // server's image, volumes, env and security context.
      template: { metadata: { annotations: templateAnnotations } },
    },
  };
  if (input.timeoutSec && input.timeoutSec > 0) job.spec!.activeDeadlineSeconds = input.timeoutSec;
  if (input.ttlSecondsAfterFinished && input.ttlSecondsAfterFinished > 0) {
    job.spec!.ttlSecondsAfterFinished = input.ttlSecondsAfterFinished;
  }
  return { jobName, job, envSecret, promptSecret, promptDelivery, notes };
}

/**
 * Gives one of the run's Secrets another name, and the Job the reference
 * to it: the name was taken by a Secret this adapter cannot vouch for
 * (it may not read Secrets), which must be neither used nor deleted.
 */
export function renameRunSecret(objects: RunObjects, which: "env" | "prompt", suffix: string): string {
  const secret = which === "env" ? objects.envSecret : objects.promptSecret;
  if (!secret?.metadata?.name) throw new Error(`the run has no ${which} Secret`);
  const name = withSuffix(secret.metadata.name, suffix, 253);
  secret.metadata.name = name;
  if (which === "env") {
    objects.job.metadata!.annotations![ANNOTATION_ENV_SECRET] = name;
  } else {
    objects.job.spec!.template.metadata!.annotations![ANNOTATION_PROMPT_SECRET] = name;
  }
  return name;
}

/** A name for a second try after the first name was taken by another run's Job. */
export function retryJobName(jobName: string, suffix: string): string {
  return withSuffix(jobName, suffix, 63);
}

/** name-suffix, name cut so the whole is at most max characters. */
function withSuffix(name: string, suffix: string, max: number): string {
  return `${name.slice(0, max - suffix.length - 1)}-${suffix}`;
}
