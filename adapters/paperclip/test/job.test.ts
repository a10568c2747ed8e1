import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  ANNOTATION_ENV_SECRET,
  ANNOTATION_MAX_TURNS,
  ANNOTATION_MODEL,
  ANNOTATION_PROMPT,
  ANNOTATION_PROMPT_SECRET,
  ANNOTATION_WORKING_DIR,
  LABEL_ADAPTER_TYPE,
  LABEL_AGENT_ID,
  LABEL_COMPANY_ID,
  LABEL_RUN_ID,
  LABEL_SESSION_ID,
  LABEL_TASK_ID,
} from "../src/contract.js";
import { buildRunObjects, isLabelValue, jobNameFor, retryJobName, RunIdentityError, type BuildRunInput } from "../src/job.js";

const base: BuildRunInput = {
  identity: { agentId: "agent-7f3a", runId: "01JD8XRUN", companyId: "company-1", taskId: "task-9" },
  namespace: "paperclip",
  profile: "claude_local",
  prompt: "Fix the failing test in pkg/foo.",
  env: { PAPERCLIP_API_KEY: "run-token", PAPERCLIP_WAKE_REASON: "issue_assigned" },
  promptAnnotationMaxBytes: 64,
};

describe("buildRunObjects", () => {
  it("labels the Job with the contract's labels and no pod spec", () => {
    const { job, jobName } = buildRunObjects({ ...base, sessionId: "sess-1" });
    assert.equal(job.apiVersion, "batch/v1");
    assert.equal(job.kind, "Job");
    assert.equal(job.metadata?.name, jobName);
    assert.equal(job.metadata?.namespace, "paperclip");
    assert.deepEqual(job.metadata?.labels, {
      [LABEL_AGENT_ID]: "agent-7f3a",
      [LABEL_RUN_ID]: "01JD8XRUN",
      [LABEL_ADAPTER_TYPE]: "claude_local",
      [LABEL_COMPANY_ID]: "company-1",
      [LABEL_TASK_ID]: "task-9",
      [LABEL_SESSION_ID]: "sess-1",
    });
    // Bare: clipjob adds containers, image, volumes and security context.
    assert.equal(job.spec?.template.spec, undefined);
    assert.deepEqual(Object.keys(job.spec ?? {}), ["template"]);
    assert.doesNotMatch(JSON.stringify(job), /image|containers|volumes|securityContext/);
  });

  it("carries the run's options as annotations", () => {
    const { job } = buildRunObjects({ ...base, model: "claude-sonnet-4-5", maxTurns: 12, workingDir: "/paperclip/worktrees/run-1" });
    assert.deepEqual(job.metadata?.annotations, {
      [ANNOTATION_ENV_SECRET]: `${job.metadata?.name}-env`,
      [ANNOTATION_MODEL]: "claude-sonnet-4-5",
      [ANNOTATION_MAX_TURNS]: "12",
      [ANNOTATION_WORKING_DIR]: "/paperclip/worktrees/run-1",
    });
  });

  it("puts a small prompt in the pod-template annotation", () => {
    const r = buildRunObjects(base);
    assert.equal(r.promptDelivery, "annotation");
    assert.deepEqual(r.job.spec?.template.metadata?.annotations, { [ANNOTATION_PROMPT]: base.prompt });
    assert.equal(r.promptSecret, null);
  });

  it("puts a prompt over the threshold in a Secret labeled for the run", () => {
    const prompt = "é".repeat(40); // 80 bytes in UTF-8, 40 characters: the limit is in bytes
    const r = buildRunObjects({ ...base, prompt });
    assert.equal(r.promptDelivery, "secret");
    assert.deepEqual(r.job.spec?.template.metadata?.annotations, { [ANNOTATION_PROMPT_SECRET]: `${r.jobName}-prompt` });
    assert.equal(r.promptSecret?.metadata?.name, `${r.jobName}-prompt`);
    assert.deepEqual(r.promptSecret?.stringData, { prompt });
    assert.deepEqual(r.promptSecret?.metadata?.labels, { [LABEL_AGENT_ID]: "agent-7f3a", [LABEL_RUN_ID]: "01JD8XRUN" });
  });

  it("a prompt exactly at the threshold stays an annotation", () => {
    assert.equal(buildRunObjects({ ...base, prompt: "x".repeat(64) }).promptDelivery, "annotation");
    assert.equal(buildRunObjects({ ...base, prompt: "x".repeat(65) }).promptDelivery, "secret");
  });

  it("makes the env Secret with the run's labels, equal to the Job's", () => {
    const r = buildRunObjects(base);
    const labels = r.job.metadata?.labels ?? {};
    assert.equal(r.envSecret?.metadata?.name, r.job.metadata?.annotations?.[ANNOTATION_ENV_SECRET]);
    assert.equal(r.envSecret?.metadata?.namespace, "paperclip");
    assert.equal(r.envSecret?.metadata?.labels?.[LABEL_RUN_ID], labels[LABEL_RUN_ID]);
    assert.equal(r.envSecret?.metadata?.labels?.[LABEL_AGENT_ID], labels[LABEL_AGENT_ID]);
    assert.deepEqual(r.envSecret?.stringData, base.env);
  });

  it("makes no env Secret when the run has no env", () => {
    const r = buildRunObjects({ ...base, env: {} });
    assert.equal(r.envSecret, null);
    assert.equal(r.job.metadata?.annotations?.[ANNOTATION_ENV_SECRET], undefined);
  });

  it("refuses an agent or run id that cannot be a label value", () => {
    assert.throws(() => buildRunObjects({ ...base, identity: { ...base.identity, agentId: "" } }), RunIdentityError);
    assert.throws(() => buildRunObjects({ ...base, identity: { ...base.identity, runId: "run with spaces" } }), RunIdentityError);
    assert.throws(() => buildRunObjects({ ...base, identity: { ...base.identity, runId: "r".repeat(64) } }), RunIdentityError);
  });

  it("leaves off optional ids that cannot be labels, saying so", () => {
    const r = buildRunObjects({ ...base, identity: { ...base.identity, taskId: "task/with/slashes" }, sessionId: "-bad-" });
    assert.equal(r.job.metadata?.labels?.[LABEL_TASK_ID], undefined);
    assert.equal(r.job.metadata?.labels?.[LABEL_SESSION_ID], undefined);
    assert.equal(r.notes.length, 2);
  });

  it("leaves out a working directory clipjob would refuse", () => {
    for (const dir of ["/home/node/work", "/paperclip/../etc", "relative/dir", "/paperclip//x"]) {
      const r = buildRunObjects({ ...base, workingDir: dir });
      assert.equal(r.job.metadata?.annotations?.[ANNOTATION_WORKING_DIR], undefined, dir);
      assert.equal(r.notes.length, 1, dir);
    }
    assert.equal(buildRunObjects({ ...base, workingDir: "/paperclip" }).job.metadata?.annotations?.[ANNOTATION_WORKING_DIR], "/paperclip");
  });

  it("sets the deadline and TTL only when configured", () => {
    assert.equal(buildRunObjects(base).job.spec?.activeDeadlineSeconds, undefined);
    const r = buildRunObjects({ ...base, timeoutSec: 3600, ttlSecondsAfterFinished: 60 });
    assert.equal(r.job.spec?.activeDeadlineSeconds, 3600);
    assert.equal(r.job.spec?.ttlSecondsAfterFinished, 60);
  });
});

describe("job names", () => {
  it("are stable per run, DNS-1123 and at most 63 characters", () => {
    const long = { agentId: "a", runId: "R".repeat(63) };
    for (const id of [base.identity, long, { agentId: "a", runId: "___" }]) {
      const name = jobNameFor(id);
      assert.equal(name, jobNameFor(id));
      assert.ok(name.length <= 63, name);
      assert.match(name, /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/);
    }
    assert.notEqual(jobNameFor({ agentId: "a", runId: "x" }), jobNameFor({ agentId: "b", runId: "x" }));
  });

  it("a retry name stays within 63 characters", () => {
    const name = retryJobName(jobNameFor({ agentId: "a", runId: "R".repeat(63) }), "abc123");
    assert.ok(name.length <= 63);
    assert.match(name, /-abc123$/);
  });

  it("isLabelValue follows Kubernetes' rule", () => {
    assert.ok(isLabelValue(""));
    assert.ok(isLabelValue("a.b_c-d"));
    assert.ok(!isLabelValue("-a"));
    assert.ok(!isLabelValue("a b"));
    assert.ok(!isLabelValue("x".repeat(64)));
  });
});
