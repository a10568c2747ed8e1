import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import { followRun, RELAY_BODY_LIMITS, RelayClient, unknownRunWaits, type RelayLine } from "../src/relay.js";
import { SseParser } from "../src/sse.js";
import { FakeRelay } from "./fake-relay.js";

const fast = { initialBackoffMs: 10, maxBackoffMs: 50, unknownRunPollMs: 20, jobCheckEveryMs: 20, relayGraceMs: 200 };

describe("unknownRunWaits", () => {
  it("asks soon after a run's Job is created, then less often, up to unknownRunPollMs", () => {
    const next = unknownRunWaits(2_000);
    assert.deepEqual([next(), next(), next(), next(), next(), next()], [250, 500, 1_000, 2_000, 2_000, 2_000]);
  });
  it("never waits longer than unknownRunPollMs, even at first", () => {
    const next = unknownRunWaits(20);
    assert.deepEqual([next(), next()], [20, 20]);
  });
});

describe("SseParser", () => {
  it("assembles events split anywhere, including inside CRLF", () => {
    const stream = "id: 1\r\nevent: line\r\ndata: {\"a\":1}\r\n\r\n: keepalive\r\n\r\nid: 2\nevent: end\ndata: x\ndata: y\n\n";
    for (let cut = 0; cut <= stream.length; cut++) {
      const p = new SseParser();
      const items = [...p.push(stream.slice(0, cut)), ...p.push(stream.slice(cut))];
      assert.deepEqual(
        items,
        [
          { kind: "event", event: { id: "1", event: "line", data: "{\"a\":1}" } },
          { kind: "comment", text: "keepalive" },
          { kind: "event", event: { id: "2", event: "end", data: "x\ny" } },
        ],
        `cut at ${cut}`,
      );
    }
  });

  it("dispatches nothing for an event whose blank line never came", () => {
    const p = new SseParser();
    assert.deepEqual(p.push("id: 4\nevent: line\ndata: {\"seq\":4"), []);
  });
});

