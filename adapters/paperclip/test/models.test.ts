import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import { createClipjobAdapter, CLAUDE_ADAPTER, OPENCODE_ADAPTER } from "../src/adapter.js";
import { builtinModels, CLAUDE_MODELS } from "../src/models.js";

describe("models", () => {
  const dir = mkdtempSync(join(tmpdir(), "clipjob-models-"));
  after(() => rmSync(dir, { recursive: true, force: true }));
  // A server whose entry point can resolve a built-in adapter package.
  const entry = join(dir, "server.js");
  writeFileSync(entry, "");
  const pkg = join(dir, "node_modules", "@paperclipai", "adapter-claude-local");
  mkdirSync(pkg, { recursive: true });
  writeFileSync(join(pkg, "package.json"), JSON.stringify({ name: "@paperclipai/adapter-claude-local", type: "module", main: "index.js" }));
  writeFileSync(join(pkg, "index.js"), 'export const models = [{ id: "claude-next", label: "Claude Next" }, { id: 3 }];\n');

  it("follows the server's own built-in adapter's list", async () => {
    assert.deepEqual(await builtinModels("@paperclipai/adapter-claude-local", CLAUDE_MODELS, entry), [{ id: "claude-next", label: "Claude Next" }]);
  });

  it("falls back to the copy when the server has no such package", async () => {
    assert.equal(await builtinModels("@paperclipai/adapter-nope", CLAUDE_MODELS, entry), CLAUDE_MODELS);
    assert.equal(await builtinModels("@paperclipai/adapter-claude-local", CLAUDE_MODELS, ""), CLAUDE_MODELS);
  });

  it("each adapter type lists its CLI's models", async () => {
    const claude = createClipjobAdapter(CLAUDE_ADAPTER);
    const opencode = createClipjobAdapter(OPENCODE_ADAPTER);
    assert.equal(claude.models?.length, 11);
    assert.ok(claude.models?.some((m) => m.id === "claude-opus-5"));
    assert.ok(opencode.models?.some((m) => m.id === "openai/gpt-5.2-codex"));
    assert.equal(typeof claude.listModels, "function");
  });
});
