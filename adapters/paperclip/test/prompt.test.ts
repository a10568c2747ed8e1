import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { DEFAULT_RELAY_TOKEN_FILE, DEFAULT_RELAY_URL, defaultNamespace, parseEnv, resolveSettings } from "../src/config.js";
import { buildPrompt, buildRunEnv, sessionToResume } from "../src/prompt.js";

const agent = { id: "agent-1", companyId: "company-1", name: "Coder", adapterType: "claude_k8s", adapterConfig: {} };

describe("settings", () => {
  it("defaults", () => {
    const s = resolveSettings({}, { profile: "claude_local" }, () => {}, { POD_NAMESPACE: "paperclip" });
    assert.equal(s.namespace, "paperclip");
    assert.equal(s.profile, "claude_local");
    assert.equal(s.relayUrl, DEFAULT_RELAY_URL);
    assert.equal(s.relayTokenFile, DEFAULT_RELAY_TOKEN_FILE);
    assert.equal(s.reattach, true);
    assert.equal(s.deletePropagation, "Foreground");
    assert.equal(s.promptAnnotationMaxBytes, 64 * 1024);
  });

  it("reads every key, numbers and booleans given as strings too", () => {
    const s = resolveSettings(
      { namespace: "agents", profile: "my_profile", relayUrl: "https://relay:8090/", maxTurnsPerRun: "5", reattach: "false", deletePropagation: "Background", timeoutSec: 60 },
      { profile: "claude_local" },
    );
    assert.equal(s.namespace, "agents");
    assert.equal(s.profile, "my_profile");
    assert.equal(s.relayUrl, "https://relay:8090");
    assert.equal(s.maxTurnsPerRun, 5);
    assert.equal(s.reattach, false);
    assert.equal(s.deletePropagation, "Background");
    assert.equal(s.timeoutSec, 60);
  });

  it("the namespace: PAPERCLIP_NAMESPACE, POD_NAMESPACE, the ServiceAccount's, default", () => {
    assert.equal(defaultNamespace({ PAPERCLIP_NAMESPACE: "a", POD_NAMESPACE: "b" }, () => "c"), "a");
    assert.equal(defaultNamespace({ POD_NAMESPACE: "b" }, () => "c"), "b");
    assert.equal(defaultNamespace({}, () => "c"), "c");
    assert.equal(defaultNamespace({}, () => ""), "default");
  });

  it("env: strings and plain bindings; others reported", () => {
    const warnings: string[] = [];
    const env = parseEnv({ A: "1", B: { type: "plain", value: "2" }, C: { type: "secret_ref", secretId: "x" }, "bad name": "3" }, (w) => warnings.push(w));
    assert.deepEqual(env, { A: "1", B: "2" });
    assert.equal(warnings.length, 2);
  });
});

describe("run env", () => {
  it("carries the callback token, the wake and the workspace; config env wins, but not over an explicit key", () => {
    const env = buildRunEnv(
      {
        authToken: "tok",
        context: {
          taskId: "task-1",
          wakeReason: "issue_assigned",
          commentId: "c-1",
          issueIds: ["i-1", "i-2"],
          paperclipWorkspace: { cwd: "/paperclip/wt", repoUrl: "https://example.invalid/r.git" },
        },
      },
      { env: { EXTRA: "x" }, paperclipApiUrl: "http://paperclip.paperclip.svc:3100" },
    );
    assert.equal(env.PAPERCLIP_API_KEY, "tok");
    assert.equal(env.PAPERCLIP_TASK_ID, "task-1");
    assert.equal(env.PAPERCLIP_WAKE_REASON, "issue_assigned");
    assert.equal(env.PAPERCLIP_WAKE_COMMENT_ID, "c-1");
    assert.equal(env.PAPERCLIP_LINKED_ISSUE_IDS, "i-1,i-2");
    assert.equal(env.PAPERCLIP_WORKSPACE_CWD, "/paperclip/wt");
    assert.equal(env.PAPERCLIP_API_URL, "http://paperclip.paperclip.svc:3100");
    assert.equal(env.EXTRA, "x");
    assert.equal(buildRunEnv({ authToken: "tok", context: {} }, { env: { PAPERCLIP_API_KEY: "own" }, paperclipApiUrl: "" }).PAPERCLIP_API_KEY, "own");
  });
});

describe("prompt", () => {
  const settings = { instructionsFilePath: "", promptTemplate: "You are {{agent.name}} on run {{runId}}.", bootstrapPromptTemplate: "" };

  it("renders Paperclip's template with the run's data", async () => {
    const p = await buildPrompt({ agent, runId: "run-9", context: {} }, settings, false);
    assert.equal(p.prompt, "You are Coder on run run-9.");
    assert.equal(p.metrics.promptChars, p.prompt.length);
  });

  it("prepends the instructions file, read on the server", async () => {
    const p = await buildPrompt(
      { agent, runId: "run-9", context: {} },
      { ...settings, instructionsFilePath: "/paperclip/agents/a/AGENTS.md" },
      false,
      async () => "Be careful.",
    );
    assert.match(p.prompt, /^Be careful\.\n\nThe above agent instructions were loaded from \/paperclip\/agents\/a\/AGENTS\.md/);
    assert.match(p.prompt, /You are Coder/);
  });

  it("an unreadable instructions file is a note, not a failure", async () => {
    const p = await buildPrompt({ agent, runId: "r", context: {} }, { ...settings, instructionsFilePath: "/nope" }, false, async () => {
      throw new Error("ENOENT");
    });
    assert.equal(p.notes.length, 1);
    assert.equal(p.prompt, "You are Coder on run r.");
  });

  it("bootstrap only for a new session", async () => {
    const s = { ...settings, bootstrapPromptTemplate: "First time, {{agent.name}}." };
    assert.match((await buildPrompt({ agent, runId: "r", context: {} }, s, false)).prompt, /^First time, Coder\./);
    assert.doesNotMatch((await buildPrompt({ agent, runId: "r", context: {} }, s, true)).prompt, /First time/);
  });
});

describe("session to resume", () => {
  const runtime = (sessionParams: Record<string, unknown> | null, sessionId: string | null = null) => ({ sessionId, sessionParams, sessionDisplayId: null, taskKey: null });
  it("the stored session, in the same directory only", () => {
    assert.equal(sessionToResume(runtime({ sessionId: "s1", cwd: "/paperclip/a" }), "/paperclip/a/"), "s1");
    assert.equal(sessionToResume(runtime({ sessionId: "s1", cwd: "/paperclip/a" }), "/paperclip/b"), "");
    assert.equal(sessionToResume(runtime({ sessionId: "s1" }), "/paperclip/b"), "s1");
    assert.equal(sessionToResume(runtime(null, "legacy"), ""), "legacy");
    assert.equal(sessionToResume(runtime(null), ""), "");
  });
});
