// Company skills for a run's pod. Paperclip hands an adapter its company's
// skills (config.paperclipRuntimeSkills: each a directory on the server)
// and the agent's choice of them (config.paperclipSkillSync); its local
// adapters link the chosen ones into the CLI's skills folder on the host. A
// clipjob run's pod sees one skills directory, its company's
// R/skills/<company>, mounted read-only at the path the server sees it
// (rundirs.ts). So an enabled skill is given to the agent when its files
// lie in that directory, checked here on the server, and named to the
// agent by their path there. Any other enabled skill (one bundled in the
// server's own install, a local path elsewhere, one whose files Paperclip
// could not make) is named in a warning on the run's log, and the run goes
// on without it, as Paperclip's Claude adapter does for a missing source.
//
// Why paths in the prompt and no staged skills folder: the pod's command
// is the operator's profile, with no flag to point the CLI at a folder, and
// a folder the CLI finds on its own (.claude/skills in the agent's home or
// working directory) is one the agent writes, where it may have planted
// links for the server to follow. The skills directory is the server's and
// read-only in the pod, but it was writable by every pod before isolation.
// Writing nothing, the server follows no link of anyone's; Claude and
// OpenCode alike read a file the prompt names, as they read the files of
// the instructions bundle beside its entry file.

import { constants } from "node:fs";
import { lstat, open, readlink, realpath } from "node:fs/promises";
import { posix } from "node:path";

import type { AdapterSkillContext, AdapterSkillSnapshot } from "@paperclipai/adapter-utils";
import {
  buildRuntimeMountedSkillSnapshot,
  joinPromptSections,
  readPaperclipRuntimeSkillEntries,
  resolveLegacyPaperclipDesiredSkillNames,
  type PaperclipSkillEntry,
} from "@paperclipai/adapter-utils/server-utils";
import { buildSkillLibraryManifestMarkdown } from "@paperclipai/adapter-utils/skill-library-manifest";

import { message } from "./errors.js";
import { mountedSkillsDir, type RunHome } from "./rundirs.js";

/** An enabled skill the pod can read: its directory and SKILL.md as the pod sees them. */
export interface PodSkill {
  key: string;
  runtimeName: string;
  dir: string;
  skillFile: string;
  /** The description in SKILL.md's front matter, on one line; may be empty. */
  description: string;
}

/** The company's skills as a run's pod sees them. */
export interface SkillPlan {
  /** The company's skill directory in the pod, when the pod mounts one. */
  skillsDir: string | undefined;
  /** Every skill of the company library; one the pod cannot read is marked missing, with why. */
  entries: PaperclipSkillEntry[];
  /** The keys of the skills enabled for the agent. */
  desired: string[];
  /** The enabled skills the pod can read. */
  offered: PodSkill[];
  /** Each enabled skill the pod cannot read, with why: the run's log says it. */
  unavailable: Array<{ key: string; why: string }>;
}

/** How much of a SKILL.md is read for its front matter. */
const SKILL_HEAD_BYTES = 64 * 1024;

function within(path: string, dir: string): boolean {
  return path === dir || path.startsWith(dir.endsWith("/") ? dir : `${dir}/`);
}

/** Skill-authored or server-given text flattened to one bounded line, so it adds no line to the prompt. */
function oneLine(value: string, max: number): string {
  // \s has U+2028 and U+2029 but not NEL (U+0085), a line break to YAML and some readers.
  return value.replace(/[\s\u0085]+/g, " ").trim().slice(0, max);
}

/** A reason for not offering a skill: `why` for the run's log, `brief` for the agent. */
class Unreachable extends Error {
  constructor(
    readonly why: string,
    readonly brief = "its files are not in the company's skills directory this run's pod mounts",
  ) {
    super(why);
  }
}

/**
 * The description in a SKILL.md's YAML front matter (a plain or quoted
 * scalar, or a folded or literal block), or "".
 */
