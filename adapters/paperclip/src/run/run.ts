// One Paperclip run in progress: what its stages (settings.ts, reattach.ts,
// submit.ts, follow.ts, cancel.ts) share. The run is made once its
// settings and clients are known; adapter.ts's executeRun takes it
// through the stages in order.

import type { AdapterExecutionContext, AdapterExecutionResult } from "@paperclipai/adapter-utils";
import type { V1Job } from "@kubernetes/client-node";

import type { ClipjobSettings } from "../config.js";
import type { AdapterDefinition } from "../definitions.js";
import type { AdapterDeps } from "../deps.js";
import { isNotFound, readKubeError } from "../errors.js";
import type { KubeApi } from "../kube.js";
import { workspaceOf } from "../prompt.js";
import type { RelayClient } from "../relay.js";

/** A stage's last word: the result the run ends with. */
export interface RunEnds {
  result: AdapterExecutionResult;
}

/** The run a stage hands on to follow: the relay's run id and the Job that runs it. */
export interface FollowTarget {
  runId: string;
  namespace: string;
  /** The Job's name; empty when the run's Job is gone (nothing to watch or delete). */
  job: string;
  /** The session the run was asked to resume. */
  resumedSessionId: string | null;
  /** The Job's uid; none when the run's own Job is gone. */
  jobUid?: string;
}

/** The adapter's notices for run ctx, prefixed [clipjob]. */
export function noticeFor(ctx: AdapterExecutionContext): (msg: string) => Promise<void> {
  // The adapter's own notices go to stderr, so stdout is exactly the
  // agent's output, which Paperclip's transcript parsers read.
  return async (msg: string) => {
    await ctx.onLog("stderr", `[clipjob] ${msg}\n`);
  };
}

/** Whether the Job has finished (a Complete or Failed condition). */
export function jobFinished(job: V1Job): boolean {
  return (job.status?.conditions ?? []).some((c) => (c.type === "Complete" || c.type === "Failed") && c.status === "True");
}

export class Run {
  /** The namespace the adapter runs the agent in. */
  readonly ns: string;
  readonly agentId: string;
  /** The run's working directory: the workspace's, else the configured one. */
  readonly workingDir: string;
  // The Secrets this execution created, removed again if its Job is not
  // admitted or is cancelled before clipjob could take them.
  readonly createdSecrets: string[] = [];
  /** Says msg on the run's log, as the adapter's (stderr, prefixed). */
  readonly notice: (msg: string) => Promise<void>;
  // Who the API server says this server is, asked once it is known (a
  // failed answer is asked again): clipjob records the creating user on
  // every Job, and only Jobs this server created are its runs (labels can
  // be copied by anyone who may create Jobs here).
  private self: Promise<string> | null = null;

  constructor(
    readonly def: AdapterDefinition,
    readonly ctx: AdapterExecutionContext,
    readonly deps: AdapterDeps,
    readonly settings: ClipjobSettings,
    readonly kube: KubeApi,
    readonly relay: RelayClient,
  ) {
    this.notice = noticeFor(ctx);
    this.ns = settings.namespace;
    this.agentId = ctx.agent.id;
    this.workingDir = workspaceOf(ctx.context ?? {}).cwd || settings.cwd;
  }

  /** This server's user, as the API server names it (SelfSubjectReview); asked once, again after a failure. */
  selfUser(): Promise<string> {
    this.self ??= this.kube.whoAmI().catch((err) => {
      this.self = null;
      throw err;
    });
    return this.self;
  }

  /** Deletes the Secrets this execution created (already gone is fine). */
  async dropSecrets(): Promise<void> {
    for (const name of this.createdSecrets) {
      await this.kube.deleteSecret(this.ns, name).catch(async (err) => {
        if (!isNotFound(err)) await this.notice(`could not delete the run's Secret ${this.ns}/${name}: ${readKubeError(err).message}`);
      });
    }
  }
}
