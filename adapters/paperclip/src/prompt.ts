// The run's prompt and its env, from Paperclip's run context, composed the
// way Paperclip's own local adapters compose them (with adapter-utils'
// helpers, so a new wake shape or template variable reaches clipjob runs
// too). The prompt goes to the pod by annotation or Secret, the env by the
// run's env Secret; nothing here touches the cluster.

import { constants } from "node:fs";
import { open, readlink, realpath } from "node:fs/promises";
import { dirname, isAbsolute, resolve, sep } from "node:path";

import type { AdapterExecutionContext } from "@paperclipai/adapter-utils";
import {
  applyPaperclipWorkspaceEnv,
  buildRuntimeToolsEnv,
  DEFAULT_PAPERCLIP_AGENT_PROMPT_TEMPLATE,
  isPaperclipRecoveryWakePayload,
  joinPromptSections,
  readPaperclipIssueWorkModeFromContext,
  renderPaperclipWakePrompt,
  renderTemplate,
  stringifyPaperclipWakePayload,
} from "@paperclipai/adapter-utils/server-utils";

import { podEnv } from "./podenv.js";
import type { ClipjobSettings } from "./config.js";
import { message } from "./errors.js";

function text(value: unknown): string {
  return typeof value === "string" ? value.trim() : "";
}

function record(value: unknown): Record<string, unknown> {
  return value && typeof value === "object" && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
}

/** The run's workspace as Paperclip describes it in context.paperclipWorkspace. */
export interface RunWorkspace {
  cwd: string;
  source: string;
  strategy: string;
  workspaceId: string;
  repoUrl: string;
  repoRef: string;
  branch: string;
  worktreePath: string;
  agentHome: string;
}

export function workspaceOf(context: Record<string, unknown>): RunWorkspace {
  const w = record(context.paperclipWorkspace);
  return {
    cwd: text(w.cwd),
    source: text(w.source),
    strategy: text(w.strategy),
    workspaceId: text(w.workspaceId),
    repoUrl: text(w.repoUrl),
    repoRef: text(w.repoRef),
    branch: text(w.branchName) || text(w.branch),
    worktreePath: text(w.worktreePath),
    agentHome: text(w.agentHome) || text(context.agentHome),
  };
}

/** The task (issue) the run works on, if the wake names one. */
export function taskIdOf(context: Record<string, unknown>): string {
  return text(context.taskId) || text(context.issueId);
}

/**
 * The session to resume: Paperclip's stored session params (or its legacy
 * session id), unless they were made in another working directory —
 * agents keep sessions per directory, as Paperclip's Claude adapter checks.
 */
export function sessionToResume(runtime: AdapterExecutionContext["runtime"], workingDir: string): string {
  const params = record(runtime.sessionParams);
  const id = text(params.sessionId) || text(runtime.sessionId);
  const cwd = text(params.cwd);
  if (!id) return "";
  if (cwd && workingDir && cwd.replace(/\/+$/, "") !== workingDir.replace(/\/+$/, "")) return "";
  return id;
}

/** An instructions file larger than this is refused: it goes into every prompt. */
const MAX_INSTRUCTIONS_BYTES = 1024 * 1024;

/** Never read, whatever the roots say: the kernel's and the pod's secrets. */
const NEVER_READ = ["/proc", "/sys", "/dev", "/var/run/secrets", "/run/secrets"];

/**
 * What an instructions file is: a text document. Paperclip's home (a
 * root by default) also holds the server's .env with its signing
 * secrets, secrets/master.key, config.json and the database; none of
 * those is a document, and a path through a hidden directory or one
 * named secrets is refused too.
 */
const INSTRUCTIONS_EXTENSIONS = [".md", ".markdown", ".mdx", ".txt"];

function notADocument(real: string, root: string): string | null {
  // Below the root only: Paperclip's own home is ~/.paperclip.
  const parts = real.slice(root.length).split(sep).filter((p) => p !== "");
  const hidden = parts.find((p) => p.startsWith("."));
  if (hidden) return `it resolves to ${real}, through ${hidden}, and hidden files and directories are never read`;
  if (parts.some((p) => p.toLowerCase() === "secrets")) return `it resolves to ${real}, under a directory named secrets, which is never read`;
  const base = parts[parts.length - 1] ?? "";
  if (!INSTRUCTIONS_EXTENSIONS.some((ext) => base.toLowerCase().endsWith(ext))) {
    return `it resolves to ${real}, which is not a text document (${INSTRUCTIONS_EXTENSIONS.join(", ")})`;
  }
  return null;
}

function within(path: string, dir: string): boolean {
  return path === dir || path.startsWith(dir.endsWith(sep) ? dir : dir + sep);
}

/**
 * Reads an agent's instructions file, confined to `roots`. The path comes
 * from the agent's config, and the file's text goes into a pod annotation
 * anyone who reads Jobs sees, so a path (or a symlink planted on the shared
 * volume) naming /proc/self/environ or the server's token would publish the
 * server's secrets. The check is on the file actually opened: its real
 * path, read back from the open descriptor where the platform allows,
 * must lie under a root; it must be a regular file, and not too large.
 */
