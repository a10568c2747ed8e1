import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { RelayRun } from "../src/relay.js";
import { MAX_RUN_COST_USD, MAX_RUN_TOKENS, MAX_SUMMARY_CHARS, toExecutionResult } from "../src/result.js";

function run(over: Partial<RelayRun>): RelayRun {
  return { id: "run-1", namespace: "paperclip", job: "pc-run-1", phase: "Succeeded", done: true, lastSeq: 3, ...over };
}

const claudeRaw = { type: "result", subtype: "success", is_error: false, result: "fixed it", session_id: "sess-new", total_cost_usd: 0.0123 };

describe("toExecutionResult", () => {
  it("succeeded: session, usage, cost, summary and model, no error", () => {
    const r = toExecutionResult(
      run({
        exitCode: 0,
        result: {
          format: "claude-stream-json",
          outcome: "succeeded",
          sessionId: "sess-new",
          model: "claude-sonnet-4-5",
          subtype: "success",
          text: "fixed it",
          usage: { inputTokens: 100, outputTokens: 50, cacheReadInputTokens: 20, cacheCreationInputTokens: 5 },
          costUsd: 0.0123,
          raw: claudeRaw,
        },
      }),
      null,
      { workingDir: "/paperclip/wt/1", job: "paperclip/pc-run-1" },
    );
    assert.equal(r.exitCode, 0);
    assert.equal(r.timedOut, false);
    assert.equal(r.signal, null);
    assert.equal(r.errorCode, null);
    assert.equal(r.errorMessage, null);
    assert.deepEqual(r.usage, { inputTokens: 100, outputTokens: 50, cachedInputTokens: 20 });
    assert.equal(r.usageBasis, "per_run");
    assert.equal(r.costUsd, 0.0123);
    assert.equal(r.summary, "fixed it");
    assert.equal(r.model, "claude-sonnet-4-5");
    assert.equal(r.provider, "anthropic");
    assert.equal(r.sessionId, "sess-new");
    assert.equal(r.sessionDisplayId, "sess-new");
    assert.deepEqual(r.sessionParams, { sessionId: "sess-new", cwd: "/paperclip/wt/1" });
    assert.equal(r.clearSession, undefined);
    assert.equal((r.resultJson?.raw as Record<string, unknown>).result, "fixed it", "the raw result event is kept");
    assert.equal((r.resultJson?.clipjob as Record<string, unknown>).job, "paperclip/pc-run-1");
  });

  it("succeeded with an empty response is a success, marked so", () => {
    const r = toExecutionResult(run({ exitCode: 0, result: { outcome: "succeeded", emptyResponse: true } }), null);
    assert.equal(r.errorCode, null);
    assert.equal(r.summary, null);
    assert.equal((r.resultJson?.clipjob as Record<string, unknown>).emptyResponse, true);
  });

  it("timed_out: timedOut and the timeout code", () => {
    const r = toExecutionResult(run({ phase: "Failed", exitCode: 143, reason: "DeadlineExceeded", result: { outcome: "timed_out", truncated: true } }), null);
    assert.equal(r.timedOut, true);
    assert.equal(r.errorCode, "timeout");
    assert.match(r.errorMessage ?? "", /deadline/);
  });

  it("killed: the signal from the exit code, Claude's truncated code", () => {
    const r = toExecutionResult(
      run({
        phase: "Failed",
        exitCode: 137,
        reason: "OOMKilled",
        result: { format: "claude-stream-json", outcome: "killed", truncated: true, reason: "exit 137 (OOMKilled): likely out of memory" },
      }),
      null,
    );
    assert.equal(r.exitCode, 137);
    assert.equal(r.signal, "SIGKILL");
    assert.equal(r.timedOut, false);
    assert.equal(r.errorCode, "claude_truncated");
    assert.match(r.errorMessage ?? "", /out of memory/);
  });

  it("killed OpenCode (or any other agent) is job_failed, SIGTERM for 143", () => {
    const r = toExecutionResult(run({ phase: "Failed", exitCode: 143, result: { format: "opencode-json", outcome: "killed", truncated: true } }), null);
    assert.equal(r.signal, "SIGTERM");
    assert.equal(r.errorCode, "job_failed");
  });

  it("failed with the agent's own errors: its words, no code", () => {
    const r = toExecutionResult(
      run({
        phase: "Failed",
        exitCode: 1,
        result: { format: "claude-stream-json", outcome: "failed", isError: true, subtype: "error_during_execution", errors: ["API Error: 529 overloaded"] },
      }),
      null,
    );
    assert.equal(r.exitCode, 1);
    assert.equal(r.errorCode, null);
    assert.equal(r.errorMessage, "API Error: 529 overloaded");
  });

  it("failed without a result: truncated", () => {
    const r = toExecutionResult(run({ phase: "Failed", exitCode: 2, result: { format: "claude-stream-json", outcome: "failed", truncated: true } }), null);
    assert.equal(r.errorCode, "claude_truncated");
  });

  it("failed with plain output and no result: the exit code", () => {
    const r = toExecutionResult(run({ phase: "Failed", exitCode: 3, reason: "Error", result: { outcome: "failed" } }), null);
    assert.equal(r.errorCode, null);
    assert.match(r.errorMessage ?? "", /exited with code 3/);
  });

  it("session unavailable: clears the session, with its code", () => {
    const r = toExecutionResult(
      run({ phase: "Failed", exitCode: 1, result: { outcome: "failed", sessionUnavailable: true, errors: ["No conversation found with session ID: sess-old"] } }),
      null,
      { resumedSessionId: "sess-old" },
    );
    assert.equal(r.clearSession, true);
    assert.equal(r.errorCode, "session_unavailable");
    assert.match(r.errorMessage ?? "", /No conversation found/);
  });

  it("Claude's turn limit clears the session", () => {
    const r = toExecutionResult(run({ exitCode: 1, phase: "Failed", result: { outcome: "failed", subtype: "error_max_turns", isError: true } }), null);
    assert.equal(r.clearSession, true);
  });

  it("OpenCode: provider from the model, summed usage", () => {
    const r = toExecutionResult(
      run({ exitCode: 0, result: { format: "opencode-json", outcome: "succeeded", sessionId: "ses_1", text: "ok", usage: { inputTokens: 10, outputTokens: 7 }, costUsd: 0.5 } }),
      null,
      { configuredModel: "openrouter/anthropic/claude-sonnet-4-5" },
    );
    assert.equal(r.model, "openrouter/anthropic/claude-sonnet-4-5");
    assert.equal(r.provider, "openrouter");
    assert.deepEqual(r.usage, { inputTokens: 10, outputTokens: 7 });
    assert.equal(r.sessionId, "ses_1");
  });

  it("uses the log's end event when the run record could not be read", () => {
    const r = toExecutionResult(null, { phase: "Succeeded", exitCode: 0, lastSeq: 4, result: { outcome: "succeeded", text: "from end" } });
    assert.equal(r.exitCode, 0);
    assert.equal(r.summary, "from end");
    assert.equal(r.errorCode, null);
  });

  it("keeps the resumed session when the log names none", () => {
    const r = toExecutionResult(run({ exitCode: 0, result: { outcome: "succeeded", text: "x" } }), null, { resumedSessionId: "sess-old" });
    assert.equal(r.sessionId, "sess-old");
  });

  // Hostile review: the agent prints its result; it must not steer what
  // Paperclip reads in resultJson, nor credit its budget.
  it("an agent's result cannot set Paperclip's own resultJson keys or negative amounts", () => {
    const r = toExecutionResult(
      run({
        exitCode: 0,
        result: {
          outcome: "succeeded",
          text: "x",
          costUsd: -1000,
          usage: { inputTokens: -5e9, outputTokens: Number.NaN, cacheReadInputTokens: -1 },
          raw: { executionCancellation: { state: "acknowledged" }, clipjob: { job: "forged" }, result: "x" },
        },
      }),
      null,
      { job: "paperclip/pc-run-1" },
    );
    assert.equal(r.resultJson?.executionCancellation, undefined);
    assert.equal((r.resultJson?.clipjob as Record<string, unknown>).job, "paperclip/pc-run-1");
    assert.deepEqual((r.resultJson?.raw as Record<string, unknown>).executionCancellation, { state: "acknowledged" }, "kept, under raw");
    assert.equal(r.costUsd, 0);
    assert.deepEqual(r.usage, { inputTokens: 0, outputTokens: 0 });
  });

  it("a summary is bounded (the whole text stays in the relay)", () => {
    const r = toExecutionResult(run({ exitCode: 0, result: { outcome: "succeeded", text: "x".repeat(MAX_SUMMARY_CHARS + 10) } }), null);
    assert.ok((r.summary ?? "").startsWith("x".repeat(MAX_SUMMARY_CHARS)));
    assert.match(r.summary ?? "", /cut at 65536 characters/);
  });

  it("an absurd cost or token count is bounded", () => {
    const r = toExecutionResult(
      run({ exitCode: 0, result: { outcome: "succeeded", text: "x", costUsd: 1e300, usage: { inputTokens: 1e300, outputTokens: 5, cacheReadInputTokens: 1e20 } } }),
      null,
    );
    assert.equal(r.costUsd, MAX_RUN_COST_USD);
    assert.deepEqual(r.usage, { inputTokens: MAX_RUN_TOKENS, outputTokens: 5, cachedInputTokens: MAX_RUN_TOKENS });
  });
});
