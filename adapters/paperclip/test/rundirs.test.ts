import assert from "node:assert/strict";
import { mkdir, mkdtemp, stat, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { ensureRunDirs, runDirs, RunDirsError, serverHome } from "../src/rundirs.js";

describe("the run's directories", () => {
  it("are laid out as clipjob mounts them", () => {
    assert.deepEqual(runDirs({ paperclipHome: "/paperclip", instance: "default", agentId: "a1", companyId: "c1" }), [
      "/paperclip/instances/default/workspaces/a1",
      "/paperclip/instances/default/projects/c1",
      "/paperclip/instances/default/companies/c1/agents/a1/home",
      "/paperclip/instances/default/companies/c1/agents/a1/instructions",
      "/paperclip/instances/default/skills/c1",
      "/paperclip/instances/default/companies/c1/home",
    ]);
  });

  it("follow the server's PAPERCLIP_HOME and PAPERCLIP_INSTANCE_ID", () => {
    assert.deepEqual(serverHome({ PAPERCLIP_HOME: "/paperclip", PAPERCLIP_INSTANCE_ID: "staging" }), { paperclipHome: "/paperclip", instance: "staging" });
    assert.equal(serverHome({}).instance, "default");
  });

  it("are made when the server's home is on the shared volume", async () => {
    const volume = await mkdtemp(join(tmpdir(), "rundirs-"));
    const notes = await ensureRunDirs({ agentId: "a1", companyId: "c1" }, { paperclipHome: volume, instance: "default" }, volume);
    assert.deepEqual(notes, []);
    for (const dir of runDirs({ paperclipHome: volume, instance: "default", agentId: "a1", companyId: "c1" })) {
      assert.ok((await stat(dir)).isDirectory(), dir);
    }
  });

  it("are left alone when the server's home is elsewhere, or the run names no company", async () => {
    const made: string[] = [];
    const fs = {
      lstat: async () => {
        throw Object.assign(new Error("ENOENT"), { code: "ENOENT" });
      },
      mkdir: async (d: string) => made.push(d),
    };
    assert.deepEqual(await ensureRunDirs({ agentId: "a1", companyId: "c1" }, { paperclipHome: "/home/node/.paperclip", instance: "default" }, "/paperclip", fs), []);
    assert.deepEqual(await ensureRunDirs({ agentId: "a1", companyId: "" }, { paperclipHome: "/paperclip", instance: "default" }, "/paperclip", fs), []);
    assert.deepEqual(made, []);
  });

  it("say which one could not be made, and go on", async () => {
    const denied = Object.assign(new Error("EACCES: permission denied"), { code: "EACCES" });
    const missing = Object.assign(new Error("ENOENT"), { code: "ENOENT" });
    const notes = await ensureRunDirs({ agentId: "a1", companyId: "c1" }, { paperclipHome: "/paperclip", instance: "default" }, "/paperclip", {
      lstat: async () => {
        throw missing;
      },
      mkdir: async () => {
        throw denied;
      },
    });
    assert.equal(notes.length, 6);
    assert.match(notes[0], /could not make the run's directory \/paperclip\/instances\/default\/workspaces\/a1 \(EACCES/);
  });

  it("refuse a run whose directory, or one above it, is a link someone planted", async () => {
    const volume = await mkdtemp(join(tmpdir(), "rundirs-"));
    const agentDir = join(volume, "instances", "default", "companies", "c1", "agents", "a1");
    await mkdir(agentDir, { recursive: true });
    await symlink("../../../../..", join(agentDir, "home")); // the volume's root as the run's HOME
    await assert.rejects(
      ensureRunDirs({ agentId: "a1", companyId: "c1" }, { paperclipHome: volume, instance: "default" }, volume),
      (err: Error) => err instanceof RunDirsError && /agents\/a1\/home is a symbolic link/.test(err.message),
    );
    const other = await mkdtemp(join(tmpdir(), "rundirs-"));
    await mkdir(join(other, "instances", "default"), { recursive: true });
    await symlink(volume, join(other, "instances", "default", "skills")); // a link higher up
    await assert.rejects(
      ensureRunDirs({ agentId: "a1", companyId: "c1" }, { paperclipHome: other, instance: "default" }, other),
      /instances\/default\/skills is a symbolic link/,
    );
  });

  it("refuse ids that cannot name a directory", async () => {
    await assert.rejects(
      ensureRunDirs({ agentId: "a1", companyId: "../c2" }, { paperclipHome: "/paperclip", instance: "default" }, "/paperclip"),
      /company id "..\/c2" cannot name a directory/,
    );
  });
});