export async function readInstructionsFile(path: string, roots: string[], maxBytes = MAX_INSTRUCTIONS_BYTES): Promise<string> {
  if (!isAbsolute(path)) throw new Error("not an absolute path");
  const realRoots = await Promise.all(roots.map((r) => realpath(r).catch(() => r)));
  // A path that is not under a root by its text is refused before the
  // file system is asked: the refusal, in the run's log, then says nothing
  // of what exists outside the roots.
  if (![...roots, ...realRoots].some((r) => within(resolve(path), r))) {
    throw new Error(`it is outside the directories instructions may come from (${roots.join(", ")}; the server's CLIPJOB_INSTRUCTIONS_ROOTS)`);
  }
  const check = (real: string) => {
    if (NEVER_READ.some((d) => within(real, d))) throw new Error(`it resolves to ${real}, which is never read`);
    const root = realRoots.find((r) => within(real, r));
    if (root === undefined) {
      throw new Error(`it resolves to ${real}, outside the directories instructions may come from (${roots.join(", ")}; the server's CLIPJOB_INSTRUCTIONS_ROOTS)`);
    }
    const why = notADocument(real, root);
    if (why) throw new Error(why);
  };
  // Checked before opening too: opening a device or a FIFO has effects of
  // its own (O_NONBLOCK keeps a FIFO from holding the run).
  check(await realpath(path));
  const fh = await open(path, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
  try {
    // The path may have changed since (a symlink swapped on the shared
    // volume): what counts is what was opened.
    const opened = await readlink(`/proc/self/fd/${fh.fd}`).catch(() => null);
    if (opened !== null) check(opened);
    const st = await fh.stat();
    if (!st.isFile()) throw new Error("not a regular file");
    // A hard link has no path of its own to check: a second name for the
    // server's .env under a root would pass every rule above.
    if (st.nlink > 1) throw new Error("it has other hard links, so what it is cannot be told from its path");
    if (st.size > maxBytes) throw new Error(`${st.size} bytes, over the ${maxBytes} an instructions file may have`);
    const buf = Buffer.alloc(maxBytes + 1);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    if (bytesRead > maxBytes) throw new Error(`over the ${maxBytes} bytes an instructions file may have`);
    return buf.subarray(0, bytesRead).toString("utf8");
  } finally {
    await fh.close();
  }
}

/**
 * The roots of one agent's instructions: `{companyId}` and `{agentId}` in
 * a root are the run's (so one company's agents cannot read another's
 * files); a root whose id could leave its directory is dropped.
 */
export function rootsFor(roots: string[], agent: { id: string; companyId: string }): string[] {
  const safe = (id: string) => /^[A-Za-z0-9_-]+$/.test(id);
  return roots.flatMap((r) => {
    if (r.includes("{companyId}") && !safe(agent.companyId)) return [];
    if (r.includes("{agentId}") && !safe(agent.id)) return [];
    return [r.replaceAll("{companyId}", agent.companyId).replaceAll("{agentId}", agent.id)];
  });
}

export interface BuiltPrompt {
  prompt: string;
  metrics: Record<string, number>;
  notes: string[];
}

/**
 * The prompt of a run: instructions, bootstrap (new sessions), the wake,
 * the session handoff, and the heartbeat template, as Paperclip's local
 * adapters join them. A resumed session with a wake gets only the delta.
 */
export async function buildPrompt(
  ctx: Pick<AdapterExecutionContext, "agent" | "runId" | "context">,
  settings: Pick<ClipjobSettings, "instructionsFilePath" | "instructionsRoots" | "promptTemplate" | "bootstrapPromptTemplate">,
  resumed: boolean,
  read: (path: string) => Promise<string> = (p) => readInstructionsFile(p, rootsFor(settings.instructionsRoots, ctx.agent)),
  /** What the prompt says of the agent's skills (skills.ts's skillsPrompt). */
  skills = "",
): Promise<BuiltPrompt> {
  const { agent, runId, context } = ctx;
  const notes: string[] = [];
  const templateData = {
    agentId: agent.id,
    companyId: agent.companyId,
    runId,
    company: { id: agent.companyId },
    agent,
    run: { id: runId, source: "on_demand" },
    context,
  };

  let instructions = "";
  if (settings.instructionsFilePath) {
    // Read on the server: the pod may not see the same path, and the
    // prompt is how an agent command without a system-prompt flag gets it.
    try {
      const body = (await read(settings.instructionsFilePath)).trim();
      if (body) {
        instructions =
          `${body}\n\nThe above agent instructions were loaded from ${settings.instructionsFilePath}. ` +
          `Resolve any relative file references from ${dirname(settings.instructionsFilePath)}.`;
      }
    } catch (err) {
      notes.push(`instructions file ${settings.instructionsFilePath} could not be read (${message(err)}); continuing without it`);
    }
  }

  const bootstrap =
    !resumed && settings.bootstrapPromptTemplate.trim() ? renderTemplate(settings.bootstrapPromptTemplate, templateData).trim() : "";
  const wake = renderPaperclipWakePrompt(context.paperclipWake, { resumedSession: resumed });
  const resumeDelta = resumed && wake.length > 0;
  const heartbeat =
    resumeDelta || isPaperclipRecoveryWakePayload(context.paperclipWake)
      ? ""
      : renderTemplate(settings.promptTemplate || DEFAULT_PAPERCLIP_AGENT_PROMPT_TEMPLATE, templateData);
  const handoff = text(context.paperclipSessionHandoffMarkdown);
  // The skills go with the instructions, as Paperclip's Claude adapter
  // appends its skill manifest to them: a session that is resumed with only
  // the wake had both in its first prompt.
  const prefix = resumeDelta ? "" : joinPromptSections([instructions, skills.trim()]);
  const prompt = joinPromptSections([prefix, bootstrap, wake, handoff, heartbeat]);
  return {
    prompt,
    notes,
    metrics: {
      promptChars: prompt.length,
      instructionsChars: resumeDelta ? 0 : instructions.length,
      skillsChars: resumeDelta ? 0 : skills.trim().length,
      bootstrapPromptChars: bootstrap.length,
      wakePromptChars: wake.length,
      sessionHandoffChars: handoff.length,
      heartbeatPromptChars: heartbeat.length,
    },
  };
}

/**
 * The run's own env vars, for its env Secret: the callback token, the wake
 * context and the workspace, then the agent's configured env. The run's
 * identity (PAPERCLIP_AGENT_ID, _RUN_ID, _COMPANY_ID, _TASK_ID,
 * _SESSION_ID) is not here: clipjob sets it from the Job's labels.
 */
export function buildRunEnv(
  ctx: Pick<AdapterExecutionContext, "context" | "authToken" | "runtimeTools">,
  settings: Pick<ClipjobSettings, "env" | "paperclipApiUrl" | "serverApiUrl">,
  /** The directories the pod mounts, when known (mountedRunDirs). */
  podDirs?: string[],
): { env: Record<string, string>; notes: string[] } {
  const { context } = ctx;
  const env: Record<string, string> = {};
  const w = workspaceOf(context);
  applyPaperclipWorkspaceEnv(env, {
    workspaceCwd: w.cwd || null,
    workspaceSource: w.source || null,
    workspaceStrategy: w.strategy || null,
    workspaceId: w.workspaceId || null,
    workspaceRepoUrl: w.repoUrl || null,
    workspaceRepoRef: w.repoRef || null,
    workspaceBranch: w.branch || null,
    workspaceWorktreePath: w.worktreePath || null,
    agentHome: w.agentHome || null,
  });
  const taskId = taskIdOf(context);
  const wakeReason = text(context.wakeReason);
  const wakeCommentId = text(context.wakeCommentId) || text(context.commentId);
  const approvalId = text(context.approvalId);
  const approvalStatus = text(context.approvalStatus);
  const linkedIssueIds = Array.isArray(context.issueIds)
    ? context.issueIds.filter((v): v is string => typeof v === "string" && v.trim() !== "")
    : [];
  const wakePayload = stringifyPaperclipWakePayload(context.paperclipWake);
  const workMode = readPaperclipIssueWorkModeFromContext(context);
  // The label gives PAPERCLIP_TASK_ID too; this copy covers a task id that
  // cannot be a label value.
  if (taskId) env.PAPERCLIP_TASK_ID = taskId;
  if (workMode) env.PAPERCLIP_ISSUE_WORK_MODE = workMode;
  if (wakeReason) env.PAPERCLIP_WAKE_REASON = wakeReason;
  if (wakeCommentId) env.PAPERCLIP_WAKE_COMMENT_ID = wakeCommentId;
  if (approvalId) env.PAPERCLIP_APPROVAL_ID = approvalId;
  if (approvalStatus) env.PAPERCLIP_APPROVAL_STATUS = approvalStatus;
  if (linkedIssueIds.length > 0) env.PAPERCLIP_LINKED_ISSUE_IDS = linkedIssueIds.join(",");
  if (wakePayload) env.PAPERCLIP_WAKE_PAYLOAD_JSON = wakePayload;
  Object.assign(env, buildRuntimeToolsEnv(ctx.runtimeTools));
  if (settings.paperclipApiUrl) env.PAPERCLIP_API_URL = settings.paperclipApiUrl;
  Object.assign(env, settings.env);
  // The run-scoped callback token, unless the agent's config sets its own.
  if (ctx.authToken && !settings.env.PAPERCLIP_API_KEY) env.PAPERCLIP_API_KEY = ctx.authToken;
  // The server's local paths and loopback URLs stay on the server.
  const pod = podEnv(env, { serverApiUrl: settings.serverApiUrl, podApiUrl: settings.paperclipApiUrl, podDirs });
  const notes: string[] = [];
  if (pod.dropped.length > 0) {
    notes.push(`left out of the pod's env: ${pod.dropped.map((d) => `${d.name} (${d.why})`).join("; ")}`);
  }
  if (pod.rewritten.length > 0) {
    notes.push(`rewritten to ${settings.paperclipApiUrl} for the pod: ${pod.rewritten.join(", ")}`);
  }
  return { env: pod.env, notes };
}
