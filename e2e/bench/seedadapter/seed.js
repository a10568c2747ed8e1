// make bench's baseline for "what the user feels": a Paperclip adapter that
// runs an agent run the way the seed claude-k8s adapter does (described in
// docs/paperclip.md and the seed's public repository), so that clipjob's
// adapter can be measured beside it, through the same Paperclip server, in
// the same bench run. It is not clipjob's and not for use: it holds only
// what decides how soon a run's first line reaches Paperclip's run log.
//
// What it does per run, as the seed does:
//   - lists the agent's Jobs first (the seed's concurrency guard: one
//     request per run);
//   - builds the complete Job on the client (no webhook is involved: it
//     runs in a namespace clipjob's webhooks do not select): an init
//     container writes the prompt to an emptyDir, the agent CLI reads it
//     and its stream-json is tee'd to the shared volume, the volume at
//     /paperclip, the seed's security context, resources and TTL;
//   - waits for the pod by listing it every 2 s until it runs;
//   - then reads the agent's output, one of two ways (mode):
//       "file": the seed's tail since its v0.2: the tee'd file on the
//               shared volume, looked for every 2 s, then read every
//               250 ms, every 1 s after 5 reads found nothing new;
//       "api":  the seed's earlier way (and opencode-k8s's): the
//               Kubernetes log API, followed;
//   - polls the Job every 2 s for its end, reads the leftovers, deletes the
//     Job (propagation Background) and the file.
// Not here, because a short run never reaches them: the keepalive, the
// cancellation poll, the large-prompt Secret, the self-introspection
// (the server here is not a pod: the bench gives the image, the claim and
// the placement instead; the seed caches its introspection anyway).
//
// The cluster is reached with Node's own https (the seed uses
// @kubernetes/client-node), so the package needs nothing installed. Its
// settings come from the JSON file named by $BENCH_SEED_SETTINGS:
// {server, tokenFile, caFile, namespace, image, claim, nodeSelector,
// tolerations}.

import https from "node:https";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { open, stat, unlink } from "node:fs/promises";

// The seed's intervals.
const POD_POLL_MS = 2000;
const JOB_POLL_MS = 2000;
const FILE_WAIT_POLL_MS = 2000;
const FILE_WAIT_TIMEOUT_MS = 30_000;
const TAIL_ACTIVE_MS = 250;
const TAIL_IDLE_MS = 1000;
const TAIL_IDLE_THRESHOLD = 5;
const POD_TIMEOUT_MS = 120_000;

let loaded;

function settings() {
  if (!loaded) {
    const file = process.env.BENCH_SEED_SETTINGS;
    if (!file) throw new Error("BENCH_SEED_SETTINGS is not set: the bench's baseline adapter needs its settings file");
    const s = JSON.parse(readFileSync(file, "utf8"));
    const ca = readFileSync(s.caFile);
    loaded = { ...s, ca, token: readFileSync(s.tokenFile, "utf8").trim(), agent: new https.Agent({ keepAlive: true, ca }) };
  }
  return loaded;
}

// headers: a body's length is always given, since Node sends a DELETE's
// body unframed otherwise and the API server reads it as the next request
// on the connection.
function headers(s, body) {
  return {
    Authorization: `Bearer ${s.token}`,
    Accept: "application/json",
    ...(body ? { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) } : {}),
  };
}

// kube is one request to the API server; a status of 300 or more throws,
// with statusCode set.
function kube(method, path, body) {
  const s = settings();
  return new Promise((resolve, reject) => {
    const data = body ? JSON.stringify(body) : undefined;
    const req = https.request(new URL(path, s.server), { method, agent: s.agent, headers: headers(s, data) }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        if (res.statusCode >= 300) {
          const err = new Error(`${method} ${path}: ${res.statusCode} ${text.slice(0, 400)}`);
          err.statusCode = res.statusCode;
          reject(err);
          return;
        }
        try {
          resolve(text ? JSON.parse(text) : {});
        } catch (err) {
          reject(err);
        }
      });
    });
    req.on("error", reject);
    if (data) req.write(data);
    req.end();
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function labelValue(v) {
  return String(v).replace(/[^A-Za-z0-9._-]/g, "").slice(0, 63).replace(/^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g, "");
}

function slug(v, n) {
  return String(v).toLowerCase().replace(/[^a-z0-9]/g, "").slice(0, n) || "x";
}

