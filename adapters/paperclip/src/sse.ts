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

export class SseParser {
  private buffer = "";
  private eventType = "";
  private data: string[] = [];
  private id: string | undefined;
  private hasData = false;
  /** A chunk ended in "\r": a "\n" opening the next one belongs to it. */
  private pendingCR = false;

  /** Feeds decoded text; returns the events and comments it completed. */
  push(text: string): SseItem[] {
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1);
    this.pendingCR = false;
    this.buffer += text;
    const out: SseItem[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buffer);
      if (!m) break;
      // A lone "\r" at the very end may be the first half of "\r\n".
      if (m[0] === "\r" && m.index === this.buffer.length - 1) {
        this.pendingCR = true;
        const line = this.buffer.slice(0, m.index);
        this.buffer = "";
        this.line(line, out);
        break;
      }
      const line = this.buffer.slice(0, m.index);
      this.buffer = this.buffer.slice(m.index + m[0].length);
      this.line(line, out);
    }
    return out;
  }

  private line(line: string, out: SseItem[]): void {
    if (line === "") {
      if (this.hasData) {
        out.push({ kind: "event", event: { id: this.id, event: this.eventType || "message", data: this.data.join("\n") } });
      }
      this.eventType = "";
      this.data = [];
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
