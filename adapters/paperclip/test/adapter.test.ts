import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, beforeEach, describe, it } from "node:test";

import type { AdapterExecutionContext, AdapterInvocationMeta } from "@paperclipai/adapter-utils";
import type { V1Job } from "@kubernetes/client-node";

import { CLAUDE_ADAPTER, createClipjobAdapter, executeRun, type AdapterDeps } from "../src/adapter.js";
import { jobNameFor, retryJobName } from "../src/job.js";
import { RelayClient, type RelayRun } from "../src/relay.js";
import { deleteFollowedJobs, followedJobs, resetStopping, unwatchServerStop } from "../src/shutdown.js";
import { FakeKube, statusError } from "./fake-kube.js";
import { FakeRelay } from "./fake-relay.js";

interface Recorded {
  ctx: AdapterExecutionContext;
  stdout: string[];
  stderr: string[];
  meta: AdapterInvocationMeta[];
  spawns: number;
}

let relay: FakeRelay;
let tokenFile: string;
let kube: FakeKube;
let runCounter = 0;

/** The server's environment: where its credentials go. */
function serverEnv(over: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  return { CLIPJOB_NAMESPACE: "paperclip", CLIPJOB_RELAY_URL: relay.url, CLIPJOB_RELAY_TOKEN_FILE: tokenFile, ...over };
}

function deps(env: NodeJS.ProcessEnv = {}): AdapterDeps {
  return {
    kube: () => kube,
    relay: (s) => new RelayClient({ baseUrl: s.relayUrl, tokenFile: s.relayTokenFile }),
    follow: { initialBackoffMs: 10, maxBackoffMs: 50, unknownRunPollMs: 20, jobCheckEveryMs: 20, relayGraceMs: 300 },
    cancelPollMs: 10,
    releaseGraceMs: 300,
    env: serverEnv(env),
  };
}

/** The name the adapter gives the run's Job. */
/** Polls cond until it holds (10 s at most). */
async function waitFor(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 1000 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(cond(), "the condition never held");
}

function jobNameOf(rec: Recorded): string {
  return jobNameFor({ agentId: rec.ctx.agent.id, runId: rec.ctx.runId });
}

/** A Job as clipjob stores it when this server created it. */
function ours(job: V1Job): V1Job {
  return {
    ...job,
    metadata: { uid: randomUUID(), ...job.metadata, annotations: { ...job.metadata?.annotations, "clipjob.paperclip.io/created-by": kube.user } },
  };
}

function newCtx(over: Partial<AdapterExecutionContext> = {}, config: Record<string, unknown> = {}): Recorded {
  runCounter++;
  const rec: Recorded = { stdout: [], stderr: [], meta: [], spawns: 0, ctx: undefined as unknown as AdapterExecutionContext };
  rec.ctx = {
    runId: `run-${runCounter}`,
    agent: { id: `agent-${runCounter}`, companyId: "company-1", name: "Coder", adapterType: "claude_k8s", adapterConfig: {} },
    runtime: { sessionId: null, sessionParams: null, sessionDisplayId: null, taskKey: null },
    config: { promptTemplate: "Fix the failing test.", ...config },
    context: {},
    authToken: "run-scoped-token",
    onLog: async (stream, chunk) => {
      (stream === "stdout" ? rec.stdout : rec.stderr).push(chunk);
    },
    onMeta: async (m) => void rec.meta.push(m),
    onSpawn: async () => void rec.spawns++,
    ...over,
  };
  return rec;
}

/** When the Job is created, its pod "runs": the relay sees it, lines come, it ends. */
function runsTo(lines: string[], end: Parameters<FakeRelay["finish"]>[1], delayMs = 30) {
  return (job: V1Job) => {
    const labels = job.metadata?.labels ?? {};
    setTimeout(() => {
      relay.addRun({ id: labels["paperclip.io/run-id"], agent: labels["paperclip.io/agent-id"], job: job.metadata?.name, jobUid: job.metadata?.uid });
      relay.appendLines(labels["paperclip.io/run-id"], ...lines);
      relay.finish(labels["paperclip.io/run-id"], end);
    }, delayMs);
  };
}

const claudeLines = [
  '{"type":"system","subtype":"init","session_id":"sess-1","model":"claude-sonnet-4-5"}',
  '{"type":"assistant","message":{"content":[{"type":"text","text":"working"}]}}',
  '{"type":"result","subtype":"success","is_error":false,"result":"fixed it","session_id":"sess-1","total_cost_usd":0.01}',
];
const claudeEnd = {
  phase: "Succeeded",
  exitCode: 0,
  result: { format: "claude-stream-json", outcome: "succeeded", sessionId: "sess-1", model: "claude-sonnet-4-5", text: "fixed it", costUsd: 0.01, usage: { inputTokens: 3, outputTokens: 4 } },
};

before(async () => {
  relay = await new FakeRelay().start();
  tokenFile = relay.tokenFile();
});
after(() => relay.close());
beforeEach(() => {
  kube = new FakeKube();
});

