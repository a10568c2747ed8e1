// A stand-in for clipjob's relay API (relay/api/api.go) on a loopback
// port: the same routes, status codes and SSE framing, with knobs to break
// a stream mid-event and to withhold a run until a test says it exists.

import { EventEmitter } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import https from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import type { RelayLine, RelayResult, RelayRun } from "../src/relay.js";

export interface LogRequest {
  after: string | null;
  lastEventId: string | null;
  authorization: string | null;
}

interface StoredRun {
  run: RelayRun;
  lines: RelayLine[];
}

export class FakeRelay {
  readonly token = "relay-token";
  readonly logRequests: LogRequest[] = [];
  private readonly runs = new Map<string, StoredRun>();
  private readonly changed = new EventEmitter();
  private server!: http.Server;
  url = "";
  /** Each entry breaks one log connection after that many lines, halfway through the next event. */
  dropAfterLines: number[] = [];
  /** Keepalive comments on open streams, as the relay's 15 s ones. */
  keepaliveMs = 50;
  /** Answer as a relay older than ?job= does: with the run id's record, whichever Job it is. */
  ignoresJobParam = false;
  /** Answer log requests with this status while set (e.g. 401, 503). */
  failWith: number | null = null;
  /** Answer this many run lists with listFailStatus first, as a relay being replaced does. */
  listFailures = 0;
  listFailStatus = 503;

  constructor() {
    this.changed.setMaxListeners(100);
  }

  /** Serves on loopback; over TLS when given a key and certificate, as the relay does with --cert-dir. */
  async start(tls?: { key: Buffer; cert: Buffer }): Promise<this> {
    const handler = (req: IncomingMessage, res: ServerResponse) => void this.handle(req, res);
    this.server = tls ? https.createServer(tls, handler) : http.createServer(handler);
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `${tls ? "https" : "http"}://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const dir of this.tempDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  }

  /** Directories of token files, removed on close. */
  private readonly tempDirs: string[] = [];

  /** A file holding the token, as a projected token would be mounted. */
  tokenFile(): string {
    const dir = mkdtempSync(join(tmpdir(), "clipjob-relay-token-"));
    this.tempDirs.push(dir);
    const file = join(dir, "token");
    writeFileSync(file, `${this.token}\n`);
    return file;
  }

  /** Makes the run known (its pod was seen). */
  addRun(run: Partial<RelayRun> & { id: string }): void {
    this.runs.set(run.id, {
      // The company the adapter's Jobs carry (newCtx's agent).
      run: { namespace: "paperclip", company: "company-1", phase: "Running", done: false, lastSeq: 0, ...run },
      lines: [],
    });
    this.changed.emit("change");
  }

  appendLines(runId: string, ...lines: string[]): void {
    this.appendFrom(runId, "agent", ...lines);
  }

  /** Lines of one container of the run's pod. */
  appendFrom(runId: string, container: string, ...lines: string[]): void {
    const r = this.runs.get(runId);
    if (!r) throw new Error(`no run ${runId}`);
    for (const line of lines) {
      r.run.lastSeq++;
      r.lines.push({ seq: r.run.lastSeq, ts: new Date().toISOString(), container, line });
    }
    this.changed.emit("change");
  }

  finish(runId: string, end: { phase: string; exitCode?: number; reason?: string; result?: RelayResult }): void {
    const r = this.runs.get(runId);
    if (!r) throw new Error(`no run ${runId}`);
    Object.assign(r.run, end, { done: true });
    this.changed.emit("change");
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://relay");
    if (req.headers.authorization !== `Bearer ${this.token}`) {
      return json(res, 401, { code: 401, message: "a Kubernetes bearer token is required" });
    }
    const parts = url.pathname.split("/").filter(Boolean);
    if (parts.length === 2 && parts[0] === "v1" && parts[1] === "runs") {
      if (this.listFailures > 0) {
        this.listFailures--;
        return json(res, this.listFailStatus, { code: this.listFailStatus, message: "told to fail" });
      }
      const agent = url.searchParams.get("agent");
      const phase = url.searchParams.get("phase");
      const runs = [...this.runs.values()]
        .map((r) => r.run)
        .filter((r) => (!agent || r.agent === agent) && (!phase || r.phase === phase));
      return json(res, 200, { runs });
    }
    let stored = parts[0] === "v1" && parts[1] === "runs" && parts[2] ? this.runs.get(decodeURIComponent(parts[2])) : undefined;
    // ?job=<uid>: that Job's run, kept under id@uid when another Job took the id first (relay/api).
    const job = url.searchParams.get("job");
    if (stored && job && !this.ignoresJobParam && stored.run.jobUid && stored.run.jobUid !== job) stored = this.runs.get(`${decodeURIComponent(parts[2])}@${job}`);
    if (parts.length === 3) {
      return stored ? json(res, 200, stored.run) : json(res, 404, { code: 404, message: "not found" });
    }
    if (parts.length === 4 && parts[3] === "log") {
      this.logRequests.push({
        after: url.searchParams.get("after"),
        lastEventId: (req.headers["last-event-id"] as string | undefined) ?? null,
        authorization: req.headers.authorization ?? null,
      });
      if (this.failWith !== null) return json(res, this.failWith, { code: this.failWith, message: "told to fail" });
      if (!stored) return json(res, 404, { code: 404, message: `run ${parts[2]}: not found` });
      return this.streamLog(req, res, stored);
    }
    json(res, 404, { code: 404, message: "no such route" });
  }

  private async streamLog(req: IncomingMessage, res: ServerResponse, stored: StoredRun): Promise<void> {
    const lastEventId = req.headers["last-event-id"] as string | undefined;
    let after = Number(lastEventId ?? new URL(req.url ?? "/", "http://relay").searchParams.get("after") ?? 0);
    if (stored.run.done && after >= stored.run.lastSeq && lastEventId) {
      res.writeHead(204).end();
      return;
    }
    res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
    const dropAfter = this.dropAfterLines.shift();
    let sent = 0;
    let closed = false;
    req.on("close", () => (closed = true));
    const keepalive = setInterval(() => res.write(": keepalive\n\n"), this.keepaliveMs);
    try {
      while (!closed) {
        for (const line of stored.lines.filter((l) => l.seq > after)) {
          const frame = `id: ${line.seq}\nevent: line\ndata: ${JSON.stringify({ type: "line", ...line })}\n\n`;
          if (dropAfter !== undefined && sent === dropAfter) {
            // Half an event, then the connection dies: the client must not
            // hand on the half, and must resume after the last whole one.
            res.write(frame.slice(0, Math.floor(frame.length / 2)));
            await new Promise((r) => setTimeout(r, 10));
            res.socket?.destroy();
            return;
          }
          res.write(frame);
          sent++;
          after = line.seq;
        }
        if (stored.run.done && after >= stored.run.lastSeq) {
          const r = stored.run;
          const end = { type: "end", phase: r.phase, exitCode: r.exitCode, reason: r.reason, lastSeq: r.lastSeq, result: r.result };
          res.end(`id: ${r.lastSeq}\nevent: end\ndata: ${JSON.stringify(end)}\n\n`);
          return;
        }
        await new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(t);
            this.changed.off("change", done);
            resolve();
          };
          const t = setTimeout(done, 200);
          this.changed.on("change", done);
        });
      }
    } finally {
      clearInterval(keepalive);
    }
  }
}

function json(res: ServerResponse, code: number, body: unknown): void {
  res.writeHead(code, { "Content-Type": "application/json" }).end(JSON.stringify(body));
}