describe("followRun", () => {
  let relay: FakeRelay;
  let client: RelayClient;

  before(async () => {
    relay = await new FakeRelay().start();
    client = new RelayClient({ baseUrl: relay.url, tokenFile: relay.tokenFile() });
  });
  after(() => relay.close());

  it("resumes with Last-Event-ID after a connection drops mid-event, losing and repeating nothing", async () => {
    const run = "run-drop";
    relay.addRun({ id: run, agent: "agent-1" });
    const want = Array.from({ length: 12 }, (_, i) => `{"n":${i + 1}}`);
    relay.appendLines(run, ...want.slice(0, 8));
    relay.dropAfterLines = [3, 2];
    const got: RelayLine[] = [];
    const following = followRun({
      client,
      runId: run,
      signal: new AbortController().signal,
      onLine: async (l) => {
        got.push(l);
        // Lines arriving while the follower is disconnected must come too.
        if (got.length === 4) relay.appendLines(run, ...want.slice(8));
        if (got.length === want.length) relay.finish(run, { phase: "Succeeded", exitCode: 0, result: { outcome: "succeeded", text: "done" } });
      },
      ...fast,
    });
    const outcome = await following;
    assert.equal(outcome.kind, "ended");
    assert.deepEqual(
      got.map((l) => l.line),
      want,
    );
    assert.deepEqual(
      got.map((l) => l.seq),
      want.map((_, i) => i + 1),
    );
    if (outcome.kind === "ended") {
      assert.equal(outcome.lastSeq, 12);
      assert.equal(outcome.end?.result?.text, "done");
    }
    const requests = relay.logRequests.filter((r) => r.authorization === `Bearer ${relay.token}`);
    assert.ok(requests.length >= 3, `reconnected: ${JSON.stringify(requests)}`);
    assert.equal(requests[0].lastEventId, null, "the first request starts from the beginning");
    assert.equal(requests[1].lastEventId, "3", "resumes after the last whole event");
    assert.equal(requests[2].lastEventId, "5");
  });

  it("reports keepalive comments while the run is quiet", async () => {
    const run = "run-quiet";
    relay.addRun({ id: run });
    let keepalives = 0;
    const outcome = await followRun({
      client,
      runId: run,
      signal: new AbortController().signal,
      onLine: async () => {},
      onKeepalive: () => {
        keepalives++;
        if (keepalives === 3) relay.finish(run, { phase: "Succeeded", exitCode: 0 });
      },
      ...fast,
    });
    assert.equal(outcome.kind, "ended");
    assert.ok(keepalives >= 3);
  });

  it("waits for a run the relay has not seen yet, with no timeout while its Job is active", async () => {
    const run = "run-later";
    let checks = 0;
    const lines: string[] = [];
    // The run appears at the 15th check of its Job. Checks are at least
    // jobCheckEveryMs (20) apart, so that is longer than relayGraceMs
    // (200) after the first, however fast or slow this machine runs:
    // only an ended Job starts that clock.
    const outcome = await followRun({
      client,
      runId: run,
      signal: new AbortController().signal,
      onLine: async (l) => void lines.push(l.line),
      checkJob: async () => {
        if (++checks === 15) {
          relay.addRun({ id: run });
          relay.appendLines(run, "first");
          relay.finish(run, { phase: "Succeeded", exitCode: 0 });
        }
        return "active";
      },
      ...fast,
    });
    assert.equal(outcome.kind, "ended", JSON.stringify(outcome));
    assert.deepEqual(lines, ["first"]);
    assert.ok(checks >= 15, `${checks} checks`);
  });

  it("gives up on a Job deleted before the relay saw its pod", async () => {
    const outcome = await followRun({
      client,
      runId: "run-never",
      signal: new AbortController().signal,
      onLine: async () => assert.fail("no lines"),
      checkJob: async () => "gone",
      ...fast,
    });
    assert.equal(outcome.kind, "job-gone");
  });

  it("ends, refused, when the Job says clipjob will not start it", async () => {
    const outcome = await followRun({
      client,
      runId: "run-refused",
      signal: new AbortController().signal,
      onLine: async () => assert.fail("no lines"),
      checkJob: async () => ({ refused: "this run cannot start: images" }),
      ...fast,
    });
    assert.deepEqual(outcome, { kind: "refused", message: "this run cannot start: images", lastSeq: 0 });
  });

  it("asks a waiting run's Job as often as the relay, so its refusal is seen within that poll", async () => {
    let checks = 0;
    const outcome = await followRun({
      client,
      runId: "run-waits-then-refused",
      signal: new AbortController().signal,
      onLine: async () => assert.fail("no lines"),
      checkJob: async () => (++checks < 4 ? "waiting" : { refused: "this run cannot start: images" }),
      ...fast,
      // Were a waiting Job asked only every minute, the four checks would
      // take three minutes, past the test's timeout.
      jobCheckEveryMs: 60_000,
    });
    assert.equal(outcome.kind, "refused", JSON.stringify(outcome));
    assert.equal(checks, 4);
  });

  it("gives up when the relay never serves a run whose Job ended", async () => {
    const outcome = await followRun({
      client,
      runId: "run-unserved",
      signal: new AbortController().signal,
      onLine: async () => assert.fail("no lines"),
      checkJob: async () => "finished",
      ...fast,
    });
    assert.equal(outcome.kind, "unavailable");
    assert.equal(outcome.kind === "unavailable" && outcome.jobState, "finished");
  });

  it("reconnecting after the end gets 204 and ends", async () => {
    const run = "run-over";
    relay.addRun({ id: run });
    relay.appendLines(run, "a", "b");
    relay.finish(run, { phase: "Succeeded", exitCode: 0 });
    const outcome = await followRun({ client, runId: run, afterSeq: 2, signal: new AbortController().signal, onLine: async () => assert.fail("nothing new"), ...fast });
    assert.deepEqual(outcome, { kind: "ended", end: null, lastSeq: 2 });
  });

  it("gives up after repeated 401s", async () => {
    relay.failWith = 401;
    try {
      const outcome = await followRun({ client, runId: "run-x", signal: new AbortController().signal, onLine: async () => {}, ...fast, maxAuthFailures: 2 });
      assert.equal(outcome.kind, "unavailable");
      assert.ok(!("jobState" in outcome), "no checkJob: the Job's state is not known");
    } finally {
      relay.failWith = null;
    }
  });

  it("says the Job still runs when it gives up on repeated 403s", async () => {
    relay.failWith = 403;
    try {
      const outcome = await followRun({
        client,
        runId: "run-refused",
        signal: new AbortController().signal,
        onLine: async () => {},
        checkJob: async () => "active",
        ...fast,
        maxAuthFailures: 3,
      });
      assert.equal(outcome.kind, "unavailable");
      assert.equal(outcome.kind === "unavailable" && outcome.jobState, "active");
    } finally {
      relay.failWith = null;
    }
  });

  it("gives up on a 400 with the Job's state, or none when asking fails", async () => {
    relay.failWith = 400;
    try {
      const finished = await followRun({ client, runId: "run-400", signal: new AbortController().signal, onLine: async () => {}, checkJob: async () => "finished", ...fast });
      assert.equal(finished.kind, "unavailable");
      assert.equal(finished.kind === "unavailable" && finished.jobState, "finished");
      const unknown = await followRun({
        client,
        runId: "run-400",
        signal: new AbortController().signal,
        onLine: async () => {},
        checkJob: async () => {
          throw new Error("the API server is away");
        },
        ...fast,
      });
      assert.equal(unknown.kind, "unavailable");
      assert.ok(!("jobState" in unknown));
    } finally {
      relay.failWith = null;
    }
  });

  it("stops when aborted", async () => {
    const run = "run-abort";
    relay.addRun({ id: run });
    const stop = new AbortController();
    setTimeout(() => stop.abort(), 100);
    const outcome = await followRun({ client, runId: run, signal: stop.signal, onLine: async () => {}, ...fast });
    assert.equal(outcome.kind, "aborted");
  });
});

