import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { describe, it } from "node:test";

import { firstRun } from "../src/firstrun.js";

// A Paperclip server as the first run meets it: unhealthy at first (its
// database being made), then the calls the board makes, and a run whose
// log grows while it runs.
function fakePaperclip(
  records = [
    { stream: "stdout", chunk: "line 1\n" },
    { stream: "stderr", chunk: "warn\n" },
    { stream: "stdout", chunk: "line 2\nline 3\n" },
  ],
): Promise<{ url: string; calls: string[]; bodies: Record<string, unknown>; close: () => void }> {
  const calls: string[] = [];
  const bodies: Record<string, unknown> = {};
  let health = 0;
  let polls = 0;
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const url = new URL(req.url ?? "/", "http://x");
      const key = `${req.method} ${url.pathname}`;
      if (!key.endsWith("/log") && !key.startsWith("GET /api/heartbeat-runs/")) calls.push(key);
      if (body) bodies[key] = JSON.parse(body);
      const json = (v: unknown, code = 200) => {
        res.writeHead(code, { "content-type": "application/json" });
        res.end(JSON.stringify(v));
      };
      switch (key) {
        case "GET /api/health":
          return ++health < 3 ? json({ error: "starting" }, 503) : json({ status: "ok" });
        case "POST /api/companies":
          return json({ id: "c1" });
        case "POST /api/companies/c1/agents":
          return json({ id: "a1" });
        case "PATCH /api/agents/a1":
          return json({ id: "a1" });
        case "POST /api/agents/a1/wakeup":
          return json({ id: "r1", status: "queued" });
        case "GET /api/heartbeat-runs/r1":
          polls++;
          return json({ id: "r1", status: polls < 5 ? "running" : "succeeded" });
        case "GET /api/heartbeat-runs/r1/log": {
          // As Paperclip: no log at all until the run has written one;
          // then from offset, at most limitBytes, with a nextOffset only
          // while more is left. One more record each poll, the newest
          // half written until the next.
          if (polls < 2) return json({ error: "Run log not found" }, 404);
          const n = Math.min(polls - 1, records.length);
          let have = records.slice(0, n).map((r) => JSON.stringify(r) + "\n").join("");
          if (n < records.length) have += JSON.stringify(records[n]).slice(0, 10);
          const offset = Number(url.searchParams.get("offset") ?? 0);
          const limit = Number(url.searchParams.get("limitBytes") ?? 1 << 20);
          const content = have.slice(offset, offset + limit);
          return json({ content, nextOffset: offset + limit < have.length ? offset + limit : undefined });
        }
      }
      json({ error: "not found" }, 404);
    });
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, calls, bodies, close: () => server.close() }),
    ),
  );
}

describe("clipjob-paperclip-first-run", () => {
  it("waits for the server, makes a company and an agent, wakes it and prints every line of its run once", async () => {
    const pc = await fakePaperclip();
    const out: string[] = [];
    try {
      const r = await firstRun({ url: pc.url, company: "Acme", agent: "Builder", adapterType: "claude_k8s", prompt: "lines=3",
        healthTimeoutMs: 10_000, pollMs: 10, out: (l) => out.push(l) });
      assert.deepEqual(r, { companyId: "c1", agentId: "a1", runId: "r1", status: "succeeded", lines: 3 });
      assert.deepEqual(pc.calls, ["GET /api/health", "GET /api/health", "GET /api/health", "POST /api/companies",
        "POST /api/companies/c1/agents", "PATCH /api/agents/a1", "POST /api/agents/a1/wakeup"]);
      assert.deepEqual(pc.bodies["POST /api/companies/c1/agents"], { name: "Builder", adapterType: "claude_k8s", adapterConfig: {} });
      assert.deepEqual(pc.bodies["PATCH /api/agents/a1"], { adapterConfig: { promptTemplate: "lines=3" } });
      assert.deepEqual(out.filter((l) => /^(stdout|stderr):/.test(l)), ["stdout: line 1", "stderr: warn", "stdout: line 2", "stdout: line 3"]);
      assert.equal(out.at(-1), "run r1: succeeded");
    } finally {
      pc.close();
    }
  });

  // The operator runs it in a terminal (kubectl exec), and the lines are
  // the agent's: an agent's escape sequences would set the terminal's
  // clipboard (OSC 52) or title, or rewrite what it shows (a carriage
  // return, a cleared line) to fake the run's end.
  it("prints an agent's control characters escaped, so its lines cannot drive the operator's terminal", async () => {
    const pc = await fakePaperclip([
      { stream: "stdout", chunk: "\x1b]52;c;ZXZpbA==\x07copied\n" },
      { stream: "stdout", chunk: "work\r\x1b[2Krun r1: succeeded\n" },
      { stream: "stderr", chunk: "\x9b2J\tkept tab\x7f\n" },
    ]);
    const out: string[] = [];
    try {
      await firstRun({ url: pc.url, company: "Acme", agent: "Builder", adapterType: "claude_k8s",
        healthTimeoutMs: 10_000, pollMs: 10, out: (l) => out.push(l) });
      assert.deepEqual(out.filter((l) => /^(stdout|stderr):/.test(l)), [
        "stdout: \\x1b]52;c;ZXZpbA==\\x07copied",
        "stdout: work\\x0d\\x1b[2Krun r1: succeeded",
        "stderr: \\x9b2J\tkept tab\\x7f",
      ]);
    } finally {
      pc.close();
    }
  });

  it("names the server when it never answers healthy", async () => {
    await assert.rejects(
      firstRun({ url: "http://127.0.0.1:1", company: "x", agent: "y", adapterType: "claude_k8s", healthTimeoutMs: 50, pollMs: 10, out: () => {} }),
      /Paperclip at http:\/\/127\.0\.0\.1:1 did not answer healthy/,
    );
  });
});
