import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import { followRun, RelayClient, type RelayLine } from "../src/relay.js";
import { SseParser } from "../src/sse.js";
import { FakeRelay } from "./fake-relay.js";

const fast = { initialBackoffMs: 10, maxBackoffMs: 50, unknownRunPollMs: 20, jobCheckEveryMs: 20, relayGraceMs: 200 };

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
    setTimeout(() => {
      relay.addRun({ id: run });
      relay.appendLines(run, "first");
      relay.finish(run, { phase: "Succeeded", exitCode: 0 });
    }, 400); // longer than relayGraceMs: only an ended Job starts that clock
    const outcome = await followRun({
      client,
      runId: run,
      signal: new AbortController().signal,
      onLine: async (l) => void lines.push(l.line),
      checkJob: async () => {
        checks++;
        return "active";
      },
      ...fast,
    });
    assert.equal(outcome.kind, "ended");
    assert.deepEqual(lines, ["first"]);
    assert.ok(checks > 1);
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
