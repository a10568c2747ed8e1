import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, it } from "node:test";

import { packageRoot, paperclipHome, registerAdapters, STORE_FILE, type AdapterRecord } from "../src/register.js";

function tempHome(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), "clipjob-register-"));
}

function read(home: string): AdapterRecord[] {
  return JSON.parse(fs.readFileSync(path.join(home, STORE_FILE), "utf-8")) as AdapterRecord[];
}

const root = packageRoot();
const version = (JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf-8")) as { version: string }).version;

describe("registerAdapters", () => {
  it("records both types as Paperclip's install of a local path does, one package directory each", () => {
    const home = tempHome();
    assert.deepEqual(registerAdapters(home, root, new Date("2026-11-28T00:00:00Z")), ["claude_k8s", "opencode_k8s"]);
    assert.deepEqual(read(home), [
      { packageName: root, localPath: root, version, type: "claude_k8s", installedAt: "2026-11-28T00:00:00.000Z" },
      { packageName: path.join(root, "opencode"), localPath: path.join(root, "opencode"), version, type: "opencode_k8s", installedAt: "2026-11-28T00:00:00.000Z" },
    ]);
    // Each directory is one Paperclip loads: a package.json whose entry exists.
    for (const r of read(home)) {
      const pkg = JSON.parse(fs.readFileSync(path.join(r.localPath!, "package.json"), "utf-8")) as { main?: string };
      assert.ok(pkg.main, `${r.localPath}/package.json names no entry`);
    }
  });

  it("writes nothing at a later start, and keeps every other adapter's record", () => {
    const home = tempHome();
    const other = { packageName: "@acme/hermes-adapter", version: "1.2.3", type: "hermes_local", installedAt: "2026-01-01T00:00:00.000Z" };
    fs.writeFileSync(path.join(home, STORE_FILE), JSON.stringify([other]));
    registerAdapters(home, root, new Date("2026-11-28T00:00:00Z"));
    const first = fs.readFileSync(path.join(home, STORE_FILE), "utf-8");
    assert.deepEqual(registerAdapters(home, root, new Date("2026-11-29T00:00:00Z")), []);
    assert.equal(fs.readFileSync(path.join(home, STORE_FILE), "utf-8"), first);
    assert.deepEqual(read(home)[0], other);
    assert.deepEqual(read(home).map((r) => r.type), ["hermes_local", "claude_k8s", "opencode_k8s"]);
  });

  it("replaces its own type's record that names another directory (an install elsewhere, an older version)", () => {
    const home = tempHome();
    fs.writeFileSync(path.join(home, STORE_FILE), JSON.stringify([
      { packageName: "/old/adapter", localPath: "/old/adapter", version: "0.0.9", type: "claude_k8s" },
    ]));
    assert.deepEqual(registerAdapters(home, root), ["claude_k8s", "opencode_k8s"]);
    assert.deepEqual(read(home).map((r) => [r.type, r.localPath]), [["claude_k8s", root], ["opencode_k8s", path.join(root, "opencode")]]);
  });

  it("refuses a store that is not a JSON array, naming it, and leaves it as it is", () => {
    const home = tempHome();
    const file = path.join(home, STORE_FILE);
    fs.writeFileSync(file, "{not json");
    assert.throws(() => registerAdapters(home, root), (err: Error) => err.message.includes(file) && err.message.includes("fix it, or remove it"));
    assert.equal(fs.readFileSync(file, "utf-8"), "{not json");
  });
});

describe("paperclipHome", () => {
  it("is PAPERCLIP_HOME, with ~ the user's home, else ~/.paperclip, as Paperclip resolves it", () => {
    assert.equal(paperclipHome({ PAPERCLIP_HOME: "/paperclip" }), "/paperclip");
    assert.equal(paperclipHome({ PAPERCLIP_HOME: "~/pc" }), path.join(os.homedir(), "pc"));
    assert.equal(paperclipHome({}), path.join(os.homedir(), ".paperclip"));
  });
});

describe("clipjob-paperclip-register", () => {
  it("registers into PAPERCLIP_HOME when run as the package's bin, through a symlink as npm installs it", () => {
    const home = tempHome();
    const bin = path.join(tempHome(), "clipjob-paperclip-register");
    fs.symlinkSync(path.join(root, "dist", "src", "register.js"), bin);
    const out = execFileSync(process.execPath, [bin], { env: { ...process.env, PAPERCLIP_HOME: home }, encoding: "utf-8" });
    assert.match(out, /registered claude_k8s, opencode_k8s/);
    assert.deepEqual(read(home).map((r) => r.type), ["claude_k8s", "opencode_k8s"]);
  });
});