describe("execute", () => {
  it("submits a bare Job with its env Secret, follows the relay and maps the result", async () => {
    kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
    const rec = newCtx({}, { model: "claude-sonnet-4-5", maxTurnsPerRun: 7 });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());

    assert.deepEqual(rec.stdout, claudeLines.map((l) => `${l}\n`), "each line once, in order, on stdout");
    assert.equal(result.errorCode, null);
    assert.equal(result.exitCode, 0);
    assert.equal(result.summary, "fixed it");
    assert.equal(result.sessionId, "sess-1");
    assert.equal(result.costUsd, 0.01);
    assert.ok(rec.spawns >= 1, "liveness reported");

    assert.equal(kube.calls[0], `list jobs paperclip.io/agent-id=${rec.ctx.agent.id}`, "looks for a queued run of the agent first");
    const [, secretCall, jobCall] = kube.calls;
    assert.match(secretCall, /^create secret pc-run-\d+-[0-9a-f]{8}-env$/);
    assert.match(jobCall, /^create job pc-run-\d+-[0-9a-f]{8}$/);
    const job = [...kube.jobs.values()][0];
    assert.equal(job.metadata?.labels?.["paperclip.io/agent-id"], rec.ctx.agent.id);
    assert.equal(job.metadata?.labels?.["paperclip.io/run-id"], rec.ctx.runId);
    assert.equal(job.metadata?.labels?.["paperclip.io/adapter-type"], "claude_local");
    assert.equal(job.metadata?.labels?.["paperclip.io/company-id"], "company-1");
    assert.equal(job.metadata?.annotations?.["paperclip.io/model"], "claude-sonnet-4-5");
    assert.equal(job.metadata?.annotations?.["paperclip.io/max-turns"], "7");
    assert.equal(job.spec?.template.metadata?.annotations?.["paperclip.io/prompt"], "Fix the failing test.");
    const secret = kube.secrets.get(job.metadata!.annotations!["paperclip.io/env-secret"])!;
    assert.equal(secret.stringData?.PAPERCLIP_API_KEY, "run-scoped-token");
    assert.equal(secret.metadata?.labels?.["paperclip.io/run-id"], rec.ctx.runId);
    assert.equal(secret.metadata?.labels?.["paperclip.io/agent-id"], rec.ctx.agent.id);

    assert.equal(rec.meta.length, 1);
    assert.equal(rec.meta[0].adapterType, "claude_k8s");
    assert.equal(rec.meta[0].prompt, "Fix the failing test.");
    assert.ok(rec.stderr.every((l) => l.startsWith("[clipjob] ")), "the adapter's notices are on stderr");
  });

  it("names the agent's enabled company skills in the prompt, and warns of one the pod cannot read without failing the run", async () => {
    const volume = join(mkdtempSync(join(tmpdir(), "skills-volume-")), "paperclip");
    const skills = join(volume, "instances", "default", "skills", "company-1");
    const deploy = join(skills, "__runtime__", "deploy--1a2b");
    mkdirSync(deploy, { recursive: true });
    writeFileSync(join(deploy, "SKILL.md"), "---\nname: deploy\ndescription: Ship a release.\n---\n");
    const bundled = mkdtempSync(join(tmpdir(), "server-skills-"));
    writeFileSync(join(bundled, "SKILL.md"), "---\nname: paperclip\n---\n");
    kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
    const rec = newCtx({}, {
      paperclipRuntimeSkills: [
        { key: "paperclipai/paperclip/paperclip", runtimeName: "paperclip", source: bundled },
        { key: "company/company-1/deploy", runtimeName: "deploy--1a2b", source: deploy },
      ],
      paperclipSkillSync: { desiredSkills: ["company/company-1/deploy"] },
    });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), runHome: { paperclipHome: volume, instance: "default", sharedVolume: volume } });

    assert.equal(result.errorCode, null, "a skill the pod cannot read fails no run");
    assert.equal(result.exitCode, 0);
    const prompt = [...kube.jobs.values()][0].spec?.template.metadata?.annotations?.["paperclip.io/prompt"] ?? "";
    assert.ok(prompt.includes(`- deploy--1a2b (company/company-1/deploy): ${join(deploy, "SKILL.md")} — Ship a release.`), prompt);
    assert.match(prompt, /- paperclipai\/paperclip\/paperclip — enabled but unavailable/);
    assert.ok(prompt.endsWith("Fix the failing test."), "the skills come before the heartbeat prompt, with the instructions");
    assert.ok(!prompt.includes(bundled), "the server's own paths stay out of the prompt");
    const warning = rec.stderr.find((l) => l.includes("Warning: skill"));
    assert.ok(warning?.startsWith(`[clipjob] Warning: skill "paperclipai/paperclip/paperclip" is enabled for this agent but its files are unavailable in the run's pod`), rec.stderr.join(""));
    assert.ok(warning?.includes(bundled), "the run's log names where the skill's files are");
    assert.equal(rec.meta[0].promptMetrics?.skillsChars, prompt.length - "Fix the failing test.".length - 2);
  });

  it("another container's lines go to stderr, named; stdout stays the agent's output", async () => {
    kube.afterCreateJob = (job) => {
      const labels = job.metadata!.labels!;
      const id = labels["paperclip.io/run-id"];
      setTimeout(() => {
        relay.addRun({ id, agent: labels["paperclip.io/agent-id"], job: job.metadata?.name, jobUid: job.metadata?.uid, mainContainer: "agent" });
        relay.appendFrom(id, "git-sync", "cloned the repository");
        relay.appendLines(id, claudeLines[0]);
        relay.appendFrom(id, "proxy", "listening on :8080");
        relay.appendLines(id, claudeLines[2]);
        relay.finish(id, claudeEnd);
      }, 30);
    };
    const rec = newCtx();
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, null, result.errorMessage ?? "");
    assert.deepEqual(rec.stdout, [`${claudeLines[0]}\n`, `${claudeLines[2]}\n`]);
    assert.ok(rec.stderr.includes("[git-sync] cloned the repository\n") && rec.stderr.includes("[proxy] listening on :8080\n"), rec.stderr.join(""));
  });

  it("sends a large prompt in a Secret created before the Job", async () => {
    kube.afterCreateJob = runsTo([], claudeEnd);
    const rec = newCtx({}, { promptTemplate: "p".repeat(2048), promptAnnotationMaxBytes: 1024 });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, null);
    assert.deepEqual(
      kube.calls.filter((c) => !c.startsWith("list jobs")).map((c) => c.replace(/pc-run-\d+-[0-9a-f]{8}/, "JOB")),
      ["create secret JOB-env", "create secret JOB-prompt", "create job JOB"],
    );
    const job = [...kube.jobs.values()][0];
    assert.equal(job.spec?.template.metadata?.annotations?.["paperclip.io/prompt-secret"], `${job.metadata?.name}-prompt`);
    assert.equal(kube.secrets.get(`${job.metadata?.name}-prompt`)?.stringData?.prompt, "p".repeat(2048));
  });

  it("409 agent-busy: blocked, and the run's Secrets removed", async () => {
    kube.onCreateJob = () => {
      throw statusError(409, "Conflict", "agent busy", [
        { reason: "clipjob.paperclip.io/agent-busy", message: "agent busy" },
        { reason: "clipjob.paperclip.io/holder-run-id", message: "run-0" },
      ]);
    };
    const rec = newCtx();
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
    assert.equal(result.errorMeta?.holderRunId, "run-0");
    assert.equal(kube.secrets.size, 0);
    assert.equal(kube.jobs.size, 0);
  });

  const webhookUnreachable = () =>
    statusError(500, "InternalError", 'Internal error occurred: failed calling webhook "mjob.clipjob.paperclip.io": failed to call webhook: Post "https://clipjob-webhook.clipjob-system.svc:443/mutate": dial tcp 10.0.0.7:443: connect: connection refused');

  it("webhook unreachable past webhookGraceSec: asked again meanwhile, then the guard-unreachable code and nothing left", async () => {
    let creates = 0;
    kube.onCreateJob = () => {
      creates++;
      throw webhookUnreachable();
    };
    // A second of grace and 10 ms doubling waits: three asks need 70 ms of them.
    const rec = newCtx({}, { webhookGraceSec: 1 });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrency_guard_unreachable");
    assert.ok(creates >= 3, `asked ${creates} times within webhookGraceSec`);
    assert.ok(rec.stderr.filter((l) => /admission webhook could not be reached, so nothing was created .*asking again in \d+ ms/.test(l)).length >= 2, rec.stderr.join(""));
    assert.equal(kube.secrets.size, 0);
    assert.equal(kube.jobs.size, 0);
  });

  it("webhookGraceSec 0: the guard-unreachable code at the first refusal", async () => {
    let creates = 0;
    kube.onCreateJob = () => {
      creates++;
      throw webhookUnreachable();
    };
    const result = await executeRun(CLAUDE_ADAPTER, newCtx({}, { webhookGraceSec: 0 }).ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrency_guard_unreachable");
    assert.equal(creates, 1);
  });

  it("a webhook replica restarting (two creates it could not judge, then admitted): the run starts and ends once", async () => {
    let refusals = 2;
    kube.onCreateJob = (job) => {
      if (refusals-- > 0) throw webhookUnreachable();
      return job;
    };
    kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
    const rec = newCtx();
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, null, result.errorMessage ?? "");
    assert.equal(kube.jobs.size, 1);
    assert.equal(kube.calls.filter((c) => c.startsWith("create job")).length, 3);
  });

  it("cancelled while waiting for the webhook: cancelled before start, nothing left", async () => {
    kube.onCreateJob = () => {
      throw webhookUnreachable();
    };
    const abort = new AbortController();
    const rec = newCtx({ signal: abort.signal });
    setTimeout(() => abort.abort(), 40);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "cancelled", result.errorMessage ?? "");
    assert.equal(kube.secrets.size, 0);
    assert.equal(kube.jobs.size, 0);
  });

  it("queued in Queue mode: says so and waits with no scheduling timeout", async () => {
    kube.onCreateJob = (job) => {
      job.metadata!.annotations = {
        ...job.metadata!.annotations,
        "clipjob.paperclip.io/queued": "",
        "clipjob.paperclip.io/queue-position": "1",
        "clipjob.paperclip.io/queue-holder": "paperclip/pc-run-0",
      };
      return job;
    };
    // Longer than relayGraceMs: a waiting run's Job is active, so no clock runs.
    kube.afterCreateJob = runsTo(["late"], claudeEnd, 500);
    const rec = newCtx();
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, null);
    assert.deepEqual(rec.stdout, ["late\n"]);
    assert.ok(rec.stderr.some((l) => /queued by clipjob.*paperclip\/pc-run-0.*position 1/.test(l)), rec.stderr.join(""));
  });

  it("a queued run clipjob refuses to start: fails naming why, and its Job is deleted", async () => {
    kube.onCreateJob = (job) => {
      job.metadata!.annotations = { ...job.metadata!.annotations, "clipjob.paperclip.io/queued": "true" };
      job.spec = { ...job.spec!, suspend: true };
      return job;
    };
    // The claim controller's start is refused by clipjob's start check.
    kube.afterCreateJob = (job) =>
      setTimeout(() => {
        const stored = kube.jobs.get(job.metadata!.name!)!;
        stored.metadata!.annotations = { ...stored.metadata!.annotations, "clipjob.paperclip.io/queue-error": "this run cannot start: images" };
      }, 30);
    const rec = newCtx();
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_job_create_failed", result.errorMessage ?? "");
    assert.match(result.errorMessage ?? "", /clipjob did not start run .*this run cannot start: images/);
    assert.equal(kube.deletions.length, 1, "the refused run's Job would wait suspended forever");
  });

  it("a queued run refused because its agent's queue was full: blocked, as a busy agent is", async () => {
    kube.onCreateJob = (job) => {
      job.metadata!.annotations = {
        ...job.metadata!.annotations,
        "clipjob.paperclip.io/queued": "true",
        "clipjob.paperclip.io/queue-error": "clipjob.paperclip.io/queue-full: agent already had 1 runs waiting",
      };
      job.spec = { ...job.spec!, suspend: true };
      return job;
    };
    const result = await executeRun(CLAUDE_ADAPTER, newCtx().ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked", result.errorMessage ?? "");
  });

  it("cancellation deletes the Job and acknowledges once it is gone", async () => {
    const stop = new AbortController();
    kube.deleteDelayMs = 50;
    kube.afterCreateJob = (job) => {
      relay.addRun({ id: job.metadata!.labels!["paperclip.io/run-id"] });
      setTimeout(() => stop.abort(), 50);
    };
    const rec = newCtx({ signal: stop.signal, onCancellationReady: async () => {} });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "cancelled");
    assert.deepEqual(kube.deletions.map((d) => d.propagation), ["Foreground"]);
    assert.equal(kube.jobs.size, 0);
    assert.equal(kube.secrets.size, 0, "the run's Secrets go too, even if clipjob had not taken them yet");
    assert.equal((result.resultJson?.executionCancellation as { state: string }).state, "acknowledged");
  });

  it("cancelled before anything was created: nothing to delete", async () => {
    const stop = new AbortController();
    stop.abort();
    const result = await executeRun(CLAUDE_ADAPTER, newCtx({ signal: stop.signal }).ctx, deps());
    assert.equal(result.errorCode, "cancelled");
    assert.deepEqual(result.executionRecovery, { kind: "bootstrap", providerWorkStarted: false });
    assert.deepEqual(kube.calls, []);
  });

  // Paperclip's retry of a run is a new run: it does not follow the retried
  // run's Job (the agent's other runs would take that Job for an orphan).
  it("does not re-attach to the run Paperclip retries (retryOfRunId): another run, clipjob decides", async () => {
    const rec = newCtx({ context: { retryOfRunId: "run-before-restart" } });
    relay.addRun({ id: "run-before-restart", agent: rec.ctx.agent.id, job: "pc-before", phase: "Running" });
    relay.appendLines("run-before-restart", "one", "two");
    kube.jobs.set("pc-before", ours({ metadata: { name: "pc-before" } }));
    refusedBusy("run-before-restart");
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
    assert.deepEqual(rec.stdout, []);
    assert.ok(rec.stderr.some((l) => l.includes("the agent's run run-before-restart is another run: not re-attaching")), rec.stderr.join(""));
  });


  it("re-attaches to this run's own Job (an earlier attempt at the run) whose pod has not started yet", async () => {
    const rec = newCtx();
    relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, job: "pc-pending", phase: "Pending" });
    kube.jobs.set("pc-pending", ours({ metadata: { name: "pc-pending" } }));
    // It starts once the adapter follows it (a timer raced a slow machine:
    // a run already finished is not this run's active one). The relay
    // serves the whole file: only this test's log requests count.
    const requestsBefore = relay.logRequests.length;
    const started = setInterval(() => {
      if (relay.logRequests.length === requestsBefore) return;
      clearInterval(started);
      relay.finish(rec.ctx.runId, { phase: "Succeeded", exitCode: 0, result: { outcome: "succeeded", text: "late start" } });
    }, 5);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps()).finally(() => clearInterval(started));
    assert.equal(result.summary, "late start");
    assert.ok(!kube.calls.some((c) => c.startsWith("create")), kube.calls.join());
  });

  /** clipjob in Reject mode: the agent's active run holds its claim. */
  function refusedBusy(holder: string) {
    kube.onCreateJob = () => {
      throw statusError(409, "Conflict", "agent busy", [
        { reason: "clipjob.paperclip.io/agent-busy", message: "agent busy" },
        { reason: "clipjob.paperclip.io/holder-run-id", message: holder },
      ]);
    };
  }

  // Another run of the agent, whatever its task, is another run: following
  // it would hand its output and its cost to this run too (Paperclip runs
  // an agent up to 20 times at once by default). clipjob decides: it
  // refuses this run (Reject mode) or queues it (Queue mode).
  for (const [thisTask, otherTask] of [
    ["task-a", "task-a"],
    [undefined, undefined],
    ["task-b", "task-a"],
    [undefined, "task-t"],
    ["task-b", undefined],
  ] as Array<[string | undefined, string | undefined]>) {
    it(`a run for task ${thisTask ?? "(none)"} does not re-attach to the agent's other run for task ${otherTask ?? "(none)"}: clipjob decides`, async () => {
      const rec = newCtx({ context: thisTask ? { taskId: thisTask } : {} });
      const other = `run-other-task-${runCounter}`;
      relay.addRun({ id: other, agent: rec.ctx.agent.id, ...(otherTask ? { task: otherTask } : {}), job: "pc-other-task", phase: "Running" });
      relay.appendLines(other, "the other task's output");
      kube.jobs.set("pc-other-task", ours({ metadata: { name: "pc-other-task" } }));
      refusedBusy(other);
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
      assert.equal(result.errorMeta?.holderRunId, other);
      assert.deepEqual(rec.stdout, [], "none of the other run's output is this run's");
      assert.equal(result.costUsd, undefined, "the other run's cost is not billed to this one");
      assert.equal(kube.secrets.size, 0, "the refused run's Secrets are removed");
      assert.ok(rec.stderr.some((l) => l.includes(`the agent's run ${other} is another run: not re-attaching`)), rec.stderr.join(""));
    });
  }

  // The agent's previous run ended in Paperclip a moment before the Job
  // controller marked its Job finished and clipjob let go of the agent.
  describe("the agent's previous Job has just ended", () => {
    function previousHolds(rec: Recorded, conditions: { type: string; status: string }[], refusals: number) {
      kube.jobs.set("pc-previous", ours({
        metadata: { name: "pc-previous", labels: { "paperclip.io/agent-id": rec.ctx.agent.id, "paperclip.io/run-id": "run-previous" } },
        status: { conditions } as V1Job["status"],
      }));
      let left = refusals;
      kube.onCreateJob = (j) => {
        if (left-- > 0) {
          throw statusError(409, "Conflict", "agent busy", [
            { reason: "clipjob.paperclip.io/agent-busy", message: "agent busy" },
            { reason: "clipjob.paperclip.io/holder-run-id", message: "run-previous" },
            { reason: "clipjob.paperclip.io/holder-job", message: "paperclip/pc-previous" },
          ]);
        }
        return j;
      };
    }

    it("its Job Complete, still refused twice: the run asks again, says why, and starts", async () => {
      kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
      const rec = newCtx();
      previousHolds(rec, [{ type: "Complete", status: "True" }], 2);
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), releaseGraceMs: 5_000 });
      assert.equal(result.errorCode, null, result.errorMessage ?? "");
      assert.equal(kube.calls.filter((c) => c.startsWith("create job")).length, 3);
      assert.equal(rec.stderr.filter((l) => /Job paperclip\/pc-previous has finished, and clipjob has not let go of the agent yet; asking again/.test(l)).length, 2, rec.stderr.join(""));
      assert.ok(kube.jobs.has("pc-previous"), "a finished Job is left to its TTL, not deleted");
    });

    it("cancelled while waiting for clipjob to let go: cancelled before start, nothing left, nothing asked of Paperclip", async () => {
      const rec = newCtx({ signal: AbortSignal.timeout(100) });
      previousHolds(rec, [{ type: "Complete", status: "True" }], 100);
      const asked: string[] = [];
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), paperclip: () => ({ runStatus: async (id) => (asked.push(id), { status: "succeeded" }) }) });
      assert.equal(result.errorCode, "cancelled", result.errorMessage ?? "");
      assert.deepEqual(asked, [], "a cancelled run reaps no orphan");
      assert.equal(kube.secrets.size, 0);
      assert.ok(kube.jobs.has("pc-previous"));
    });

    // Read running when the refusal came, Complete a moment later when the
    // run asks whether it is an orphan: the run waits, as for a Job read
    // Complete at once, and neither deletes it nor fails.
    it("its Job marked Complete between the run's two reads: the run asks again and starts", async () => {
      kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
      const rec = newCtx();
      previousHolds(rec, [], 1);
      kube.afterReadJob = (j) => {
        if (j.metadata?.name === "pc-previous") j.status = { conditions: [{ type: "Complete", status: "True" }] } as V1Job["status"];
      };
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), releaseGraceMs: 5_000, paperclip: () => ({ runStatus: async () => ({ status: "succeeded" }) }) });
      assert.equal(result.errorCode, null, result.errorMessage ?? "");
      assert.equal(kube.calls.filter((c) => c.startsWith("create job")).length, 2);
      assert.ok(rec.stderr.some((l) => /Job paperclip\/pc-previous has finished, and clipjob has not let go of the agent yet; asking again/.test(l)), rec.stderr.join(""));
      assert.ok(kube.jobs.has("pc-previous"), "a finished Job is left to its TTL, not deleted");
    });

    it("cancelled while it waits for a Job marked Complete between its two reads: cancelled before start", async () => {
      // Read running at the refusal, Complete when asked whether it is an
      // orphan, and the run cancelled as it reads it again to wait.
      const cancel = new AbortController();
      const rec = newCtx({ signal: cancel.signal });
      previousHolds(rec, [], 100);
      let reads = 0;
      kube.afterReadJob = (j) => {
        if (j.metadata?.name !== "pc-previous") return;
        reads++;
        if (reads === 1) j.status = { conditions: [{ type: "Complete", status: "True" }] } as V1Job["status"];
        if (reads === 3) cancel.abort();
      };
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), releaseGraceMs: 5_000, paperclip: () => ({ runStatus: async () => ({ status: "succeeded" }) }) });
      assert.equal(result.errorCode, "cancelled", result.errorMessage ?? "");
      assert.equal(kube.secrets.size, 0, "a cancelled run's Secrets are removed");
      assert.ok(kube.jobs.has("pc-previous"), "a finished Job is left to its TTL, not deleted");
    });

    it("its Job still running: no waiting, the run is blocked at once", async () => {
      const rec = newCtx();
      previousHolds(rec, [], 1);
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), paperclip: () => ({ runStatus: async () => ({ status: "running" }) }) });
      assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
      assert.equal(kube.calls.filter((c) => c.startsWith("create job")).length, 1);
      assert.ok(!rec.stderr.some((l) => l.includes("has not let go")), rec.stderr.join(""));
    });
  });

  // A server that crashed mid-run left its Job: Paperclip marked the run
  // ended (process_lost), nobody follows the Job, and it holds the agent.
  describe("an orphan holding the agent", () => {
    function orphanHolds(rec: Recorded, holderRun: string, job: Partial<V1Job> = {}, createdBy?: string) {
      const held = ours({ ...job, metadata: { name: "pc-orphan", labels: { "paperclip.io/agent-id": rec.ctx.agent.id, "paperclip.io/run-id": holderRun } } });
      if (createdBy) held.metadata!.annotations!["clipjob.paperclip.io/created-by"] = createdBy;
      kube.jobs.set("pc-orphan", held);
      kube.onCreateJob = (j) => {
        if (kube.jobs.has("pc-orphan")) {
          throw statusError(409, "Conflict", "agent busy", [
            { reason: "clipjob.paperclip.io/agent-busy", message: "agent busy" },
            { reason: "clipjob.paperclip.io/holder-run-id", message: holderRun },
            { reason: "clipjob.paperclip.io/holder-job", message: "paperclip/pc-orphan" },
          ]);
        }
        return j;
      };
    }
    const paperclipSays =
      (answers: Record<string, { status: string } | { unknown: string }>, asked: string[] = []): AdapterDeps["paperclip"] =>
      () => ({
        runStatus: async (id) => {
          asked.push(id);
          return answers[id] ?? { unknown: "not found" };
        },
      });

    for (const status of ["failed", "interrupted", "cancelled", "succeeded", "timed_out"]) {
      it(`deletes a Job whose run Paperclip records as ${status}, then runs`, async () => {
        kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
        const rec = newCtx();
        orphanHolds(rec, "run-lost");
        const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), paperclip: paperclipSays({ "run-lost": { status } }) });
        assert.equal(result.errorCode, null, result.errorMessage ?? "");
        assert.deepEqual(kube.deletions.map((d) => d.name), ["pc-orphan"]);
        assert.ok(rec.stderr.some((l) => l.includes(`the agent's run run-lost ended in Paperclip (${status}) but its Job paperclip/pc-orphan is still active`)), rec.stderr.join(""));
      });
    }

    for (const [what, answer] of [
      ["still running in Paperclip", { status: "running" }],
      ["queued for a retry", { status: "scheduled_retry" }],
      ["unknown to Paperclip", { unknown: "Paperclip answered HTTP 404 for run run-lost" }],
    ] as Array<[string, { status: string } | { unknown: string }]>) {
      it(`leaves a holder alone when its run is ${what}: busy, for Paperclip to retry`, async () => {
        const rec = newCtx();
        orphanHolds(rec, "run-lost");
        const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), paperclip: paperclipSays({ "run-lost": answer }) });
        assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
        assert.deepEqual(result.executionRecovery, { kind: "bootstrap", providerWorkStarted: false });
        assert.equal(result.errorFamily, "transient_upstream");
        assert.deepEqual(kube.deletions, []);
      });
    }

    for (const [what, job, createdBy] of [
      ["another user's (labels copied)", {}, "system:serviceaccount:paperclip:intruder"],
      ["finished", { status: { conditions: [{ type: "Complete", status: "True" }] } }, undefined],
    ] as Array<[string, Partial<V1Job>, string | undefined]>) {
      it(`never deletes a holder Job that is ${what}`, async () => {
        const rec = newCtx();
        orphanHolds(rec, "run-lost", job, createdBy);
        const asked: string[] = [];
        const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), paperclip: paperclipSays({ "run-lost": { status: "failed" } }, asked) });
        assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
        assert.deepEqual(kube.deletions, []);
        assert.deepEqual(asked, [], "Paperclip is not even asked");
      });
    }
  });

  // Hostile: clipjob's 409 names the holder, and the holder's Job is read
  // back; a Job of another agent (a 409 naming it, however it came) is
  // never the orphan of this one, whatever Paperclip says of its run.
  it("never deletes a holder Job of another agent", async () => {
    const rec = newCtx();
    kube.jobs.set("pc-orphan", ours({ metadata: { name: "pc-orphan", labels: { "paperclip.io/agent-id": "agent-of-another-company", "paperclip.io/run-id": "run-lost" } } }));
    kube.onCreateJob = () => {
      throw statusError(409, "Conflict", "agent busy", [
        { reason: "clipjob.paperclip.io/agent-busy", message: "agent busy" },
        { reason: "clipjob.paperclip.io/holder-run-id", message: "run-lost" },
        { reason: "clipjob.paperclip.io/holder-job", message: "paperclip/pc-orphan" },
      ]);
    };
    const asked: string[] = [];
    const paperclip: AdapterDeps["paperclip"] = () => ({ runStatus: async (id) => (asked.push(id), { status: "failed" }) });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), paperclip });
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
    assert.deepEqual(kube.deletions, []);
    assert.deepEqual(asked, [], "Paperclip is not even asked");
  });

  it("a graceful stop of the server deletes the Jobs it follows (Paperclip will not follow them again)", async () => {
    kube.afterCreateJob = runsTo(["started"], claudeEnd, 60_000);
    const rec = newCtx();
    const running = executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    await waitFor(() => followedJobs().includes(`paperclip/${jobNameOf(rec)}`));
    await deleteFollowedJobs("SIGTERM");
    assert.deepEqual(kube.deletions.map((d) => d.name), [jobNameOf(rec)]);
    assert.ok(rec.stderr.some((l) => l.includes("the Paperclip server is stopping (SIGTERM)")), rec.stderr.join(""));
    await running;
    assert.deepEqual(followedJobs(), [], "a run that ended is followed no more");

    // A run that reaches its Job after the signal creates none: Paperclip
    // will not follow it again.
    try {
      const late = newCtx();
      const result = await executeRun(CLAUDE_ADAPTER, late.ctx, deps());
      assert.equal(result.errorCode, "cancelled");
      assert.match(result.errorMessage ?? "", /the Paperclip server is stopping \(SIGTERM\)/);
      assert.ok(!kube.calls.some((c) => c === `create job ${jobNameOf(late)}`), kube.calls.join());
      assert.deepEqual([...kube.secrets.keys()].filter((n) => n.startsWith(jobNameOf(late))), [], "its Secrets are removed");
      assert.ok(kube.calls.some((c) => c.startsWith(`create secret ${jobNameOf(late)}`)), `it got that far: ${kube.calls.join()}`);
    } finally {
      resetStopping();
    }
  });

  it("a graceful stop between the Job's creation and its follow deletes the Job (the server's first run)", async () => {
    // A process that has followed no run yet, whose host (as Paperclip's
    // server does) handles SIGTERM itself.
    unwatchServerStop();
    const host = () => {};
    process.on("SIGTERM", host);
    try {
      const rec = newCtx();
      // The signal as the Job is stored; the pod runs to its end a second
      // later, for a follow that did not hear it.
      kube.afterCreateJob = (job) => {
        process.emit("SIGTERM");
        runsTo(claudeLines, claudeEnd, 1000)(job);
      };
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.deepEqual(kube.deletions.map((d) => d.name), [jobNameOf(rec)], `the run ended ${result.errorCode}: ${result.errorMessage}`);
      assert.ok(rec.stderr.some((l) => l.includes("the Paperclip server is stopping (SIGTERM)")), rec.stderr.join(""));
    } finally {
      process.off("SIGTERM", host);
      resetStopping();
    }
  });

  it("re-attaches to its own run clipjob queued, found among its Jobs (the relay knows no pod yet)", async () => {
    const rec = newCtx({ context: { taskId: "task-q" } });
    const id = rec.ctx.runId;
    const queued = ours({
      metadata: {
        name: "pc-queued",
        labels: { "paperclip.io/agent-id": rec.ctx.agent.id, "paperclip.io/run-id": id, "paperclip.io/company-id": "company-1", "paperclip.io/task-id": "task-q" },
        annotations: { "clipjob.paperclip.io/queued": "" },
      },
      spec: { suspend: true, template: {} },
    });
    // Another user's copy of it, queued too and listed first: not followed.
    kube.jobs.set("pc-queued-copy", {
      ...queued,
      metadata: { ...queued.metadata, name: "pc-queued-copy", annotations: { "clipjob.paperclip.io/queued": "", "clipjob.paperclip.io/created-by": "someone-else" } },
    });
    kube.jobs.set("pc-queued", queued);
    setTimeout(() => {
      relay.addRun({ id, agent: rec.ctx.agent.id, job: "pc-queued" });
      relay.appendLines(id, "started at last");
      relay.finish(id, { phase: "Succeeded", exitCode: 0, result: { outcome: "succeeded", text: "was queued" } });
    }, 100);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.summary, "was queued", result.errorMessage ?? "");
    assert.deepEqual(rec.stdout, ["started at last\n"]);
    assert.ok(!kube.calls.some((c) => c.startsWith("create")), kube.calls.join());
    assert.ok(rec.stderr.some((l) => l.includes(`re-attaching to the agent's queued run ${id}`)), rec.stderr.join(""));
  });

  // The relay lists runs of every namespace the server's token reads: a
  // Job elsewhere, or of another company, wearing the agent's id is not a
  // run this adapter started (a tenant could otherwise hand the agent's
  // next run its own output, result and session).
  for (const [what, run] of [
    ["in another namespace", { namespace: "paperclip-evil" }],
    ["of another company", { company: "company-evil" }],
  ] as Array<[string, Partial<RelayRun>]>) {
    it(`does not re-attach to a run with the agent's id ${what}: runs its own`, async () => {
      kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
      const rec = newCtx();
      relay.addRun({ id: `forged-${runCounter}`, agent: rec.ctx.agent.id, job: "evil", phase: "Running", ...run });
      relay.appendLines(`forged-${runCounter}`, "forged output");
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, null, result.errorMessage ?? "");
      assert.equal(result.summary, "fixed it");
      assert.deepEqual(rec.stdout, claudeLines.map((l) => `${l}\n`), "only its own run's output");
      assert.ok(kube.calls.some((c) => /^create job pc-run-/.test(c)), kube.calls.join());
    });
  }

  // The relay marks a run done only once its pod's streams drained, a few
  // seconds after the pod went; a cancel returns as soon as the Job is
  // gone, and Paperclip starts the agent's next queued run at once. That
  // run must not take the ending run for its own (clipjob's e2e
  // TestPaperclipAdapterCancelsARun found it handing on the cancelled
  // run's output and creating no Job).
  for (const [what, job] of [
    ["is gone (cancelled a moment ago)", null],
    ["is being deleted", { metadata: { name: "pc-ending", deletionTimestamp: new Date() } }],
    ["has finished", { metadata: { name: "pc-ending" }, status: { conditions: [{ type: "Complete", status: "True" }] } }],
    ["was replaced by another Job of the name", { metadata: { name: "pc-ending", uid: "uid-new" } }],
  ] as Array<[string, V1Job | null]>) {
    it(`does not re-attach to another run of the agent whose Job ${what}: runs its own`, async () => {
      kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
      const rec = newCtx({ context: { taskId: "task-b" } });
      relay.addRun({ id: `run-ending-${runCounter}`, agent: rec.ctx.agent.id, job: "pc-ending", jobUid: "uid-old", task: "task-b", phase: "Running" });
      relay.appendLines(`run-ending-${runCounter}`, "the ending run's line");
      if (job) kube.jobs.set("pc-ending", ours(job));
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, null, result.errorMessage ?? "");
      assert.equal(result.summary, "fixed it");
      assert.deepEqual(rec.stdout, claudeLines.map((l) => `${l}\n`), "only its own run's output");
      assert.ok(kube.calls.some((c) => /^create job pc-run-/.test(c)), kube.calls.join());
      assert.ok(rec.stderr.some((l) => /the agent's run run-ending-\d+ is another run: not re-attaching/.test(l)), rec.stderr.join());
    });
  }

  it("re-attaches to its own run's record even when that run's Job is gone", async () => {
    const rec = newCtx();
    relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, job: jobNameOf(rec), phase: "Running" });
    relay.appendLines(rec.ctx.runId, "before the restart");
    setTimeout(() => relay.finish(rec.ctx.runId, { phase: "Unknown", result: { outcome: "failed", truncated: true } }), 30);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.deepEqual(rec.stdout, ["before the restart\n"]);
    assert.equal(result.errorCode, "job_failed");
    assert.ok(!kube.calls.some((c) => c.startsWith("create")), kube.calls.join());
  });

  // Hostile review: anyone who may create Jobs in the agents' namespace
  // can copy an agent's labels (agent, company, task); clipjob records who
  // created each Job, and only this server's Jobs are its runs.
  for (const [what, createdBy] of [
    ["another user created (labels copied)", "system:serviceaccount:paperclip:intruder"],
    ["records no creator (not admitted by clipjob, or an older clipjob)", undefined],
  ] as Array<[string, string | undefined]>) {
    it(`does not re-attach to a Job in its namespace that ${what}: runs its own`, async () => {
      kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
      const rec = newCtx({ context: { taskId: "task-a" } });
      const id = `copied-${runCounter}`;
      relay.addRun({ id, agent: rec.ctx.agent.id, task: "task-a", job: "pc-copied", phase: "Running" });
      relay.appendLines(id, "forged output");
      kube.jobs.set("pc-copied", {
        metadata: { name: "pc-copied", ...(createdBy ? { annotations: { "clipjob.paperclip.io/created-by": createdBy } } : {}) },
      });
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, null, result.errorMessage ?? "");
      assert.deepEqual(rec.stdout, claudeLines.map((l) => `${l}\n`), "only its own run's output");
      assert.ok(kube.calls.some((c) => /^create job pc-run-/.test(c)), kube.calls.join());
      assert.ok(rec.stderr.some((l) => /the agent's run copied-\d+ is another run: not re-attaching/.test(l)), rec.stderr.join(""));
    });
  }

  it("does not follow its own run id on a Job another user created", async () => {
    kube.afterCreateJob = () => assert.fail("the name is taken: no Job of this server's can be created there");
    const rec = newCtx();
    relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, job: "pc-squatted", phase: "Running" });
    relay.appendLines(rec.ctx.runId, "forged output");
    kube.jobs.set("pc-squatted", { metadata: { name: "pc-squatted", annotations: { "clipjob.paperclip.io/created-by": "system:serviceaccount:paperclip:intruder" } } });
    kube.onCreateJob = () => {
      throw statusError(409, "Conflict", "agent busy", [{ reason: "clipjob.paperclip.io/agent-busy", message: "agent busy" }]);
    };
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
    assert.deepEqual(rec.stdout, [], "none of the forged output");
  });

  it("does not re-attach when it cannot learn its own user: submits, and clipjob decides", async () => {
    kube.whoAmIError = statusError(500, "InternalError", "etcd is sad");
    const rec = newCtx();
    relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, job: "pc-unknowable", phase: "Running" });
    relay.appendLines(rec.ctx.runId, "output of a Job that cannot be vouched for");
    kube.jobs.set("pc-unknowable", ours({ metadata: { name: "pc-unknowable" } }));
    refusedBusy(rec.ctx.runId);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked", result.errorMessage ?? "");
    assert.deepEqual(rec.stdout, [], "none of that Job's output");
    assert.ok(rec.stderr.some((l) => /own user could not be read .*etcd is sad/.test(l)), rec.stderr.join(""));
  });

  it("a cancel during the re-attach checks is honoured: the followed run's Job is deleted", async () => {
    const stop = new AbortController();
    const rec = newCtx({ signal: stop.signal });
    relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, job: "pc-to-cancel", phase: "Running" });
    kube.jobs.set("pc-to-cancel", ours({ metadata: { name: "pc-to-cancel" } }));
    const read = kube.readJob.bind(kube);
    kube.readJob = async (ns, name) => {
      stop.abort(); // lands after the adapter's own aborted check, before the follow
      return read(ns, name);
    };
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "cancelled");
    assert.deepEqual(kube.deletions.map((d) => d.name), ["pc-to-cancel"]);
  });

  it("a Secret name taken by a Secret it cannot vouch for: uses another name and leaves that one alone", async () => {
    kube.afterCreateJob = runsTo([], claudeEnd);
    const rec = newCtx();
    // Whoever made it, the adapter may not read it: it is neither used nor deleted.
    const taken = `${jobNameOf(rec)}-env`;
    kube.secrets.set(taken, { metadata: { name: taken, labels: { "paperclip.io/run-id": "someone-else" } }, stringData: { KEEP: "me" } });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, null, result.errorMessage ?? "");
    assert.equal(kube.secrets.get(taken)?.stringData?.KEEP, "me", "the other Secret is untouched");
    assert.ok(!kube.calls.includes(`delete secret ${taken}`), kube.calls.join());
    const job = kube.jobs.get(jobNameOf(rec))!;
    const envSecret = job.metadata!.annotations!["paperclip.io/env-secret"];
    assert.match(envSecret, new RegExp(`^${taken}-[0-9a-f]{6}$`));
    assert.equal(kube.secrets.get(envSecret)?.stringData?.PAPERCLIP_API_KEY, "run-scoped-token");
  });

  it("an agent's config naming a namespace the server does not run agents in: refused, nothing created", async () => {
    const rec = newCtx({}, { namespace: "kube-system", relayUrl: "http://attacker.example" });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "clipjob_adapter_config_invalid");
    assert.match(result.errorMessage ?? "", /namespace "kube-system" is not one this server runs agents in/);
    assert.deepEqual(kube.calls, []);
    assert.ok(rec.stderr.some((l) => /the agent's relayUrl is ignored/.test(l)), rec.stderr.join(""));
  });

  it("the relay refusing the token while the Job still runs: says the Job still runs", async () => {
    kube.afterCreateJob = (job) => relay.addRun({ id: job.metadata!.labels!["paperclip.io/run-id"], job: job.metadata?.name });
    relay.failWith = 403;
    try {
      const rec = newCtx();
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, { ...deps(), follow: { ...deps().follow, maxAuthFailures: 2 } });
      assert.equal(result.errorCode, "clipjob_relay_unavailable");
      assert.match(result.errorMessage ?? "", /is still running: this run is over for Paperclip, so the agent's next run that meets the Job deletes it/);
      assert.equal(result.errorMeta?.stillRunning, true);
      assert.equal(kube.jobs.size, 1, "the running Job is left running");
    } finally {
      relay.failWith = null;
    }
  });

  // Hostile review (second round): the relay binds a run id to the first
  // Job it sees carrying it, in any namespace it follows, and a run's id
  // shows in its labels (a queued Job's, its env Secret's). A Job carrying
  // this run's id must not hand on its output and result as this run's.
  // The relay keeps this run's Job apart (GET /v1/runs/{run}?job=<uid>);
  // a relay that answers with the other Job's record anyway (one older
  // than ?job=) is caught by the record check.
  for (const [what, bait] of [
    ["of another agent", { agent: "agent-evil", job: "evil", jobUid: "uid-evil" }],
    ["of this agent but another uid", { job: "evil", jobUid: "uid-evil" }],
    ["in another namespace", { namespace: "tenant", job: "evil", jobUid: "uid-evil" }],
  ] as Array<[string, Partial<RelayRun>]>) {
    for (const keptApart of [true, false]) {
      it(`a Job ${what} carrying this run's id, ${keptApart ? "the relay keeping this run apart: this run's own output" : "a relay without ?job=: none of its output, and says so"}`, async () => {
        kube.afterCreateJob = (job) => {
          const id = job.metadata!.labels!["paperclip.io/run-id"];
          const agent = job.metadata!.labels!["paperclip.io/agent-id"];
          relay.addRun({ id, agent, ...bait });
          relay.appendLines(id, "FORGED LINE");
          relay.finish(id, { phase: "Succeeded", exitCode: 0, result: { outcome: "succeeded", text: "FORGED: task done" } });
          if (keptApart) {
            const own = `${id}@${job.metadata!.uid}`;
            relay.addRun({ id: own, agent, job: job.metadata!.name, jobUid: job.metadata!.uid });
            relay.appendLines(own, claudeLines[2]);
            relay.finish(own, claudeEnd);
          }
        };
        relay.ignoresJobParam = !keptApart;
        try {
          const rec = newCtx();
          const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
          assert.notEqual(result.summary, "FORGED: task done");
          if (keptApart) {
            assert.equal(result.errorCode, null, result.errorMessage ?? "");
            assert.deepEqual(rec.stdout, [`${claudeLines[2]}\n`], "its own output only");
          } else {
            assert.equal(result.errorCode, "clipjob_relay_run_mismatch", result.errorMessage ?? "");
            assert.match(result.errorMessage ?? "", /another Job carries this run's id/);
            assert.deepEqual(rec.stdout, [], "none of the other Job's output");
          }
        } finally {
          relay.ignoresJobParam = false;
        }
      });
    }
  }

  // Its own record, still running as the relay has it (the server
  // restarted), its Job gone: taken only under the name its Job had.
  for (const [what, job] of [
    ["a Job this run would not have had", () => ({ job: "pc-someone-elses" })],
    ["a retry name (whose suffix anyone may choose)", (rec: Recorded) => ({ job: retryJobName(jobNameOf(rec), "abcdef"), jobUid: "uid-attacker" })],
  ] as Array<[string, (rec: Recorded) => Partial<RelayRun>]>) {
    it(`its own record naming ${what}, its Job gone: not followed`, async () => {
      const rec = newCtx();
      relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, phase: "Running", ...job(rec) });
      relay.appendLines(rec.ctx.runId, "FORGED LINE");
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, "clipjob_relay_run_mismatch", result.errorMessage ?? "");
      assert.deepEqual(rec.stdout, []);
      assert.ok(!kube.calls.some((c) => c.startsWith("create")), kube.calls.join());
    });
  }

  it("cancelling its own run whose Job is gone deletes no Job of that name another user made since", async () => {
    const stop = new AbortController();
    const rec = newCtx({ signal: stop.signal });
    relay.addRun({ id: rec.ctx.runId, agent: rec.ctx.agent.id, job: jobNameOf(rec), jobUid: "uid-gone", phase: "Running" });
    relay.appendLines(rec.ctx.runId, "before the restart");
    // Another user's Job has the name now (another uid, not this server's).
    kube.jobs.set(jobNameOf(rec), { metadata: { name: jobNameOf(rec), uid: "uid-theirs", annotations: { "clipjob.paperclip.io/created-by": "someone-else" } } });
    setTimeout(() => stop.abort(), 100);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "cancelled");
    assert.deepEqual(kube.deletions, [], "their Job is left alone");
    assert.ok(kube.jobs.has(jobNameOf(rec)));
  });

  it("cancel deletes the run's Job only while it is still that Job (UID precondition)", async () => {
    const stop = new AbortController();
    kube.afterCreateJob = (job) => {
      relay.addRun({ id: job.metadata!.labels!["paperclip.io/run-id"], agent: job.metadata!.labels!["paperclip.io/agent-id"], job: job.metadata!.name, jobUid: job.metadata!.uid });
      relay.appendLines(job.metadata!.labels!["paperclip.io/run-id"], "working");
      setTimeout(() => {
        // Gone and made again by someone else under the same name.
        kube.jobs.set(job.metadata!.name!, { metadata: { name: job.metadata!.name, uid: "uid-someone-elses", annotations: { "clipjob.paperclip.io/created-by": "someone-else" } } });
        stop.abort();
      }, 100);
    };
    const rec = newCtx({ signal: stop.signal });
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "cancelled");
    assert.match(result.errorMessage ?? "", /deleting Job .* failed: Precondition failed/);
    assert.deepEqual(kube.deletions, [], "the Job now of that name is left alone");
    assert.equal(kube.jobs.get(jobNameOf(rec))?.metadata?.uid, "uid-someone-elses");
  });

  it("a task id that cannot be a label never matches another run (it is on no Job)", async () => {
    const rec = newCtx({ context: { taskId: "a task id with spaces" } });
    relay.addRun({ id: `no-task-${runCounter}`, agent: rec.ctx.agent.id, job: "pc-no-task-2", phase: "Running" });
    kube.jobs.set("pc-no-task-2", ours({ metadata: { name: "pc-no-task-2" } }));
    refusedBusy(`no-task-${runCounter}`);
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
  });

  it("a Job deleted before the relay saw it", async () => {
    kube.afterCreateJob = (job) => setTimeout(() => kube.jobs.delete(job.metadata!.name!), 30);
    const result = await executeRun(CLAUDE_ADAPTER, newCtx().ctx, deps());
    assert.equal(result.errorCode, "k8s_job_deleted_externally");
  });

  it("the relay unreachable: asked again until relayGraceSec, then nothing is created", async () => {
    const rec = newCtx();
    const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps({ CLIPJOB_RELAY_URL: "http://127.0.0.1:9" }));
    assert.equal(result.errorCode, "clipjob_relay_unavailable");
    assert.deepEqual(kube.calls, []);
    assert.ok(rec.stderr.filter((l) => /cannot say whether the agent has a running run .*asking again/.test(l)).length >= 2, rec.stderr.join(""));
  });

  it("the relay being replaced (503, then answers): the run waits for it and starts", async () => {
    relay.listFailures = 3;
    kube.afterCreateJob = runsTo(claudeLines, claudeEnd);
    try {
      const rec = newCtx();
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, null, result.errorMessage ?? "");
      assert.equal(relay.listFailures, 0);
      assert.equal(kube.jobs.size, 1);
    } finally {
      relay.listFailures = 0;
    }
  });

  it("the relay refusing the server's token when asked for running runs: fails at once, nothing created", async () => {
    relay.listFailures = 100;
    relay.listFailStatus = 403;
    try {
      const rec = newCtx();
      const result = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
      assert.equal(result.errorCode, "clipjob_relay_unavailable");
      assert.deepEqual(kube.calls, []);
      assert.equal(relay.listFailures, 99, "asked once: a refusal says the same again");
    } finally {
      relay.listFailures = 0;
      relay.listFailStatus = 503;
    }
  });

  it("the run's Job already exists (a retried execute): follows it", async () => {
    const rec = newCtx({}, { reattach: false });
    kube.afterCreateJob = runsTo(["only once"], claudeEnd);
    const first = await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    assert.equal(first.errorCode, null);
    const again = newCtx({ runId: rec.ctx.runId, agent: rec.ctx.agent }, { reattach: false });
    kube.afterCreateJob = () => assert.fail("no second Job");
    const second = await executeRun(CLAUDE_ADAPTER, again.ctx, deps());
    assert.equal(second.errorCode, null);
    assert.deepEqual(again.stdout, ["only once\n"]);
    assert.equal(kube.jobs.size, 1);
  });

  // Simplicity review: "cannot tell who made it" was taken for "someone
  // else made it", and a retried execute whose Job exists created a second
  // Job of the run (refused, or queued to run it twice).
  for (const [what, setup] of [
    ["its own user cannot be read", () => void (kube.whoAmIError = statusError(500, "InternalError", "etcd is sad"))],
    ["its Job cannot be read", () => void (kube.readJob = () => Promise.reject(statusError(503, "ServiceUnavailable", "try later")))],
  ] as Array<[string, () => void]>) {
    it(`a retried execute whose Job exists while ${what}: refused, nothing more created`, async () => {
      const rec = newCtx({}, { reattach: false });
      kube.afterCreateJob = runsTo(["only once"], claudeEnd);
      assert.equal((await executeRun(CLAUDE_ADAPTER, rec.ctx, deps())).errorCode, null);
      setup();
      const again = newCtx({ runId: rec.ctx.runId, agent: rec.ctx.agent }, { reattach: false });
      kube.afterCreateJob = () => assert.fail("no second Job");
      const second = await executeRun(CLAUDE_ADAPTER, again.ctx, deps());
      assert.equal(second.errorCode, "k8s_job_create_failed", second.errorMessage ?? "");
      assert.match(second.errorMessage ?? "", /A second Job could run it twice, so nothing more was created/);
      assert.equal(kube.jobs.size, 1);
      assert.ok(!kube.calls.some((c) => /^create job .*-[0-9a-f]{6}$/.test(c)), kube.calls.join());
    });
  }

  it("resumes the stored session in the same working directory", async () => {
    kube.afterCreateJob = runsTo([], claudeEnd);
    const rec = newCtx({
      runtime: { sessionId: null, sessionParams: { sessionId: "sess-0", cwd: "/paperclip/wt" }, sessionDisplayId: null, taskKey: null },
      context: { paperclipWorkspace: { cwd: "/paperclip/wt" } },
    });
    await executeRun(CLAUDE_ADAPTER, rec.ctx, deps());
    const job = [...kube.jobs.values()][0];
    assert.equal(job.metadata?.labels?.["paperclip.io/session-id"], "sess-0");
    assert.equal(job.metadata?.annotations?.["paperclip.io/working-dir"], "/paperclip/wt");
  });
});