// test/testdata holds a CA and a relay certificate for 127.0.0.1 made for
// these tests only (the CA's key was discarded), valid for a century.
const testdata = (name: string) => fileURLToPath(new URL(`../../test/testdata/${name}`, import.meta.url));

describe("RelayClient over TLS", () => {
  let relay: FakeRelay;
  before(async () => {
    relay = await new FakeRelay().start({ key: readFileSync(testdata("relay.key")), cert: readFileSync(testdata("relay.crt")) });
    relay.addRun({ id: "run-tls", agent: "agent-tls" });
  });
  after(() => relay.close());

  it("trusts the relay's certificate through relayCaFile", async () => {
    const client = new RelayClient({ baseUrl: relay.url, tokenFile: relay.tokenFile(), caFile: testdata("ca.crt") });
    assert.equal((await client.getRun("run-tls"))?.agent, "agent-tls");
    assert.deepEqual(
      (await client.listRuns({ agent: "agent-tls", phase: "Running" })).map((r) => r.id),
      ["run-tls"],
    );
  });

  it("refuses it without the CA", async () => {
    const client = new RelayClient({ baseUrl: relay.url, tokenFile: relay.tokenFile() });
    await assert.rejects(client.getRun("run-tls"), /certificate/);
  });
});

/** A loopback server answering as the test says, and a token file for a client of it. */
async function serve(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ client: (opts?: { requestTimeoutMs?: number }) => RelayClient; close: () => Promise<void> }> {
  const server = http.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const dir = mkdtempSync(join(tmpdir(), "clipjob-relay-test-"));
  writeFileSync(join(dir, "token"), "token\n");
  return {
    client: (opts) => new RelayClient({ baseUrl: url, tokenFile: join(dir, "token"), ...opts }),
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const lineEvent = (seq: number, line: string) => `id: ${seq}\nevent: line\ndata: ${JSON.stringify({ type: "line", seq, ts: "", container: "agent", line })}\n\n`;
const endEvent = (lastSeq: number) => `id: ${lastSeq}\nevent: end\ndata: ${JSON.stringify({ type: "end", phase: "Succeeded", exitCode: 0, lastSeq })}\n\n`;

/** Answers 200 with the lines after Last-Event-ID (or ?after=), then the end. */
function streamFrom(req: IncomingMessage, res: ServerResponse, lines: string[]): void {
  const after = Number(req.headers["last-event-id"] ?? new URL(req.url ?? "/", "http://relay").searchParams.get("after") ?? 0);
  res.writeHead(200, { "Content-Type": "text/event-stream" });
  res.end(lines.map((l, i) => (i + 1 > after ? lineEvent(i + 1, l) : "")).join("") + endEvent(lines.length));
}

/** A signal that aborts after ms: a follow that would otherwise wait for minutes ends the test as "aborted". */
const guard = (ms: number) => AbortSignal.timeout(ms);

describe("RelayClient's limits", () => {
  it("fails a request whose answer trickles past the deadline, saying so", async (t) => {
    const relay = await serve((req, res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.write("{");
      // A byte every 100 ms keeps any idle timeout from firing; after 3 s
      // the answer would be whole.
      const drip = setInterval(() => res.write(" "), 100);
      const stop = setTimeout(() => {
        clearInterval(drip);
        res.end('"id":"run-slow","namespace":"ns","phase":"Running","done":false,"lastSeq":0}');
      }, 3000);
      res.on("close", () => {
        clearInterval(drip);
        clearTimeout(stop);
      });
    });
    t.after(() => relay.close());
    const client = relay.client({ requestTimeoutMs: 300 });
    await assert.rejects(client.getRun("run-slow"), /reading run run-slow: no complete answer from the relay within 300 ms/);
    await assert.rejects(client.listRuns({}), /listing runs: no complete answer from the relay within 300 ms/);
    await assert.rejects(client.probe(), /probing the relay: no complete answer from the relay within 300 ms/);
  });

  it("ends the read of an answer when the caller's signal aborts", async (t) => {
    const relay = await serve((req, res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.write("{");
      const drip = setInterval(() => res.write(" "), 50);
      res.on("close", () => clearInterval(drip));
    });
    t.after(() => relay.close());
    const client = relay.client({ requestTimeoutMs: 60_000 });
    const stop = new AbortController();
    const reading = client.getRun("run-slow", stop.signal);
    setTimeout(() => stop.abort(), 200);
    await assert.rejects(reading, { name: "AbortError" });
    const already = new AbortController();
    already.abort();
    await assert.rejects(client.listRuns({}, already.signal), { name: "AbortError" });
  });

  it("refuses an answer over its cap, naming the cap", async (t) => {
    // A valid answer padded past the cap: read whole, it would parse.
    const relay = await serve((req, res) => {
      const path = new URL(req.url ?? "/", "http://relay").pathname;
      const [cap, tail] =
        path === "/v1/runs/run-big" ? [RELAY_BODY_LIMITS.run, '"id":"run-big","namespace":"ns","phase":"Running","done":false,"lastSeq":0}'] : [RELAY_BODY_LIMITS.list, '"runs":[]}'];
      res.writeHead(200, { "Content-Type": "application/json" });
      let left = cap + 1;
      let closed = false;
      res.on("close", () => (closed = true));
      res.on("error", () => {}); // the client hung up: expected
      const pad = " ".repeat(1 << 20);
      const write = () => {
        while (left > 0 && !closed) {
          const n = Math.min(left, pad.length);
          left -= n;
          if (!res.write(pad.slice(0, n))) return void res.once("drain", write);
        }
        if (!closed) res.end(tail);
      };
      res.write("{");
      write();
    });
    t.after(() => relay.close());
    const client = relay.client();
    await assert.rejects(client.getRun("run-big"), /reading run run-big: the relay's answer is over 16 MiB/);
    await assert.rejects(client.listRuns({ agent: "a" }), /listing runs: the relay's answer is over 32 MiB/);
    // phase=none: the probe, capped at 1 MiB.
    await assert.rejects(client.probe(), /probing the relay: the relay's answer is over 1 MiB/);
  });
});

describe("followRun against a misbehaving relay", () => {
  const collect = () => {
    const lines: RelayLine[] = [];
    const notices: string[] = [];
    return { lines, notices, onLine: async (l: RelayLine) => void lines.push(l), onNotice: (m: string) => void notices.push(m) };
  };

  for (const status of [408, 425, 429]) {
    it(`retries after ${status} and hands every line once`, async (t) => {
      const lastEventIds: (string | null)[] = [];
      const relay = await serve((req, res) => {
        lastEventIds.push((req.headers["last-event-id"] as string | undefined) ?? null);
        switch (lastEventIds.length) {
          case 1: // two lines, then the connection breaks
            res.writeHead(200, { "Content-Type": "text/event-stream" });
            res.write(lineEvent(1, "one") + lineEvent(2, "two"));
            setTimeout(() => res.socket?.destroy(), 20);
            return;
          case 2:
            res.writeHead(status, { "Content-Type": "application/json", "Retry-After": "0" });
            res.end(JSON.stringify({ code: status, message: "not now" }));
            return;
          default:
            streamFrom(req, res, ["one", "two", "three"]);
        }
      });
      t.after(() => relay.close());
      const c = collect();
      const outcome = await followRun({ client: relay.client(), runId: "run-busy", signal: guard(20_000), ...c, ...fast });
      assert.equal(outcome.kind, "ended", JSON.stringify(outcome));
      assert.deepEqual(
        c.lines.map((l) => [l.seq, l.line]),
        [
          [1, "one"],
          [2, "two"],
          [3, "three"],
        ],
      );
      assert.deepEqual(lastEventIds, [null, "2", "2"]);
      assert.ok(c.notices.some((n) => n.includes(`relay answered ${status}: not now; retrying`)), JSON.stringify(c.notices));
    });
  }

  it("waits as Retry-After says rather than its own backoff", async (t) => {
    let requests = 0;
    const relay = await serve((req, res) => {
      if (++requests === 1) {
        res.writeHead(429, { "Retry-After": "1" }).end();
        return;
      }
      streamFrom(req, res, ["after the wait"]);
    });
    t.after(() => relay.close());
    // The backoff alone would wait a minute: the guard would end the follow first.
    const outcome = await followRun({ client: relay.client(), runId: "run-429", signal: guard(20_000), onLine: async () => {}, ...fast, initialBackoffMs: 60_000, maxBackoffMs: 60_000 });
    assert.equal(outcome.kind, "ended");
    assert.equal(requests, 2);
  });

  it("waits no longer than maxBackoffMs whatever Retry-After says", async (t) => {
    let requests = 0;
    const relay = await serve((req, res) => {
      if (++requests === 1) {
        res.writeHead(503, { "Retry-After": "3600" }).end();
        return;
      }
      streamFrom(req, res, ["soon"]);
    });
    t.after(() => relay.close());
    const outcome = await followRun({ client: relay.client(), runId: "run-503", signal: guard(20_000), onLine: async () => {}, ...fast });
    assert.equal(outcome.kind, "ended");
    assert.equal(requests, 2);
  });

  it("treats a line over the limit as a broken stream and resumes after the last line handed on", async (t) => {
    const lastEventIds: (string | null)[] = [];
    let sendLong = () => {};
    const relay = await serve((req, res) => {
      lastEventIds.push((req.headers["last-event-id"] as string | undefined) ?? null);
      if (lastEventIds.length === 1) {
        res.writeHead(200, { "Content-Type": "text/event-stream" });
        res.write(lineEvent(1, "short"));
        // Once the first line was handed on, a second whose event never
        // ends: only the limit stops it.
        sendLong = () => res.write(`id: 2\nevent: line\ndata: {"seq":2,"line":"${"x".repeat(5000)}`);
        return;
      }
      streamFrom(req, res, ["short", "long enough"]);
    });
    t.after(() => relay.close());
    const c = collect();
    const onLine = async (l: RelayLine) => {
      await c.onLine(l);
      if (l.seq === 1) sendLong();
    };
    const outcome = await followRun({ client: relay.client(), runId: "run-long", signal: guard(20_000), ...c, onLine, ...fast, maxLineLength: 1000 });
    assert.equal(outcome.kind, "ended", JSON.stringify(outcome));
    assert.deepEqual(
      c.lines.map((l) => l.line),
      ["short", "long enough"],
    );
    assert.deepEqual(lastEventIds, [null, "1"]);
    assert.ok(
      c.notices.some((n) => /log stream broke \(the event stream sent a line over 1000 characters\); resuming after line 1/.test(n)),
      JSON.stringify(c.notices),
    );
  });

  it("retries a log request whose headers do not come within the deadline", async (t) => {
    let requests = 0;
    const relay = await serve((req, res) => {
      if (++requests === 1) return; // accepted, never answered
      streamFrom(req, res, ["finally"]);
    });
    t.after(() => relay.close());
    const c = collect();
    const outcome = await followRun({ client: relay.client({ requestTimeoutMs: 300 }), runId: "run-mute", signal: guard(20_000), ...c, ...fast });
    assert.equal(outcome.kind, "ended", JSON.stringify(outcome));
    assert.deepEqual(
      c.lines.map((l) => l.line),
      ["finally"],
    );
    assert.ok(
      c.notices.some((n) => n.includes("opening run run-mute's log: no complete answer from the relay within 300 ms")),
      JSON.stringify(c.notices),
    );
  });
});

// Hostile review (third round): the relay may drop a run between two
// connections (retention, a lost store) and bind its id to another Job;
// each connection's record is checked before its lines.
describe("followRun's check of the run's record", () => {
  const record = (jobUid: string) => JSON.stringify({ id: "run-v", namespace: "paperclip", job: "pc-v", jobUid, agent: "a", phase: "Running", done: false, lastSeq: 0 });
  const verifyRun = (r: { jobUid?: string }) => (r.jobUid === "uid-ours" ? null : `bound to ${r.jobUid}`);

  it("checks every connection, and hands on nothing of one bound to another Job", async (t) => {
    let logs = 0;
    let records = 0;
    const relay = await serve((req, res) => {
      if (!req.url?.includes("/log")) {
        records++;
        res.writeHead(200, { "Content-Type": "application/json" }).end(record(records === 1 ? "uid-ours" : "uid-other"));
        return;
      }
      if (++logs === 1) {
        res.writeHead(200, { "Content-Type": "text/event-stream" });
        res.write(lineEvent(1, "one") + lineEvent(2, "two"));
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      }
      streamFrom(req, res, ["one", "two", "FORGED-3", "FORGED-4"]);
    });
    t.after(() => relay.close());
    const lines: string[] = [];
    const outcome = await followRun({ client: relay.client(), runId: "run-v", signal: guard(20_000), onLine: async (l) => void lines.push(l.line), verifyRun, ...fast });
    assert.equal(outcome.kind, "mismatch", JSON.stringify(outcome));
    assert.deepEqual(lines, ["one", "two"]);
    assert.equal(records, 2, "one check per connection");
  });

  it("gives up on a record it cannot read once the Job is gone, as on a broken stream", async (t) => {
    const relay = await serve((req, res) => {
      if (!req.url?.includes("/log")) {
        res.writeHead(500).end("store unavailable");
        return;
      }
      streamFrom(req, res, ["never handed on"]);
    });
    t.after(() => relay.close());
    const lines: string[] = [];
    const outcome = await followRun({
      client: relay.client(),
      runId: "run-v",
      signal: guard(20_000),
      onLine: async (l) => void lines.push(l.line),
      verifyRun,
      checkJob: async () => "gone",
      ...fast,
    });
    assert.equal(outcome.kind, "unavailable", JSON.stringify(outcome));
    assert.deepEqual(lines, []);
  });
});
