// The run's directories of Paperclip's home. With isolation on (clipjob's
// default) a run's pod mounts only these, each by subPath at the path the
// server sees it (docs/contract.md). kubelet would create a missing one
// itself, owned by root: the server could not write it afterwards, nor
// the agent its own home. So the adapter, which runs in the server as the
// server's user, makes them before it submits the Job.

import { lstat, mkdir } from "node:fs/promises";
import { homedir } from "node:os";
import { posix } from "node:path";

import { SHARED_VOLUME_PATH } from "./contract.js";

export interface RunDirsInput {
  /** The server's PAPERCLIP_HOME ($HOME/.paperclip without it). */
  paperclipHome: string;
  /** The server's PAPERCLIP_INSTANCE_ID ("default" without it). */
  instance: string;
  agentId: string;
  companyId: string;
}

/**
 * The directories a run of agentId in companyId mounts, as clipjob lays
 * them out: its workspace, its company's projects, its home (per agent, and
 * the company's for isolation mode Company), its instructions and its
 * company's skills.
 */
export function runDirs(i: RunDirsInput): string[] {
  const root = posix.join(i.paperclipHome, "instances", i.instance);
  const company = posix.join(root, "companies", i.companyId);
  const agent = posix.join(company, "agents", i.agentId);
  return [
    posix.join(root, "workspaces", i.agentId),
    posix.join(root, "projects", i.companyId),
    posix.join(agent, "home"),
    posix.join(agent, "instructions"),
    posix.join(root, "skills", i.companyId),
    posix.join(company, "home"),
  ];
}

/**
 * The directories a run's pod mounts when the server's home is on the
 * shared volume (clipjob then mounts only these), else undefined.
 */
export function mountedRunDirs(agentId: string, companyId: string, home = serverHome(), sharedVolume = SHARED_VOLUME_PATH): string[] | undefined {
  if (!onVolume(home.paperclipHome, sharedVolume) || !companyId) return undefined;
  return runDirs({ ...home, agentId, companyId });
}

/**
 * The company's skills directory as a run's pod mounts it (read-only, at
 * the path the server sees it), when the server's home is on the shared
 * volume and the company id names one directory; else undefined.
 */
export function mountedSkillsDir(companyId: string, home = serverHome(), sharedVolume = SHARED_VOLUME_PATH): string | undefined {
  if (!SEGMENT.test(companyId) || companyId === "." || companyId === "..") return undefined;
  if (!onVolume(home.paperclipHome, sharedVolume)) return undefined;
  return posix.join(home.paperclipHome, "instances", home.instance, "skills", companyId);
}

function onVolume(paperclipHome: string, sharedVolume: string): boolean {
  return paperclipHome === sharedVolume || paperclipHome.startsWith(`${sharedVolume}/`);
}

/** The server's own home and instance, as Paperclip resolves them. */
export function serverHome(env: NodeJS.ProcessEnv = process.env): { paperclipHome: string; instance: string } {
  return {
    paperclipHome: env.PAPERCLIP_HOME?.trim() || posix.join(homedir(), ".paperclip"),
    instance: env.PAPERCLIP_INSTANCE_ID?.trim() || "default",
  };
}

/** Where the server's home is, and the volume the pods share (mounted at the same path in pods). */
export interface RunHome {
  paperclipHome: string;
  instance: string;
  sharedVolume: string;
}

/** A run directory (or a directory above it) that is not a plain directory. */
export class RunDirsError extends Error {}

/** What ensureRunDirs needs of the file system. */
export interface DirFs {
  lstat(path: string): Promise<{ isDirectory(): boolean; isSymbolicLink(): boolean }>;
  mkdir(path: string): Promise<unknown>;
}

const nodeFs: DirFs = { lstat, mkdir: (p) => mkdir(p) };

/** Ids that name one directory: what clipjob accepts (a label value is one). */
const SEGMENT = /^[A-Za-z0-9._-]{1,253}$/;

/**
 * Makes the run's directories when the server's home is on the volume the
 * pods share (else they are not the server's to make, and clipjob mounts
 * its own layout there), one level at a time from the volume's root.
 * kubelet follows a symbolic link in a mount's subPath (inside the volume):
 * one planted on the way to a run's directory — by any pod that mounted
 * the whole volume, before isolation or under isolation mode Shared —
 * would give the run another directory, or the volume's root. Such a run
 * is not submitted (RunDirsError, naming the link). The check holds at
 * submit only: kubelet resolves each subPath again at every container
 * start (a queued run's, hours later; a replaced pod's), and a link
 * planted in between is followed then (docs/security.md, "Links planted
 * while the volume was open"). Returns what the run's log should say:
 * nothing when all is well.
 */
export async function ensureRunDirs(
  i: Omit<RunDirsInput, "paperclipHome" | "instance">,
  home = serverHome(),
  sharedVolume = SHARED_VOLUME_PATH,
  fs: DirFs = nodeFs,
): Promise<string[]> {
  const dirs = mountedRunDirs(i.agentId, i.companyId, home, sharedVolume);
  if (!dirs) return [];
  for (const [what, id] of [["agent", i.agentId], ["company", i.companyId]] as const) {
    if (!SEGMENT.test(id) || id === "." || id === "..") {
      throw new RunDirsError(`the ${what} id ${JSON.stringify(id)} cannot name a directory (letters, digits, '.', '_' and '-')`);
    }
  }
  const notes: string[] = [];
  for (const dir of dirs) {
    let at = sharedVolume;
    for (const segment of posix.relative(sharedVolume, dir).split("/").filter(Boolean)) {
      at = posix.join(at, segment);
      let st: Awaited<ReturnType<DirFs["lstat"]>> | null = null;
      try {
        st = await fs.lstat(at);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOENT") {
          notes.push(`could not read ${at} (${(err as Error).message}); the node will make the run's directory ${dir}, owned by root`);
          break;
        }
        try {
          await fs.mkdir(at);
          st = await fs.lstat(at);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === "EEXIST") st = await fs.lstat(at);
          else {
            notes.push(`could not make the run's directory ${dir} (${(err as Error).message}); the node will make it, owned by root`);
            break;
          }
        }
      }
      if (st.isSymbolicLink() || !st.isDirectory()) {
        throw new RunDirsError(
          `${at} is ${st.isSymbolicLink() ? "a symbolic link" : "not a directory"}: the run's directory ${dir} would be wherever it leads (the node follows links in a mount's subPath); remove it (docs/migration.md)`,
        );
      }
    }
  }
  return notes;
}
