#!/usr/bin/env node
// clipjob-paperclip-first-run: a first agent run through clipjob, from
// inside the Paperclip server's pod, in one command:
//
//   kubectl -n paperclip exec deploy/paperclip -- clipjob-paperclip-first-run
//
// It waits for the server to answer healthy (a first start makes its
// database), makes a company and an agent of this package's type
// (claude_k8s by default), wakes it as the board's "Run now" does, and
// prints the run's log as Paperclip records it, line by line, until the
// run ends. It talks to the server on the pod's loopback, where a server
// in local_trusted mode asks for no login; an authenticated server needs
// a board token (PAPERCLIP_API_KEY).

import fs from "node:fs";
import { fileURLToPath } from "node:url";

export interface FirstRunOptions {
  url: string;
  company: string;
  agent: string;
  adapterType: string;
  /** The agent's prompt template; unset, the adapter's default. */
  prompt?: string;
  /** A board API key for an authenticated server. */
  apiKey?: string;
  /** How long to wait for the server to answer healthy. */
  healthTimeoutMs: number;
  pollMs: number;
  out: (line: string) => void;
}

export interface FirstRunResult {
  companyId: string;
  agentId: string;
  runId: string;
  status: string;
  lines: number;
}

const ENDED = new Set(["succeeded", "failed", "cancelled", "timed_out", "interrupted"]);

async function call(o: FirstRunOptions, method: string, path: string, body?: unknown, notFound?: unknown): Promise<any> {
  const headers: Record<string, string> = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (o.apiKey) headers.authorization = `Bearer ${o.apiKey}`;
  const res = await fetch(o.url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  if (res.status === 404 && notFound !== undefined) return notFound;
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text.slice(0, 300)}`);
  return text ? JSON.parse(text) : undefined;
}

/**
 * s with its control characters (C0 but tab, DEL, C1) written as \xNN:
 * the lines are the agent's, printed to the operator's terminal, where an
 * escape sequence could set the clipboard or the title, or a carriage
 * return rewrite what the terminal shows.
 */
export function visible(s: string): string {
  return s.replace(/[\x00-\x08\x0a-\x1f\x7f-\x9f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until the server answers GET /api/health with status ok. */
async function waitHealthy(o: FirstRunOptions): Promise<void> {
  const deadline = Date.now() + o.healthTimeoutMs;
  let last = "";
  let said = false;
  for (;;) {
    try {
      const h = await call(o, "GET", "/api/health");
      if (h?.status === "ok") return;
      last = `status ${h?.status}`;
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
    }
    if (Date.now() > deadline) throw new Error(`Paperclip at ${o.url} did not answer healthy (last: ${last})`);
    if (!said) {
      o.out(`waiting for Paperclip at ${o.url} (a first start makes its database)`);
      said = true;
    }
    await sleep(o.pollMs);
  }
}

export async function firstRun(o: FirstRunOptions): Promise<FirstRunResult> {
  await waitHealthy(o);
  const company = await call(o, "POST", "/api/companies", { name: o.company });
  const agent = await call(o, "POST", `/api/companies/${company.id}/agents`, { name: o.agent, adapterType: o.adapterType, adapterConfig: {} });
  // Paperclip refuses prompt templates when it makes an agent of an
  // adapter with managed instructions; they are set by an edit after.
  if (o.prompt) await call(o, "PATCH", `/api/agents/${agent.id}`, { adapterConfig: { promptTemplate: o.prompt } });
  o.out(`company ${company.id} (${o.company}), agent ${agent.id} (${o.agent}, ${o.adapterType})`);
  const run = await call(o, "POST", `/api/agents/${agent.id}/wakeup`, { source: "on_demand", triggerDetail: "manual", reason: "first run" });
  if (!run?.id) throw new Error(`the wakeup queued no run: ${JSON.stringify(run)}`);
  o.out(`run ${run.id} queued; its lines as they reach Paperclip's run log:`);
  let offset = 0;
  let lines = 0;
  let status = "";
  for (;;) {
    const r = await call(o, "GET", `/api/heartbeat-runs/${run.id}`);
    status = r?.status ?? "";
    // Read the log after the status: a run that ended has all its lines.
    for (;;) {
      // Paperclip answers 404 until the run has written its log, and
      // gives a nextOffset only while more is left past the read's limit.
      const log = await call(o, "GET", `/api/heartbeat-runs/${run.id}/log?offset=${offset}&limitBytes=1048576`, undefined, {});
      const content = String(log?.content ?? "");
      // Whole records only: one being written, or cut by the limit, is
      // read again from its start at the next read.
      const whole = content.slice(0, content.lastIndexOf("\n") + 1);
      for (const record of whole.split("\n")) {
        if (!record.trim()) continue;
        let parsed: { stream?: string; chunk?: string };
        try {
          parsed = JSON.parse(record);
        } catch {
          continue; // not a record of the run's log
        }
        if (typeof parsed.chunk !== "string") continue;
        for (const line of parsed.chunk.replace(/\n$/, "").split("\n")) o.out(`${visible(parsed.stream ?? "?")}: ${visible(line)}`);
        lines++;
      }
      offset += Buffer.byteLength(whole);
      if (!whole || typeof log?.nextOffset !== "number") break;
    }
    if (ENDED.has(status)) break;
    await sleep(o.pollMs);
  }
  o.out(`run ${run.id}: ${status}`);
  return { companyId: company.id, agentId: agent.id, runId: run.id, status, lines };
}

function flag(args: string[], name: string): string | undefined {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : undefined;
}

async function main(args: string[]): Promise<number> {
  const port = process.env.PORT ?? "3100";
  const result = await firstRun({
    url: flag(args, "url") ?? `http://127.0.0.1:${port}`,
    company: flag(args, "company") ?? "First Company",
    agent: flag(args, "agent") ?? "First Agent",
    adapterType: flag(args, "adapter-type") ?? "claude_k8s",
    prompt: flag(args, "prompt"),
    apiKey: process.env.PAPERCLIP_API_KEY,
    healthTimeoutMs: 10 * 60_000,
    pollMs: 250,
    out: (line) => console.log(line),
  });
  return result.status === "succeeded" ? 0 : 1;
}

// Run when executed (the bin, a symlink to this file), not when imported.
if (process.argv[1] && fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      console.error(`clipjob-paperclip-first-run: ${err instanceof Error ? err.message : String(err)}`);
      process.exit(1);
    },
  );
}