export function skillDescription(markdown: string): string {
  const m = /^---\r?\n([\s\S]*?)\r?\n---(?:\r?\n|$)/.exec(markdown);
  if (!m) return "";
  const lines = m[1].split(/\r?\n/);
  const at = lines.findIndex((l) => /^description\s*:/.test(l));
  if (at < 0) return "";
  let value = lines[at].replace(/^description\s*:\s*/, "");
  if (value === "" || /^[>|][+-]?$/.test(value)) {
    const block: string[] = [];
    for (const l of lines.slice(at + 1)) {
      if (!/^\s/.test(l) && l.trim() !== "") break;
      block.push(l.trim());
    }
    value = block.join(" ");
  } else if (/^(["']).*\1$/.test(value)) {
    value = value.slice(1, -1);
  }
  return oneLine(value, 300);
}

/**
 * Whether the pod can read skill entry, checked on the server: its source
 * a directory under the company's skills directory, reached with no
 * symbolic link (a link there would lead the server's reads elsewhere, and
 * in the pod, which resolves it in its own view, to another file or none),
 * with a SKILL.md that is a regular file of one link, its real path under
 * the skills directory. Throws Unreachable otherwise.
 */
async function podSkill(entry: PaperclipSkillEntry, skillsDir: string | undefined): Promise<PodSkill> {
  if (entry.sourceStatus === "missing") {
    const detail = entry.missingDetail?.trim() || "its files are unavailable";
    throw new Unreachable(detail, detail);
  }
  if (!skillsDir) {
    throw new Unreachable(
      "the run's pod mounts no skills directory (the server's home is not on the volume the pods share, or the company id cannot name a directory)",
      "this run's pod mounts no skills directory",
    );
  }
  const source = entry.source;
  // eslint-disable-next-line no-control-regex
  // A path the prompt names as it is: no control character or line break of any kind.
  if (!posix.isAbsolute(source) || /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/.test(source)) {
    throw new Unreachable(`its source ${JSON.stringify(source)} is not an absolute path`);
  }
  const dir = posix.resolve(source);
  if (dir === skillsDir || !within(dir, skillsDir)) {
    throw new Unreachable(`its files are at ${dir}, outside the company's skills directory ${skillsDir}, the only skills a run's pod mounts`);
  }
  let at = skillsDir;
  for (const segment of ["", ...posix.relative(skillsDir, dir).split("/")]) {
    at = posix.join(at, segment);
    const st = await lstat(at).catch((err: unknown) => {
      throw new Unreachable(`${at} cannot be read (${message(err)})`, "its files are unavailable");
    });
    if (st.isSymbolicLink()) {
      throw new Unreachable(`${at} is a symbolic link, which the server does not follow: the skill's files would be wherever it leads`);
    }
    if (!st.isDirectory()) throw new Unreachable(`${at} is not a directory`, "its files are unavailable");
  }
  const skillFile = posix.join(dir, "SKILL.md");
  const realSkillsDir = await realpath(skillsDir);
  let fh;
  try {
    // O_NOFOLLOW: a SKILL.md that is a link is refused, not followed.
    fh = await open(skillFile, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ELOOP") throw new Unreachable(`${skillFile} is a symbolic link, which the server does not follow`);
    throw new Unreachable(`${skillFile} cannot be read (${message(err)})`, "its SKILL.md is unavailable");
  }
  try {
    // A directory on the way swapped for a link since it was checked:
    // what counts is the file opened.
    const opened = await readlink(`/proc/self/fd/${fh.fd}`).catch(() => null);
    if (opened !== null && !within(opened, realSkillsDir)) {
      throw new Unreachable(`${skillFile} resolves to ${opened}, outside the company's skills directory ${skillsDir}`);
    }
    const st = await fh.stat();
    if (!st.isFile()) throw new Unreachable(`${skillFile} is not a regular file`, "its SKILL.md is unavailable");
    // A hard link has no path of its own to check.
    if (st.nlink > 1) throw new Unreachable(`${skillFile} has other hard links, so what it is cannot be told from its path`);
    const buf = Buffer.alloc(SKILL_HEAD_BYTES);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    return {
      key: entry.key,
      runtimeName: entry.runtimeName,
      dir,
      skillFile,
      description: skillDescription(buf.subarray(0, bytesRead).toString("utf8")),
    };
  } finally {
    await fh.close();
  }
}

/**
 * The company's skills as a run of companyId sees them in its pod.
 * config is the agent's adapter config as Paperclip hands it to a run or
 * to listSkills: the library in paperclipRuntimeSkills, the agent's choice
 * in paperclipSkillSync (Paperclip's operational skill always enabled, as
 * for its local adapters).
 */
export async function planSkills(config: Record<string, unknown>, companyId: string, home: RunHome): Promise<SkillPlan> {
  // Only the library Paperclip passes: without one, adapter-utils would
  // look for skills beside this package's own files.
  const library = Array.isArray(config.paperclipRuntimeSkills) ? await readPaperclipRuntimeSkillEntries(config, "/nonexistent") : [];
  const skillsDir = mountedSkillsDir(companyId, home, home.sharedVolume);
  const desired = resolveLegacyPaperclipDesiredSkillNames(config, library);
  const desiredSet = new Set(desired);
  const entries: PaperclipSkillEntry[] = [];
  const offered: PodSkill[] = [];
  const unavailable: SkillPlan["unavailable"] = [];
  for (const entry of library) {
    try {
      const skill = await podSkill(entry, skillsDir);
      entries.push(entry);
      if (desiredSet.has(entry.key)) offered.push(skill);
    } catch (err) {
      if (!(err instanceof Unreachable)) throw err;
      entries.push({ ...entry, sourceStatus: "missing", missingDetail: err.brief });
      if (desiredSet.has(entry.key)) unavailable.push({ key: entry.key, why: err.why });
    }
  }
  return { skillsDir, entries, desired, offered, unavailable };
}

/**
 * What the prompt says of the skills: Paperclip's manifest of the
 * company's library (what is enabled, what is installed but not enabled
 * for the agent, what is enabled but unavailable, and why), then where
 * each enabled skill's files are in the pod. "" when the library is empty.
 */
export function skillsPrompt(plan: SkillPlan): string {
  const manifest = buildSkillLibraryManifestMarkdown({ entries: plan.entries, desiredSkillKeys: new Set(plan.desired) }) ?? "";
  if (plan.offered.length === 0) return manifest;
  const lines = [...plan.offered]
    .sort((a, b) => a.key.localeCompare(b.key))
    .map((s) => {
      const desc = s.description ? ` — ${s.description}` : "";
      return `- ${oneLine(s.runtimeName, 200)} (${oneLine(s.key, 200)}): ${s.skillFile}${desc}`;
    });
  const files = [
    "## Your skills' files",
    "",
    "Each skill enabled for you is a directory, read-only at the path below. Before a task a skill",
    "covers, read its SKILL.md and follow it; resolve the files it names from its directory.",
    "",
    ...lines,
  ].join("\n");
  return joinPromptSections([manifest, files]);
}

/** The lines the run's log gets for skills the pod cannot read. */
export function skillWarnings(plan: SkillPlan): string[] {
  return plan.unavailable.map(
    (u) => `Warning: skill "${oneLine(u.key, 200)}" is enabled for this agent but its files are unavailable in the run's pod and it was not given to the agent: ${oneLine(u.why, 2000)}`,
  );
}

/**
 * listSkills and syncSkills: the agent's skills as its runs get them.
 * Paperclip keeps the agent's choice in its config itself; a run reads it
 * anew (mode "ephemeral", as for Paperclip's Claude adapter), so syncing
 * writes nothing.
 */
export async function skillSnapshot(adapterType: string, ctx: AdapterSkillContext, home: RunHome): Promise<AdapterSkillSnapshot> {
  const plan = await planSkills(ctx.config ?? {}, ctx.companyId, home);
  return buildRuntimeMountedSkillSnapshot({
    adapterType,
    availableEntries: plan.entries,
    desiredSkills: plan.desired,
    mode: "ephemeral",
    configuredDetail: (e) => `Named to the agent in the prompt of each run; read-only in its pod at ${posix.resolve(e.source)}.`,
    missingDetail: "Paperclip cannot find this skill in the company's skills directory.",
    warnings: plan.skillsDir
      ? []
      : ["The run's pod mounts no skills directory: the server's home is not on the volume the pods share, so no skill reaches the agent."],
  });
}
