#!/usr/bin/env node
// clipjob-paperclip-register: registers this package's adapter types
// (claude_k8s, opencode_k8s) with the Paperclip server, before it starts.
//
// Paperclip loads external adapters at every start from the records its
// adapter manager keeps in $PAPERCLIP_HOME/adapter-plugins.json; the
// record written here is the one `POST /api/adapters/install` writes for
// a package on a local path. In an image the home is the volume mounted
// at start (/paperclip), so nothing written there at build time survives:
// run this at every start, in the image's entrypoint or an init container
// (docs/paperclip.md). It changes only its own types' records.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { CLAUDE_ADAPTER, OPENCODE_ADAPTER } from "./definitions.js";

/** One entry of adapter-plugins.json, as Paperclip's adapter manager writes it. */
export interface AdapterRecord {
  packageName: string;
  localPath?: string;
  version?: string;
  type: string;
  installedAt?: string;
  [key: string]: unknown;
}

/** The file Paperclip keeps its external adapters' records in. */
export const STORE_FILE = "adapter-plugins.json";

/**
 * Paperclip's home as its server resolves it (@paperclipai/shared
 * home-paths): PAPERCLIP_HOME (a leading ~ is the user's home), else
 * ~/.paperclip.
 */
export function paperclipHome(env: NodeJS.ProcessEnv = process.env): string {
  const raw = env.PAPERCLIP_HOME?.trim();
  if (!raw) return path.resolve(os.homedir(), ".paperclip");
  if (raw === "~") return os.homedir();
  if (raw.startsWith("~/")) return path.resolve(os.homedir(), raw.slice(2));
  return path.resolve(raw);
}

/** This package's root: dist/src/register.js is two levels below it. */
export function packageRoot(): string {
  return path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
}

/**
 * The records of this package's adapter types: Paperclip loads one type per
 * package directory, so OpenCode's is the package's opencode/ directory.
 */
export function recordsFor(root: string, installedAt: string): AdapterRecord[] {
  const pkg = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf-8")) as { version?: string };
  return [
    { def: CLAUDE_ADAPTER, dir: root },
    { def: OPENCODE_ADAPTER, dir: path.join(root, "opencode") },
  ].map(({ def, dir }) => ({ packageName: dir, localPath: dir, version: pkg.version, type: def.type, installedAt }));
}

/**
 * Adds or replaces this package's records in home's adapter-plugins.json,
 * leaving every other record as it is. A record already naming the same
 * directory and version is kept (its installedAt too): registering at every
 * start writes nothing once registered. Returns the types it (re)wrote.
 */
export function registerAdapters(home: string, root: string, now: Date = new Date()): string[] {
  const file = path.join(home, STORE_FILE);
  let records: AdapterRecord[] = [];
  let raw: string | undefined;
  try {
    raw = fs.readFileSync(file, "utf-8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  if (raw !== undefined) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch (err) {
      parsed = err;
    }
    // Paperclip reads a broken file as no records and would load no
    // external adapter; rewriting it would drop what it held.
    if (!Array.isArray(parsed)) {
      throw new Error(`${file} is not a JSON array of adapter records, so Paperclip would load no external adapter from it: fix it, or remove it to start with only clipjob's adapters`);
    }
    records = parsed as AdapterRecord[];
  }
  const changed: string[] = [];
  for (const rec of recordsFor(root, now.toISOString())) {
    const i = records.findIndex((r) => r?.type === rec.type);
    const old = i >= 0 ? records[i] : undefined;
    if (old && old.packageName === rec.packageName && old.localPath === rec.localPath && old.version === rec.version) continue;
    if (i >= 0) records[i] = rec;
    else records.push(rec);
    changed.push(rec.type);
  }
  if (changed.length > 0) {
    fs.mkdirSync(home, { recursive: true });
    // Whole or not at all: the server may start right after.
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify(records, null, 2), "utf-8");
    fs.renameSync(tmp, file);
  }
  return changed;
}

function main(): void {
  const home = paperclipHome();
  const root = packageRoot();
  const changed = registerAdapters(home, root);
  const types = [CLAUDE_ADAPTER.type, OPENCODE_ADAPTER.type];
  console.log(changed.length > 0
    ? `clipjob: registered ${changed.join(", ")} from ${root} in ${path.join(home, STORE_FILE)}`
    : `clipjob: ${types.join(", ")} already registered from ${root} in ${path.join(home, STORE_FILE)}`);
}

// Run when executed (the bin, a symlink to this file), not when imported.
if (process.argv[1] && fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  try {
    main();
  } catch (err) {
    console.error(`clipjob-paperclip-register: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  }
}