describe("testEnvironment", () => {
  it("passes when the webhook mutates a dry run, RBAC allows, and the relay takes the token", async () => {
    const adapter = createClipjobAdapter(CLAUDE_ADAPTER, deps());
    const r = await adapter.testEnvironment({
      companyId: "company-1",
      adapterType: "claude_k8s",
      config: {},
    });
    assert.equal(r.status, "pass", JSON.stringify(r.checks, null, 2));
    assert.deepEqual(
      r.checks.map((c) => c.code),
      ["clipjob_kube_config", "clipjob_rbac", "clipjob_webhook", "clipjob_created_by", "clipjob_relay"],
    );
    assert.ok(kube.calls.some((c) => c.startsWith("dry-run job")));
    assert.equal(kube.jobs.size, 0);
  });

  it("fails naming what is wrong", async () => {
    kube.denied.add("delete jobs");
    kube.onDryRun = () => {
      throw statusError(500, "InternalError", 'failed calling webhook "mjob.clipjob.paperclip.io": connection refused');
    };
    const adapter = createClipjobAdapter(CLAUDE_ADAPTER, deps({ CLIPJOB_RELAY_URL: "http://127.0.0.1:9" }));
    const r = await adapter.testEnvironment({ companyId: "company-1", adapterType: "claude_k8s", config: {} });
    assert.equal(r.status, "fail");
    const byCode = Object.fromEntries(r.checks.map((c) => [c.code, c]));
    assert.equal(byCode.clipjob_rbac.level, "error");
    assert.match(byCode.clipjob_rbac.message, /delete jobs/);
    assert.equal(byCode.clipjob_webhook.level, "error");
    assert.match(byCode.clipjob_webhook.message, /could not be called/);
    assert.equal(byCode.clipjob_relay.level, "error");
  });

  it("names a kubeconfig it cannot use, through the server's real client", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kubeconfig-"));
    const file = join(dir, "kubeconfig");
    writeFileSync(
      file,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]",
        "contexts: [{name: c, context: {cluster: c, user: u}}]",
        "current-context: c",
        "users:",
        "- name: u",
        "  user:",
        "    tokenFile: /var/run/secrets/token",
        "",
      ].join("\n"),
    );
    const { kube: _fake, ...real } = deps({ CLIPJOB_KUBECONFIG: file });
    const r = await createClipjobAdapter(CLAUDE_ADAPTER, real).testEnvironment({ companyId: "company-1", adapterType: "claude_k8s", config: {} });
    assert.equal(r.status, "fail");
    const check = r.checks.find((c) => c.code === "clipjob_kube_config");
    assert.equal(check?.level, "error");
    assert.match(check?.message ?? "", /tokenFile \(the key is token-file\)/);
  });

  it("warns when clipjob records no creator, and fails on settings that cannot be used", async () => {
    kube.onDryRun = (job) => ({ ...job, metadata: { ...job.metadata, annotations: { "clipjob.paperclip.io/profile": "claude_local" } }, spec: { template: { spec: { containers: [{ name: "agent" }] } } } });
    const adapter = createClipjobAdapter(CLAUDE_ADAPTER, deps());
    const r = await adapter.testEnvironment({ companyId: "company-1", adapterType: "claude_k8s", config: { relayUrl: "http://attacker.example" } });
    const byCode = Object.fromEntries(r.checks.map((c) => [c.code, c]));
    assert.equal(byCode.clipjob_created_by.level, "warn");
    assert.match(byCode.clipjob_created_by.message, /will not re-attach/);
    assert.equal(byCode.clipjob_config.level, "warn", "the agent's relayUrl is ignored");

    const bad = createClipjobAdapter(CLAUDE_ADAPTER, deps({ CLIPJOB_RELAY_URL: "http://relay.clipjob-system.svc" }));
    const r2 = await bad.testEnvironment({ companyId: "company-1", adapterType: "claude_k8s", config: {} });
    assert.equal(r2.status, "fail");
    assert.match(r2.checks.find((c) => c.level === "error")?.message ?? "", /must be https/);
  });
});
