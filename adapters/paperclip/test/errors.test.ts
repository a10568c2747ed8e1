import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { ApiException } from "@kubernetes/client-node";

import { BUSY_RETRY_AFTER_MS, classifyCreateError, createFailureResult, ErrorCodes, readKubeError, secretFailureResult } from "../src/errors.js";

/** An error as @kubernetes/client-node throws it: the Status as JSON text in `body`. */
function apiError(code: number, status: Record<string, unknown>): ApiException<string> {
  const body = JSON.stringify({ kind: "Status", apiVersion: "v1", status: "Failure", code, ...status });
  return new ApiException(code, `HTTP-Code: ${code}\nMessage: Unknown API Status Code!\nBody: ${body}`, body, {});
}

const busy = apiError(409, {
  reason: "Conflict",
  message:
    'admission webhook "vjob.clipjob.paperclip.io" denied the request: agent agent-7f3a already has an active run: Job paperclip/pc-run-1 (run run-1), since 2026-01-02T03:04:05Z',
  details: {
    causes: [
      { reason: "clipjob.paperclip.io/agent-busy", message: "agent agent-7f3a already has an active run" },
      { reason: "clipjob.paperclip.io/holder-job", message: "paperclip/pc-run-1" },
      { reason: "clipjob.paperclip.io/holder-run-id", message: "run-1" },
      { reason: "clipjob.paperclip.io/holder-since", message: "2026-01-02T03:04:05Z" },
    ],
  },
});

describe("create errors", () => {
  it("409 with cause agent-busy is a blocked run, holder read from the causes", () => {
    const f = classifyCreateError(busy);
    assert.equal(f.kind, "agent-busy");
    const before = Date.now();
    const r = createFailureResult(f, "paperclip/pc-run-2");
    assert.equal(r.errorCode, ErrorCodes.concurrentRunBlocked);
    assert.equal(r.errorCode, "k8s_concurrent_run_blocked");
    assert.equal(r.errorMeta?.holderRunId, "run-1");
    assert.equal(r.errorMeta?.holderJob, "paperclip/pc-run-1");
    assert.equal(r.errorMeta?.holderSince, "2026-01-02T03:04:05Z");
    assert.match(r.errorMessage ?? "", /run-1/);
    // In the terms Paperclip retries: nothing ran, the cause passes.
    assert.deepEqual(r.executionRecovery, { kind: "bootstrap", providerWorkStarted: false });
    assert.equal(r.errorFamily, "transient_upstream");
    assert.ok(Date.parse(r.retryNotBefore ?? "") >= before + BUSY_RETRY_AFTER_MS, r.retryNotBefore ?? "");
  });

  it("reads the causes, not the message", () => {
    // The same words without clipjob's causes are not clipjob's 409.
    const lookalike = apiError(409, { reason: "Conflict", message: "agent-busy clipjob.paperclip.io/agent-busy" });
    assert.equal(classifyCreateError(lookalike).kind, "refused");
  });

  it("409 with cause queue-full is blocked too, saying the queue is full", () => {
    const full = apiError(409, {
      reason: "Conflict",
      message: "admission webhook denied the request: agent a has 3 runs waiting (maxQueued 3)",
      details: { causes: [{ reason: "clipjob.paperclip.io/queue-full", message: "3 runs waiting" }] },
    });
    const f = classifyCreateError(full);
    assert.equal(f.kind, "queue-full");
    const r = createFailureResult(f, "ns/job");
    assert.equal(r.errorCode, "k8s_concurrent_run_blocked");
    assert.match(r.errorMessage ?? "", /queue is full/);
    assert.equal(r.errorMeta?.queueFull, true);
  });

  it("409 AlreadyExists is the API server's name clash", () => {
    const taken = apiError(409, { reason: "AlreadyExists", message: 'jobs.batch "pc-x" already exists', details: { name: "pc-x", kind: "jobs" } });
    assert.equal(classifyCreateError(taken).kind, "name-taken");
  });

  it("500 failed calling webhook is the guard-unreachable code", () => {
    const down = apiError(500, {
      reason: "InternalError",
      message:
        'Internal error occurred: failed calling webhook "mjob.clipjob.paperclip.io": failed to call webhook: Post "https://clipjob-webhook.clipjob-system.svc:443/mutate-batch-v1-job?timeout=10s": dial tcp 10.0.0.1:443: connect: connection refused',
    });
    const f = classifyCreateError(down);
    assert.equal(f.kind, "guard-unreachable");
    const r = createFailureResult(f, "ns/job");
    assert.equal(r.errorCode, "k8s_concurrency_guard_unreachable");
    assert.match(r.errorMessage ?? "", /connection refused/);
  });

  it("a 500 that is not a webhook call is a create failure", () => {
    assert.equal(classifyCreateError(apiError(500, { reason: "InternalError", message: "etcdserver: request timed out" })).kind, "refused");
  });

  for (const [code, reason, message] of [
    [403, "Forbidden", 'admission webhook "vjob.clipjob.paperclip.io" denied the request: metadata.annotations[paperclip.io/env-secret]: Forbidden: Secret run-2-env is labeled for run run-1'],
    [422, "Invalid", 'admission webhook "mjob.clipjob.paperclip.io" denied the request: metadata.annotations[paperclip.io/model]: Invalid value: "bad model"'],
    [503, "ServiceUnavailable", 'admission webhook "mjob.clipjob.paperclip.io" denied the request: source Deployment paperclip/paperclip not found'],
    [403, "Forbidden", 'jobs.batch is forbidden: User "system:serviceaccount:paperclip:paperclip" cannot create resource "jobs"'],
  ] as const) {
    it(`${code} ${reason} is a create failure carrying the message`, () => {
      const f = classifyCreateError(apiError(code, { reason, message }));
      assert.equal(f.kind, "refused");
      const r = createFailureResult(f, "ns/job");
      assert.equal(r.errorCode, "k8s_job_create_failed");
      assert.ok(r.errorMessage?.includes(message), r.errorMessage ?? "");
      assert.equal(r.errorMeta?.httpStatus, code);
    });
  }

  it("no answer at all is a create failure saying so", () => {
    const f = classifyCreateError(Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:6443"), { code: "ECONNREFUSED" }));
    assert.equal(f.kind, "unreachable");
    const r = createFailureResult(f, "ns/job");
    assert.equal(r.errorCode, "k8s_job_create_failed");
    assert.match(r.errorMessage ?? "", /did not answer.*ECONNREFUSED/);
  });

  it("reads a Status given as an object, and a body that is not JSON", () => {
    const e = readKubeError(Object.assign(new Error("x"), { code: 404, body: { message: "jobs.batch \"j\" not found", reason: "NotFound" } }));
    assert.equal(e.httpStatus, 404);
    assert.equal(e.status?.reason, "NotFound");
    const html = readKubeError(new ApiException(502, "HTTP-Code: 502", "<html>bad gateway</html>", {}));
    assert.equal(html.httpStatus, 502);
    assert.equal(html.status, null);
    assert.equal(html.message, "<html>bad gateway</html>");
  });

  it("names which Secret could not be created", () => {
    const r = secretFailureResult("prompt", "ns/run-prompt", apiError(422, { reason: "Invalid", message: "Secret \"run-prompt\" is invalid: data: Too long" }));
    assert.equal(r.errorCode, "k8s_prompt_secret_create_failed");
    assert.match(r.errorMessage ?? "", /Too long/);
    assert.equal(secretFailureResult("env", "ns/run-env", new Error("boom")).errorCode, "k8s_env_secret_create_failed");
  });
});
