// A Server-Sent Events parser (the WHATWG event-stream format) for text
// that arrives in arbitrary chunks: a field or a multi-byte character may
// be split anywhere, so nothing is dispatched until its blank line came.

export interface SseEvent {
  /** The `id:` field of this event, if it had one. */
  id?: string;
  /** The `event:` field; "message" when absent. */
  event: string;
  data: string;
}

export type SseItem = { kind: "event"; event: SseEvent } | { kind: "comment"; text: string };

export interface SseParserOptions {
  /**
   * The longest line, and the most data one event may gather, in
   * characters. Default 16 Mi: the relay cuts a log line at 1 MiB, and its
   * end event, the largest, carries a result of two such lines (the answer
   * and the raw result event), each at most 6 MiB once JSON-escaped.
   */
  maxLineLength?: number;
}

export const DEFAULT_MAX_SSE_LINE_LENGTH = 16 * 1024 * 1024;

export class SseParser {
  private readonly maxLineLength: number;
  /** The start of a line whose end has not come; never holds "\r" or "\n". */
  private buffer = "";
  private eventType = "";
  private data: string[] = [];
  private dataLength = 0;
  private id: string | undefined;
  private hasData = false;
  /** A chunk ended in "\r": a "\n" opening the next one belongs to it. */
  private pendingCR = false;
  private scanned = 0;

  constructor(opts: SseParserOptions = {}) {
    this.maxLineLength = opts.maxLineLength ?? DEFAULT_MAX_SSE_LINE_LENGTH;
  }

  /**
   * Characters searched for line ends so far. Each is searched once, when
   * it arrives, so a long line in many chunks costs its length, not its
   * length times the chunks: the tests hold the parser to that.
   */
  get scannedChars(): number {
    return this.scanned;
  }

  /**
   * Feeds decoded text; returns the events and comments it completed.
   * Throws when a line or an event grows past maxLineLength: the stream is
   * broken (or hostile), and this parser unusable; what the same text
   * completed before is not returned, so a reader resumes after the last
   * item it had.
   */
  push(text: string): SseItem[] {
    if (text === "") return []; // nothing came: a pending "\r" still waits for its "\n"
    let start = this.pendingCR && text.startsWith("\n") ? 1 : 0;
    this.pendingCR = false;
    this.scanned += text.length - start;
    const out: SseItem[] = [];
    // The buffer holds no line end, so only the new text is searched.
    const lineEnd = /\r\n|\r|\n/g;
    lineEnd.lastIndex = start;
    for (let m = lineEnd.exec(text); m; m = lineEnd.exec(text)) {
      this.checkLength(this.buffer.length + m.index - start, "a line");
      const line = this.buffer + text.slice(start, m.index);
      this.buffer = "";
      start = m.index + m[0].length;
      // A lone "\r" at the very end may be the first half of "\r\n".
      if (m[0] === "\r" && start === text.length) this.pendingCR = true;
      this.line(line, out);
    }
    if (start < text.length) {
      this.checkLength(this.buffer.length + text.length - start, "a line");
      this.buffer += text.slice(start);
    }
    return out;
  }

  private checkLength(length: number, what: string): void {
    if (length > this.maxLineLength) {
      throw new Error(`the event stream sent ${what} over ${this.maxLineLength} characters`);
    }
  }

  private line(line: string, out: SseItem[]): void {
    if (line === "") {
      if (this.hasData) {
        out.push({ kind: "event", event: { id: this.id, event: this.eventType || "message", data: this.data.join("\n") } });
      }
      this.eventType = "";
      this.data = [];
      this.dataLength = 0;
      this.id = undefined;
      this.hasData = false;
      return;
    }
    if (line.startsWith(":")) {
      out.push({ kind: "comment", text: line.slice(1).trim() });
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        this.eventType = value;
        break;
      case "data":
        // Many short data lines add up to one event as large as a long line.
        this.dataLength += value.length + 1;
        this.checkLength(this.dataLength - 1, "an event");
        this.data.push(value);
        this.hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) this.id = value;
        break;
      default:
        // "retry" and unknown fields: nothing this client uses.
        break;
    }
  }
}
