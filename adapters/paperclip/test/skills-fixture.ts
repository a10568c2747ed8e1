// The server home the skills tests and the attacks on them share.

import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after } from "node:test";

import type { RunHome } from "../src/rundirs.js";

/**
 * A server home on a volume, as Paperclip's image keeps it: company c1's
 * skills under R/skills/c1, another company's beside them, the server's
 * .env in R, and a skill bundled in the server's install off the volume.
 */
export function layout() {
  const top = mkdtempSync(join(tmpdir(), "skills-"));
  const volume = join(top, "paperclip");
  const root = join(volume, "instances", "default");
  const skills = join(root, "skills", "c1");
  const skill = (dir: string, markdown: string) => {
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "SKILL.md"), markdown);
    return dir;
  };
  const deploy = skill(join(skills, "__runtime__", "deploy--1a2b"), "---\nname: deploy\ndescription: Ship a release to staging.\n---\n# Deploy\nRun make ship.\n");
  const review = skill(join(skills, "__runtime__", "review--3c4d"), "---\nname: review\ndescription: >\n  Review a pull\n  request.\n---\n");
  const otherCompany = skill(join(root, "skills", "c2", "secret--5e6f"), "---\ndescription: STOLEN other company's skill\n---\n");
  writeFileSync(join(root, ".env"), "PAPERCLIP_AGENT_JWT_SECRET=server-secret\n");
  mkdirSync(join(root, "secrets"), { recursive: true });
  writeFileSync(join(root, "secrets", "master.key"), "MASTER-KEY-BYTES\n");
  const bundled = skill(join(top, "server", "node_modules", "@paperclipai", "server", "skills", "paperclip"), "---\ndescription: The operational skill.\n---\n");
  const home: RunHome = { paperclipHome: volume, instance: "default", sharedVolume: volume };
  return { top, volume, root, skills, deploy, review, otherCompany, bundled, home, skill };
}

/** Directories the file's tests made, removed when it ends. */
export const made: string[] = [];
after(() => {
  for (const d of made) rmSync(d, { recursive: true, force: true });
});

export function entry(key: string, source: string, runtimeName = key.split("/").pop()!) {
  return { key, runtimeName, source, sourceStatus: "available" };
}

export function configWith(entries: unknown[], desired: string[]) {
  return { paperclipRuntimeSkills: entries, paperclipSkillSync: { desiredSkills: desired } };
}