function shellQuote(s) {
  return `'${String(s).replace(/'/g, `'\\''`)}'`;
}

export function podLogPath(companyId, agentId, runId) {
  return `/paperclip/instances/default/data/run-logs/${companyId}/${agentId}/${runId}.pod.ndjson`;
}

// buildJob is the complete Job, as the seed builds it.
export function buildJob({ type, namespace, image, claim, nodeSelector, tolerations, agent, runId, prompt }) {
  const hash = createHash("sha256").update(`${agent.id}:${runId}`).digest("hex").slice(0, 6);
  const name = `ac-${slug(agent.id, 16)}-${slug(runId, 16)}-${hash}`;
  const labels = {
    "app.kubernetes.io/managed-by": "paperclip",
    "app.kubernetes.io/component": "agent-job",
    "paperclip.io/agent-id": labelValue(agent.id),
    "paperclip.io/run-id": labelValue(runId),
    "paperclip.io/company-id": labelValue(agent.companyId),
    "paperclip.io/adapter-type": labelValue(type),
  };
  const logPath = podLogPath(agent.companyId, agent.id, runId);
  const dir = logPath.slice(0, logPath.lastIndexOf("/"));
  const containerSecurity = {
    capabilities: { drop: ["ALL"] },
    readOnlyRootFilesystem: false,
    runAsNonRoot: true,
    runAsUser: 1000,
    allowPrivilegeEscalation: false,
  };
  const job = {
    apiVersion: "batch/v1",
    kind: "Job",
    metadata: { name, namespace, labels, annotations: { "paperclip.io/adapter-type": type, "paperclip.io/agent-name": String(agent.name ?? "") } },
    spec: {
      backoffLimit: 0,
      ttlSecondsAfterFinished: 300,
      template: {
        metadata: { labels },
        spec: {
          restartPolicy: "Never",
          ...(nodeSelector ? { nodeSelector } : {}),
          ...(tolerations ? { tolerations } : {}),
          securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000, fsGroupChangePolicy: "OnRootMismatch" },
          initContainers: [
            {
              name: "write-prompt",
              image,
              imagePullPolicy: "IfNotPresent",
              command: ["sh", "-c", `printf '%s' "$PROMPT_CONTENT" > /tmp/prompt/prompt.txt`],
              env: [{ name: "PROMPT_CONTENT", value: prompt }],
              volumeMounts: [{ name: "prompt", mountPath: "/tmp/prompt" }],
              resources: { requests: { cpu: "10m", memory: "16Mi" }, limits: { cpu: "100m", memory: "64Mi" } },
              securityContext: containerSecurity,
            },
          ],
          containers: [
            {
              name: "claude",
              image,
              imagePullPolicy: "IfNotPresent",
              workingDir: "/paperclip",
              command: [
                "sh",
                "-c",
                `mkdir -p ${shellQuote(dir)} && cat /tmp/prompt/prompt.txt | claude '--print' '-' '--output-format' 'stream-json' '--verbose' | tee ${shellQuote(logPath)}`,
              ],
              env: [
                { name: "PAPERCLIP_AGENT_ID", value: agent.id },
                { name: "PAPERCLIP_COMPANY_ID", value: agent.companyId },
                { name: "PAPERCLIP_RUN_ID", value: runId },
                { name: "HOME", value: "/paperclip" },
              ],
              volumeMounts: [
                { name: "prompt", mountPath: "/tmp/prompt" },
                { name: "data", mountPath: "/paperclip" },
              ],
              resources: { requests: { cpu: "1000m", memory: "2Gi" }, limits: { cpu: "4000m", memory: "8Gi" } },
              securityContext: containerSecurity,
            },
          ],
          volumes: [
            { name: "prompt", emptyDir: {} },
            { name: "data", persistentVolumeClaim: { claimName: claim } },
          ],
        },
      },
    },
  };
  return { job, name, logPath };
}

function jobsPath(ns) {
  return `/apis/batch/v1/namespaces/${encodeURIComponent(ns)}/jobs`;
}

function ended(job) {
  return (job.status?.conditions ?? []).find((c) => (c.type === "Complete" || c.type === "Failed") && c.status === "True");
}

async function jobPod(ns, jobName) {
  const list = await kube("GET", `/api/v1/namespaces/${encodeURIComponent(ns)}/pods?labelSelector=${encodeURIComponent(`job-name=${jobName}`)}`);
  return list.items?.[0];
}

// waitForPod lists the Job's pod every 2 s until it runs (or has ended).
async function waitForPod(ns, jobName, onLog) {
  const deadline = Date.now() + POD_TIMEOUT_MS;
  await onLog("stdout", `[paperclip] Waiting for pod to be scheduled (job: ${jobName})...\n`);
  while (Date.now() < deadline) {
    const pod = await jobPod(ns, jobName);
    if (pod) {
      const phase = pod.status?.phase;
      const inits = pod.status?.initContainerStatuses ?? [];
      const mains = pod.status?.containerStatuses ?? [];
      if (phase === "Running" || phase === "Succeeded" || phase === "Failed") return pod.metadata.name;
      if (inits.length > 0 && inits.every((s) => s.state?.terminated?.exitCode === 0) && mains.some((s) => s.state?.running)) {
        return pod.metadata.name;
      }
      for (const s of [...inits, ...mains]) {
        const t = s.state?.terminated;
        if (t && t.exitCode !== 0) throw new Error(`container ${s.name} failed with exit code ${t.exitCode}`);
        const why = s.state?.waiting?.reason;
        if (why === "ErrImagePull" || why === "ImagePullBackOff" || why === "CrashLoopBackOff") throw new Error(`container ${s.name}: ${why}`);
      }
      const unschedulable = (pod.status?.conditions ?? []).find((c) => c.type === "PodScheduled" && c.status === "False" && c.reason === "Unschedulable");
      if (unschedulable) throw new Error(`pod unschedulable: ${unschedulable.message}`);
    }
    await sleep(POD_POLL_MS);
  }
  throw new Error(`timed out waiting for the pod of ${jobName}`);
}

// waitForJobEnd reads the Job every 2 s until it has ended.
async function waitForJobEnd(ns, jobName) {
  for (;;) {
    let job;
    try {
      job = await kube("GET", `${jobsPath(ns)}/${jobName}`);
    } catch (err) {
      if (err.statusCode === 404) return { succeeded: false, gone: true };
      throw err;
    }
    const end = ended(job);
    if (end) return { succeeded: end.type === "Complete", gone: false };
    await sleep(JOB_POLL_MS);
  }
}

// lineSplitter hands complete lines to onLine, keeping a partial one.
function lineSplitter(onLine) {
  let pending = "";
  return {
    async push(text) {
      const parts = (pending + text).split("\n");
      pending = parts.pop() ?? "";
      for (const line of parts) await onLine(line);
    },
    async flush() {
      if (pending) await onLine(pending);
      pending = "";
    },
  };
}

// tailFile reads the tee'd file as the seed does.
async function tailFile(file, emit, stop) {
  const deadline = Date.now() + FILE_WAIT_TIMEOUT_MS;
  for (;;) {
    try {
      await stat(file);
      break;
    } catch {
      if (stop.stopped || Date.now() > deadline) break;
      await sleep(FILE_WAIT_POLL_MS);
    }
  }
  let offset = 0;
  let idle = 0;
  const lines = lineSplitter(emit);
  // A fresh handle per read, as the seed opens one (a held one can see a
  // stale size on a network file system).
  const drain = async () => {
    let fh;
    try {
      fh = await open(file, "r");
      const { size } = await fh.stat();
      if (size <= offset) return false;
      const buf = Buffer.alloc(size - offset);
      const { bytesRead } = await fh.read(buf, 0, buf.length, offset);
      offset += bytesRead;
      await lines.push(buf.subarray(0, bytesRead).toString("utf8"));
      return bytesRead > 0;
    } catch {
      return false;
    } finally {
      await fh?.close().catch(() => {});
    }
  };
  while (!stop.stopped) {
    idle = (await drain()) ? 0 : idle + 1;
    if (stop.stopped) break;
    await sleep(idle >= TAIL_IDLE_THRESHOLD ? TAIL_IDLE_MS : TAIL_ACTIVE_MS);
  }
  while (await drain()) {
    // until nothing more arrives
  }
  await lines.flush();
}

// followLog follows the container's log through the API server until the
// container ends (the kubelet closes the stream) and the Job has ended.
async function followLog(ns, pod, emit, stop) {
  const s = settings();
  const lines = lineSplitter(emit);
  let chain = Promise.resolve();
  await new Promise((resolve) => {
    const path = `/api/v1/namespaces/${encodeURIComponent(ns)}/pods/${encodeURIComponent(pod)}/log?container=claude&follow=true`;
    const req = https.request(new URL(path, s.server), { method: "GET", ca: s.ca, agent: false, headers: headers(s) }, (res) => {
      if (res.statusCode >= 300) {
        res.resume();
        resolve();
        return;
      }
      res.setEncoding("utf8");
      res.on("data", (text) => {
        chain = chain.then(() => lines.push(text));
      });
      res.on("end", resolve);
      res.on("close", resolve);
      res.on("error", resolve);
    });
    req.on("error", resolve);
    req.end();
  });
  await chain;
  while (!stop.stopped) await sleep(100);
  await lines.flush();
}

// parseStreamJson reads what Paperclip records of a Claude run.
export function parseStreamJson(lines) {
  const out = { sessionId: null, model: null, summary: null, usage: null, costUsd: null, isError: false, texts: [] };
  for (const line of lines) {
    let ev;
    try {
      ev = JSON.parse(line);
    } catch {
      continue;
    }
    if (ev.type === "system" && ev.subtype === "init") {
      out.sessionId = ev.session_id ?? out.sessionId;
      out.model = ev.model ?? out.model;
    } else if (ev.type === "assistant") {
      for (const c of ev.message?.content ?? []) if (c.type === "text") out.texts.push(c.text);
    } else if (ev.type === "result") {
      out.sessionId = ev.session_id ?? out.sessionId;
      out.summary = ev.result ?? null;
      out.costUsd = ev.total_cost_usd ?? null;
      out.isError = !!ev.is_error;
      const u = ev.usage ?? {};
      out.usage = { inputTokens: u.input_tokens ?? 0, outputTokens: u.output_tokens ?? 0, cachedInputTokens: u.cache_read_input_tokens ?? 0 };
    }
  }
  return out;
}

async function execute(type, mode, ctx) {
  const s = settings();
  const { runId, agent, onLog } = ctx;
  const ns = s.namespace;
  const selector = `paperclip.io/agent-id=${labelValue(agent.id)},paperclip.io/adapter-type=${labelValue(type)}`;
  const existing = await kube("GET", `${jobsPath(ns)}?labelSelector=${encodeURIComponent(selector)}`);
  const busy = (existing.items ?? []).filter((j) => !ended(j) && !j.metadata?.deletionTimestamp);
  if (busy.length > 0) {
    return {
      exitCode: null,
      signal: null,
      timedOut: false,
      errorCode: "k8s_concurrent_run_blocked",
      errorMessage: `Job ${busy.map((j) => j.metadata.name).join(", ")} is still running for this agent`,
    };
  }
  const prompt = String(ctx.config?.promptTemplate ?? "");
  const { job, name, logPath } = buildJob({ type, namespace: ns, image: s.image, claim: s.claim, nodeSelector: s.nodeSelector, tolerations: s.tolerations, agent, runId, prompt });
  await kube("POST", jobsPath(ns), job);
  const stdout = [];
  const emit = async (line) => {
    stdout.push(line);
    await onLog("stdout", line + "\n");
  };
  try {
    const pod = await waitForPod(ns, name, onLog);
    await onLog("stdout", `[paperclip] Pod running: ${pod}\n`);
    const stop = { stopped: false };
    const end = waitForJobEnd(ns, name).finally(() => {
      stop.stopped = true;
    });
    const [, done] = await Promise.all([mode === "file" ? tailFile(logPath, emit, stop) : followLog(ns, pod, emit, stop), end]);
    const last = await jobPod(ns, name).catch(() => undefined);
    const exitCode = last?.status?.containerStatuses?.find((c) => c.name === "claude")?.state?.terminated?.exitCode ?? (done.succeeded ? 0 : null);
    const parsed = parseStreamJson(stdout);
    const failed = exitCode !== 0 || parsed.isError;
    return {
      exitCode,
      signal: null,
      timedOut: false,
      errorMessage: failed ? `the agent exited with ${exitCode}` : null,
      ...(parsed.usage ? { usage: parsed.usage } : {}),
      sessionId: parsed.sessionId,
      sessionDisplayId: parsed.sessionId,
      provider: "anthropic",
      model: parsed.model,
      billingType: "unknown",
      costUsd: parsed.costUsd,
      summary: parsed.summary,
      resultJson: { summary: parsed.summary },
    };
  } finally {
    await kube("DELETE", `${jobsPath(ns)}/${name}`, { propagationPolicy: "Background" }).catch(() => {});
    await unlink(logPath).catch(() => {});
  }
}

export function createSeedAdapter(type, mode) {
  return {
    type,
    execute: (ctx) => execute(type, mode, ctx),
    testEnvironment: async () => ({ adapterType: type, status: "pass", checks: [], testedAt: new Date().toISOString() }),
  };
}
