import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { DEFAULT_MAX_SSE_LINE_LENGTH, SseParser, type SseItem } from "../src/sse.js";

/** A small deterministic generator (mulberry32): the same chunkings every run. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function feed(p: SseParser, chunks: string[]): SseItem[] {
  return chunks.flatMap((c) => p.push(c));
}

describe("SseParser", () => {
  // Every line end the format knows, comments, an id with NUL (ignored),
  // several data lines, an event with no data (not dispatched), unknown
  // fields, characters outside the BMP and a line end as the last char.
  const stream = [
    "id: 1\r\nevent: line\r\ndata: {\"a\":1}\r\n\r\n",
    ": keepalive\r\r",
    "id: 2\nevent: end\ndata: x\ndata: y\n\n",
    "event: nothing\nid: 7\n\n",
    "data\rdata:\rdata:  two spaces\r\r",
    "id: bad\0id\nretry: 10\nfoo: bar\ndata: é😀\r\n\r\n",
    ":\n",
    "id: 3\ndata: last\r\n\r",
  ].join("");

  it("gives the same items however the text is cut", () => {
    const whole = new SseParser().push(stream);
    assert.deepEqual(whole, [
      { kind: "event", event: { id: "1", event: "line", data: "{\"a\":1}" } },
      { kind: "comment", text: "keepalive" },
      { kind: "event", event: { id: "2", event: "end", data: "x\ny" } },
      { kind: "event", event: { id: undefined, event: "message", data: "\n\n two spaces" } },
      { kind: "event", event: { id: undefined, event: "message", data: "é😀" } },
      { kind: "comment", text: "" },
      { kind: "event", event: { id: "3", event: "message", data: "last" } },
    ]);
    for (let seed = 1; seed <= 500; seed++) {
      const next = random(seed);
      const chunks: string[] = [];
      for (let i = 0; i < stream.length; ) {
        // Empty chunks too: one must not end a pending "\r" early.
        const n = Math.floor(next() * 6);
        chunks.push(stream.slice(i, i + n));
        i += n;
      }
      const p = new SseParser();
      assert.deepEqual(feed(p, chunks), whole, `chunks ${JSON.stringify(chunks)}`);
      // Less where a "\n" completing a chunk's last "\r" is skipped unsearched.
      assert.ok(p.scannedChars <= stream.length, `each character searched once at most: ${p.scannedChars}`);
    }
  });

  it("searches a long line arriving in many chunks once, not once per chunk", () => {
    // A 1 MiB log line of "<", as the relay's JSON escapes it: about 6 MiB.
    const data = JSON.stringify({ seq: 1, line: "\\u003c".repeat(1 << 20) });
    const text = `id: 1\nevent: line\ndata: ${data}\n\nid: 2\nevent: line\ndata: {}\n\n`;
    const chunk = 64 << 10;
    const p = new SseParser();
    const items: SseItem[] = [];
    for (let i = 0; i < text.length; i += chunk) items.push(...p.push(text.slice(i, i + chunk)));
    assert.deepEqual(
      items.map((it) => (it.kind === "event" ? [it.event.id, it.event.data.length] : it.kind)),
      [
        ["1", data.length],
        ["2", 2],
      ],
    );
    assert.ok(items[0].kind === "event" && items[0].event.data === data);
    // Rescanning what is buffered would search about chunks²/2 × 64 KiB:
    // some 300 million characters here.
    assert.equal(p.scannedChars, text.length);
  });

  it("refuses a line longer than the limit, whole or in pieces", () => {
    const line = `data: ${"x".repeat(994)}`; // 1,000 characters
    assert.deepEqual(new SseParser({ maxLineLength: 1000 }).push(`${line}\n\n`), [{ kind: "event", event: { id: undefined, event: "message", data: "x".repeat(994) } }]);
    assert.throws(() => new SseParser({ maxLineLength: 1000 }).push(`${line}x\n\n`), /the event stream sent a line over 1000 characters/);
    const p = new SseParser({ maxLineLength: 1000 });
    assert.deepEqual(p.push(line), []);
    assert.throws(() => p.push("x"), /a line over 1000 characters/, "an unterminated line stops growing at the limit");
  });

  it("refuses an event whose data lines add up past the limit", () => {
    const p = new SseParser({ maxLineLength: 1000 });
    assert.throws(() => {
      for (let i = 0; i < 200; i++) p.push("data: 123456789\n");
    }, /an event over 1000 characters/);
  });

  it("holds at most 16 Mi characters of a line by default", () => {
    const p = new SseParser();
    const piece = "x".repeat(1 << 20);
    for (let i = 0; i < DEFAULT_MAX_SSE_LINE_LENGTH / piece.length; i++) p.push(piece);
    assert.equal(DEFAULT_MAX_SSE_LINE_LENGTH, 16 << 20);
    assert.throws(() => p.push("x"), /a line over 16777216 characters/);
  });
});
