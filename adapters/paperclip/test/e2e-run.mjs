#!/usr/bin/env node
// Runs one Paperclip run through the built adapter against a real API
// server and relay, for clipjob's Go end-to-end tests. It plays the
// Paperclip server: a fake run context whose callbacks print what the
// adapter hands on, one JSON object per line on stdout:
//
//   {"stream":"stdout","line":"..."}   each onLog call (the chunk less its final newline)
//   {"meta":{...}}                     the onMeta call
//   {"result":{...}}                   what execute() returned, last
//
// The spec is a JSON object, given as the first argument (inline, or the
// path of a file holding it) or in CLIPJOB_E2E_SPEC:
//
//   kubeconfig, namespace, relayUrl, relayTokenFile, relayCaFile   where things are
//   agentId, runId, companyId?, taskId?                            the run
//   prompt                                                          rendered as Paperclip's prompt template
//   cancelAfterMs?                                                  abort the run this long after it starts
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
  for (const key of ["namespace", "relayUrl", "relayTokenFile", "agentId", "runId", "prompt"]) {
    if (typeof spec[key] !== "string" || spec[key] === "") throw new Error(`spec.${key} is required`);
  }
} catch (err) {
  process.stderr.write(`e2e-run: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(2);
}

const emit = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);
const definition = spec.adapter === "opencode" ? OPENCODE_ADAPTER : CLAUDE_ADAPTER;
const adapter = createClipjobAdapter(definition);

const abort = new AbortController();
if (typeof spec.cancelAfterMs === "number") setTimeout(() => abort.abort(), spec.cancelAfterMs).unref();

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
    namespace: spec.namespace,
    relayUrl: spec.relayUrl,
    relayTokenFile: spec.relayTokenFile,
    ...(spec.kubeconfig ? { kubeconfig: spec.kubeconfig } : {}),
    ...(spec.relayCaFile ? { relayCaFile: spec.relayCaFile } : {}),
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
