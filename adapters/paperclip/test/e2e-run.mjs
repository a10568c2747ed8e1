#!/usr/bin/env node
// Runs one Paperclip run through the built adapter against a real API
// server and relay, for clipjob's Go end-to-end tests. It plays the
// Paperclip server: a fake run context whose callbacks print what the
// adapter hands on, one JSON object per line on stdout:
//
//   {"stream":"stdout","line":"..."}   each onLog call (the chunk less its final newline)
//   {"meta":{...}}                     the onMeta call
//   {"result":{...}}                   what execute() returned, last
//   {"environment":{...}}              what testEnvironment() returned (mode "testEnvironment")
//
// The spec is a JSON object, given as the first argument (inline, or the
// path of a file holding it) or in CLIPJOB_E2E_SPEC:
//
//   kubeconfig, namespace, relayUrl, relayTokenFile, relayCaFile   where things are, handed
//                  to the adapter as the server's environment (CLIPJOB_KUBECONFIG, …)
//   mode?          "execute" (default) or "testEnvironment"
//   agentId, runId, companyId?, taskId?                            the run
//   prompt                                                          rendered as Paperclip's prompt template
//   cancelAfterMs?                                                  abort the run this long after it starts (by hand;
//                  a test cancels with cancelOnStdinEnd, after what it waits for, never on a clock)
//   cancelOnStdinEnd?                                               abort the run when stdin ends: the driver keeps
//                  it open and closes it to cancel
//   adapter?        "claude" (default) or "opencode"
//   authToken?      the run's callback token (default "e2e-run-token")
//   sessionId?      a session to resume
//   config?         more adapterConfig keys, e.g. {"promptAnnotationMaxBytes": 16}
//
// Build first (npm ci && npm run build). Exit status 0 once a result was
// printed, whatever it says; 2 for a bad spec.

import { readFileSync } from "node:fs";

const { createClipjobAdapter, CLAUDE_ADAPTER, OPENCODE_ADAPTER } = await import(new URL("../dist/src/index.js", import.meta.url).href);

function readSpec() {
  const raw = process.argv[2] ?? process.env.CLIPJOB_E2E_SPEC;
  if (!raw) throw new Error("no spec: pass it as the first argument or in CLIPJOB_E2E_SPEC");
  return JSON.parse(raw.trimStart().startsWith("{") ? raw : readFileSync(raw, "utf8"));
}

let spec;
try {
  spec = readSpec();
  const required = spec.mode === "testEnvironment" ? ["namespace", "relayUrl", "relayTokenFile"] : ["namespace", "relayUrl", "relayTokenFile", "agentId", "runId", "prompt"];
  for (const key of required) {
    if (typeof spec[key] !== "string" || spec[key] === "") throw new Error(`spec.${key} is required`);
  }
} catch (err) {
  process.stderr.write(`e2e-run: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(2);
}

const emit = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);
const definition = spec.adapter === "opencode" ? OPENCODE_ADAPTER : CLAUDE_ADAPTER;
// Where the server's credentials go is the server's environment, as in a
// Paperclip pod; the agent's config cannot say.
Object.assign(process.env, {
  CLIPJOB_NAMESPACE: spec.namespace,
  CLIPJOB_RELAY_URL: spec.relayUrl,
  CLIPJOB_RELAY_TOKEN_FILE: spec.relayTokenFile,
  CLIPJOB_KUBECONFIG: spec.kubeconfig ?? "",
  CLIPJOB_RELAY_CA_FILE: spec.relayCaFile ?? "",
});
const adapter = createClipjobAdapter(definition);

if (spec.mode === "testEnvironment") {
  emit({ environment: await adapter.testEnvironment({ companyId: spec.companyId ?? "e2e-company", adapterType: definition.type, config: spec.config ?? {} }) });
  process.exit(0);
}

const abort = new AbortController();
if (typeof spec.cancelAfterMs === "number") setTimeout(() => abort.abort(), spec.cancelAfterMs).unref();
if (spec.cancelOnStdinEnd === true) {
  process.stdin.on("end", () => abort.abort());
  process.stdin.resume();
}

const ctx = {
  runId: spec.runId,
  agent: { id: spec.agentId, companyId: spec.companyId ?? "e2e-company", name: "e2e agent", adapterType: definition.type, adapterConfig: {} },
  runtime: {
    sessionId: spec.sessionId ?? null,
    sessionParams: spec.sessionId ? { sessionId: spec.sessionId } : null,
    sessionDisplayId: spec.sessionId ?? null,
    taskKey: null,
  },
  config: {
    promptTemplate: spec.prompt,
    ...(spec.config ?? {}),
  },
  context: spec.taskId ? { taskId: spec.taskId } : {},
  authToken: spec.authToken ?? "e2e-run-token",
  signal: abort.signal,
  onCancellationReady: async () => {},
  onLog: async (stream, chunk) => emit({ stream, line: chunk.endsWith("\n") ? chunk.slice(0, -1) : chunk }),
  onMeta: async (meta) => emit({ meta }),
};

const result = await adapter.execute(ctx);
emit({ result });
// Nothing left to cancel: an open stdin must not keep the script alive.
if (spec.cancelOnStdinEnd === true) process.stdin.destroy();
