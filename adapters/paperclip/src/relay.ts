// A client of clipjob's log relay (relay/api in the clipjob repository):
// the run list, one run's status and result, and its log as Server-Sent
// Events followed across broken connections — each line handed on once
// and in order, resuming with Last-Event-ID. Built on node:http(s), not
// fetch, because the relay's certificate is signed by clipjob's own CA and
// Node's built-in fetch takes no per-request CA.

import { readFile } from "node:fs/promises";
import http, { type IncomingMessage } from "node:http";
import https from "node:https";

import { message } from "./errors.js";
import { SseParser } from "./sse.js";

/** Token accounting as the relay reports it (relay/result.Usage). */
export interface RelayUsage {
  inputTokens: number;
  outputTokens: number;
  cacheReadInputTokens?: number;
  cacheCreationInputTokens?: number;
  reasoningTokens?: number;
}

/** What a run produced, read from its log (relay/result.Result). */
export interface RelayResult {
  format?: string;
  sessionId?: string;
  model?: string;
  subtype?: string;
  isError?: boolean;
  text?: string;
  usage?: RelayUsage;
  costUsd?: number;
  truncated?: boolean;
  reason?: string;
  outcome?: "succeeded" | "failed" | "killed" | "timed_out" | string;
  errors?: string[];
  sessionUnavailable?: boolean;
  emptyResponse?: boolean;
  raw?: unknown;
}

/** One run as `GET /v1/runs/{run}` answers (relay/store.Run). */
export interface RelayRun {
  id: string;
  namespace: string;
  job?: string;
  jobUid?: string;
  pod?: string;
  agent?: string;
  company?: string;
  task?: string;
  session?: string;
  adapter?: string;
  containers?: string[];
  mainContainer?: string;
  phase: string;
  startedAt?: string;
  finishedAt?: string;
  exitCode?: number;
  reason?: string;
  done: boolean;
  lastSeq: number;
  bytes?: number;
  result?: RelayResult;
}

/** One stored log line (relay/store.Line). */
export interface RelayLine {
  seq: number;
  ts: string;
  container: string;
  line: string;
}

/** The end of a log (relay/api.End). */
export interface RelayEnd {
  phase: string;
  exitCode?: number;
  reason?: string;
  lastSeq: number;
  result?: RelayResult;
}

export class RelayHttpError extends Error {
  constructor(
    readonly status: number,
    readonly body: string,
    what: string,
  ) {
    super(`${what}: the relay answered ${status}${body ? `: ${relayMessage(body)}` : ""}`);
  }
}

/** The relay's JSON error message ({"code","message"}), or the body as it came. */
function relayMessage(body: string): string {
  try {
    const parsed = JSON.parse(body) as { message?: unknown };
    if (typeof parsed.message === "string") return parsed.message;
  } catch {
    // Not the relay's JSON: a proxy's page, say.
  }
  return body.trim().slice(0, 500);
}

export interface RelayClientOptions {
  /** The API's base URL, e.g. https://clipjob-relay.clipjob-system.svc. */
  baseUrl: string;
  /** A file holding a token for the relay's audience; re-read for every request, as kubelet rotates projected tokens. */
  tokenFile: string;
  /** PEM bundle to verify the relay's certificate; empty: the system's CAs. */
  caFile?: string;
  /**
   * Deadline of a request: connecting, the headers and the whole body; of
   * a log request, until its headers (a stream may last hours). Default 30 s.
   */
  requestTimeoutMs?: number;
}

/**
 * The most of an answer read, in bytes. A run record carries its result:
 * the answer and the raw result event, each from a log line the relay cuts
 * at 1 MiB, so up to 6 MiB once JSON-escaped ("<" is "\u003c"). A list
 * carries such records (the adapter lists one agent's unfinished runs: a
 * few); a probe lists none. More than that is not the relay speaking. An
 * error's body only makes a message, so it is cut, not refused.
 */
export const RELAY_BODY_LIMITS = { run: 16 << 20, list: 32 << 20, probe: 1 << 20, error: 64 << 10 } as const;

export interface LogResponse {
  status: number;
  /** The event stream when status is 200; otherwise read already, into text. */
  body: IncomingMessage;
  /** The body of any status but 200 (at most RELAY_BODY_LIMITS.error of it). */
  text: string;
}

export class RelayClient {
  private readonly base: URL;

  constructor(private readonly opts: RelayClientOptions) {
    this.base = new URL(opts.baseUrl.replace(/\/+$/, "") + "/");
  }

  get baseUrl(): string {
    return this.base.toString().replace(/\/$/, "");
  }

  /** The token for the relay's audience, from its file. */
  async token(): Promise<string> {
    return (await readFile(this.opts.tokenFile, "utf8")).trim();
  }

  private async request(path: string, headers: Record<string, string>, signal: AbortSignal): Promise<IncomingMessage> {
    const url = new URL(path.replace(/^\//, ""), this.base);
    const ca = this.opts.caFile ? await readFile(this.opts.caFile) : undefined;
    const token = await this.token();
    const lib = url.protocol === "https:" ? https : http;
    return new Promise<IncomingMessage>((resolve, reject) => {
      const req = lib.request(
        url,
        {
          method: "GET",
          headers: { ...headers, Authorization: `Bearer ${token}` },
          ...(url.protocol === "https:" && ca ? { ca } : {}),
          signal,
        },
        resolve,
      );
      req.on("error", reject);
      req.end();
    });
  }

  /**
   * Runs fn under the request deadline and the caller's signal, either of
   * which aborts the signal fn is given: an idle timeout alone lets a relay
   * that trickles a byte now and then hold the caller forever.
   */
  private async withDeadline<T>(what: string, signal: AbortSignal | undefined, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const timeoutMs = this.opts.requestTimeoutMs ?? 30_000;
    const ctl = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctl.abort();
    }, timeoutMs);
    const onAbort = () => ctl.abort();
    if (signal?.aborted) ctl.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await fn(ctl.signal);
    } catch (err) {
      if (timedOut) throw new Error(`${what}: no complete answer from the relay within ${timeoutMs} ms`);
      if (signal?.aborted) throw signal.reason ?? err;
      throw err;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /** A non-following GET: its status and body, read whole within the deadline and maxBytes. */
  private async getText(path: string, what: string, maxBytes: number, signal?: AbortSignal): Promise<{ status: number; body: string }> {
    return this.withDeadline(what, signal, async (s) => {
      const res = await this.request(path, { Accept: "application/json" }, s);
      const { text, over } = await readBody(res, maxBytes, s);
      if (over) throw new Error(`${what}: the relay's answer is over ${formatBytes(maxBytes)}, the most this client reads`);
      return { status: res.statusCode ?? 0, body: text };
    });
  }

  private async getJSON<T>(path: string, what: string, maxBytes: number, signal?: AbortSignal): Promise<{ status: number; value: T | null; body: string }> {
    const { status, body } = await this.getText(path, what, maxBytes, signal);
    if (status === 200) return { status, value: JSON.parse(body) as T, body };
    return { status, value: null, body };
  }

  /** The runs the caller may read, newest first, filtered as given. */
  async listRuns(filter: { agent?: string; company?: string; phase?: string }, signal?: AbortSignal): Promise<RelayRun[]> {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filter)) if (v) q.set(k, v);
    const { status, value, body } = await this.getJSON<{ runs: RelayRun[] }>(`/v1/runs?${q}`, "listing runs", RELAY_BODY_LIMITS.list, signal);
    if (status !== 200 || !value) throw new RelayHttpError(status, body, "listing runs");
    return value.runs ?? [];
  }

  /**
   * One run's status and result; null if the relay does not know it (or
   * the caller may not read it). With jobUid, the run of that Job: another
   * Job may have taken the run id first (the relay keeps both).
   */
  async getRun(runId: string, signal?: AbortSignal, jobUid?: string): Promise<RelayRun | null> {
    const path = `/v1/runs/${encodeURIComponent(runId)}${jobQuery(jobUid, "?")}`;
    const { status, value, body } = await this.getJSON<RelayRun>(path, `reading run ${runId}`, RELAY_BODY_LIMITS.run, signal);
    if (status === 404) return null;
    if (status !== 200 || !value) throw new RelayHttpError(status, body, `reading run ${runId}`);
    return value;
  }

  /**
   * Opens the run's log as SSE after sequence `after`. A resumed stream
   * sends Last-Event-ID, as an EventSource does, so the relay answers 204
   * once the run ended and everything was read.
   */
  async openLog(runId: string, after: number, resume: boolean, signal?: AbortSignal, jobUid?: string): Promise<LogResponse> {
    const headers: Record<string, string> = { Accept: "text/event-stream", "Cache-Control": "no-cache" };
    if (resume && after > 0) headers["Last-Event-ID"] = String(after);
    return this.withDeadline(`opening run ${runId}'s log`, signal, async (s) => {
      const res = await this.request(`/v1/runs/${encodeURIComponent(runId)}/log?after=${after}${jobQuery(jobUid, "&")}`, headers, s);
      const status = res.statusCode ?? 0;
      // A stream is the follower's to time out, as it idles; any other
      // answer is read here, within the deadline.
      const text = status === 200 ? "" : (await readBody(res, RELAY_BODY_LIMITS.error, s)).text;
      return { status, body: res, text };
    });
  }

  /** GET /v1/runs with the token: 200 means reachable and the token accepted. */
  async probe(signal?: AbortSignal): Promise<{ status: number; body: string }> {
    return this.getText("/v1/runs?phase=none", "probing the relay", RELAY_BODY_LIMITS.probe, signal);
  }
}

/** The body, or its first maxBytes when it is longer (over: the rest was not read). */
async function readBody(res: IncomingMessage, maxBytes: number, signal: AbortSignal): Promise<{ text: string; over: boolean }> {
  // The signal aborts the request; the body is ended here too rather than
  // trusting every Node version to pass that on to a response in flight.
  const onAbort = () => res.destroy(new Error("the request was aborted"));
  if (signal.aborted) onAbort();
  signal.addEventListener("abort", onAbort, { once: true });
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of res) {
      const b = chunk as Buffer;
      if (size + b.length > maxBytes) {
        chunks.push(b.subarray(0, maxBytes - size));
        res.destroy();
        return { text: Buffer.concat(chunks).toString("utf8"), over: true };
      }
      chunks.push(b);
      size += b.length;
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
  signal.throwIfAborted();
  return { text: Buffer.concat(chunks).toString("utf8"), over: false };
}

function formatBytes(n: number): string {
  if (n % (1 << 20) === 0) return `${n / (1 << 20)} MiB`;
  if (n % (1 << 10) === 0) return `${n / (1 << 10)} KiB`;
  return `${n} bytes`;
}

/** The `job` query parameter that picks a Job's run, or nothing. */
function jobQuery(jobUid: string | undefined, sep: "?" | "&"): string {
  return jobUid ? `${sep}job=${encodeURIComponent(jobUid)}` : "";
}

export type JobState = "active" | "finished" | "gone";

/**
 * What checkJob saw: a state; "waiting", a run suspended until clipjob
 * starts it (asked as often as the relay, so its start or refusal is
 * seen within unknownRunPollMs); or a queued run clipjob refused to start
 * (why, as clipjob wrote it).
 */
export type JobCheck = JobState | "waiting" | { refused: string };

export interface FollowOptions {
  client: RelayClient;
  runId: string;
  /** The last sequence already handed on (0: none). */
  afterSeq?: number;
  /** Each line, once and in order; the next waits for it. */
  onLine: (line: RelayLine) => Promise<void>;
  /** A keepalive comment came: the relay and the run are alive. */
  onKeepalive?: () => void | Promise<void>;
  /** The relay knows the run and a stream is open. */
  onAttached?: (firstTime: boolean) => void | Promise<void>;
  /** Notices about the connection (reconnecting, waiting). */
  onNotice?: (msg: string) => void | Promise<void>;
  /**
   * The Job's state, asked while the relay has no stream for the run: a
   * Job gone before the relay saw it, or ended long ago with the relay
   * still silent, ends the follow instead of waiting forever.
   */
  checkJob?: () => Promise<JobCheck>;
  signal: AbortSignal;
  /** Backoff between reconnects. Default 500 ms doubling to 15 s. */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** How often to ask again while the relay does not know the run yet, at most: the first asks come sooner (unknownRunWaits). Default 2 s. */
  unknownRunPollMs?: number;
  /** How often checkJob is asked meanwhile (while it says "waiting", every unknownRunPollMs). Default 10 s. */
  jobCheckEveryMs?: number;
  /** How long after its Job ended the relay may still not serve the run. Default 60 s. */
  relayGraceMs?: number;
  /** A stream silent this long (keepalives come every 15 s) is reopened. Default 60 s. */
  idleTimeoutMs?: number;
  /** Consecutive 401/403 answers before giving up. Default 5. */
  maxAuthFailures?: number;
  /** The longest SSE line (characters) before a stream counts as broken. Default 16 Mi. */
  maxLineLength?: number;
  /**
   * Checks the relay's record of the run before any of its lines is
   * handed on: why the record is not this run's (another Job carrying the
   * run's id, which the relay bound the id to first), or null. Asked on
   * every connection. A record that is not this run's ends the follow
   * ("mismatch"); one that cannot be read yet is asked again, as a broken
   * stream is (and given up on as one, once the Job ended).
   */
  verifyRun?: (run: RelayRun) => string | null;
  /** The run's Job, when known: its run is asked for, whoever took the run id first. */
  jobUid?: string;
}

export type FollowOutcome =
  | { kind: "ended"; end: RelayEnd | null; lastSeq: number }
  | { kind: "job-gone"; lastSeq: number }
  | { kind: "aborted"; lastSeq: number }
  | { kind: "mismatch"; message: string; lastSeq: number }
  /** A queued run clipjob will never start: its start check refused it, or its agent's queue was full. */
  | { kind: "refused"; message: string; lastSeq: number }
  | {
      kind: "unavailable";
      message: string;
      lastSeq: number;
      /**
       * The Job as checkJob saw it on giving up: "active" means the run
       * goes on, only unfollowed. Absent when unknown or without checkJob.
       */
      jobState?: JobState;
    };

/** Client errors that say "not now" rather than "never": retried. */
const TRANSIENT_4XX = new Set([408, 425, 429]);

/** Retry-After (seconds, or an HTTP date) in ms, at most maxMs; null when absent or unreadable. */
function retryAfterMs(value: string | string[] | undefined, maxMs: number): number | null {
  const v = typeof value === "string" ? value.trim() : "";
  if (v === "") return null;
  const ms = /^\d+$/.test(v) ? Number(v) * 1000 : Date.parse(v) - Date.now();
  if (Number.isNaN(ms)) return null;
  return Math.min(Math.max(ms, 0), maxMs);
}

/** The first wait for a run the relay does not know yet. */
const UNKNOWN_FIRST_WAIT_MS = 250;

/**
 * The waits between asks for a run the relay does not know yet: short at
 * first, since the relay usually sees a new run's pod a second or two
 * after its Job is created and the run's first line waits on the next
 * ask; doubling to maxMs for a run that waits long (one clipjob queued).
 */
export function unknownRunWaits(maxMs: number): () => number {
  let next = Math.min(UNKNOWN_FIRST_WAIT_MS, maxMs);
  return () => {
    const wait = next;
    next = Math.min(next * 2, maxMs);
    return wait;
  };
}

/** Waits ms, or less once signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Follows a run's log until its end event. Lines already handed on (by
 * sequence) are skipped, so a reconnect that repeats some loses nothing
 * and repeats nothing.
 */
export async function followRun(o: FollowOptions): Promise<FollowOutcome> {
  return new Follower(o).follow();
}

/** One follow of a run's log: its timings, where it got to, and what it last said. */
class Follower {
  private readonly initialBackoff: number;
  private readonly maxBackoff: number;
  private readonly unknownPoll: number;
  private readonly unknownWaits: () => number;
  private readonly jobCheckEvery: number;
  private readonly relayGrace: number;
  private readonly idleTimeout: number;
  private readonly maxAuthFailures: number;

  private lastSeq: number;
  private backoff: number;
  private attached = false;
  private authFailures = 0;
  private lastJobCheck = -Infinity;
  private jobWaiting = false;
  private jobEndedAt: number | null = null;
  private lastTrouble = "";

  constructor(private readonly o: FollowOptions) {
    this.initialBackoff = o.initialBackoffMs ?? 500;
    this.maxBackoff = o.maxBackoffMs ?? 15_000;
    this.unknownPoll = o.unknownRunPollMs ?? 2_000;
    this.unknownWaits = unknownRunWaits(this.unknownPoll);
    this.jobCheckEvery = o.jobCheckEveryMs ?? 10_000;
    this.relayGrace = o.relayGraceMs ?? 60_000;
    this.idleTimeout = o.idleTimeoutMs ?? 60_000;
    this.maxAuthFailures = o.maxAuthFailures ?? 5;
    this.lastSeq = o.afterSeq ?? 0;
    this.backoff = this.initialBackoff;
  }

  /** Opens the log again and again until the run's end, a reason to give up, or the abort. */
  async follow(): Promise<FollowOutcome> {
    const o = this.o;
    while (!o.signal.aborted) {
      let res: LogResponse;
      try {
        res = await o.client.openLog(o.runId, this.lastSeq, this.lastSeq > 0, o.signal, o.jobUid);
      } catch (err) {
        if (o.signal.aborted) break;
        const give = await this.retryLater(`relay unreachable (${message(err)}); retrying`, message(err));
        if (give) return give;
        continue;
      }
      const outcome = res.status === 200 ? await this.readStream(res) : await this.noStream(res);
      if (outcome) return outcome;
    }
    return this.aborted();
  }

  private aborted(): FollowOutcome {
    return { kind: "aborted", lastSeq: this.lastSeq };
  }

  private async notice(msg: string): Promise<void> {
    if (msg !== this.lastTrouble) {
      this.lastTrouble = msg;
      await this.o.onNotice?.(msg);
    }
  }

  private async askJob(): Promise<JobCheck | null> {
    try {
      return (await this.o.checkJob?.()) ?? null;
    } catch {
      return null; // the API server is unsure too
    }
  }

  // Giving up: whether the Job still runs tells the caller if the run is
  // lost or only unfollowed. `known`: the state asked a moment ago.
  private async unavailable(message: string, known?: JobState | null): Promise<FollowOutcome> {
    const asked = known === undefined ? await this.askJob() : known;
    // A waiting run's Job is active: the run goes on, unfollowed.
    const jobState = asked === "waiting" ? "active" : typeof asked === "string" ? asked : null;
    return { kind: "unavailable", message, lastSeq: this.lastSeq, ...(jobState ? { jobState } : {}) };
  }

  // While no stream is open: whether to give up, from the Job's state.
  private async withoutStream(why: "unknown" | "error", detail: string): Promise<FollowOutcome | null> {
    const o = this.o;
    const now = Date.now();
    let state: JobState | null | undefined;
    const every = this.jobWaiting ? Math.min(this.unknownPoll, this.jobCheckEvery) : this.jobCheckEvery;
    if (o.checkJob && now - this.lastJobCheck >= every) {
      this.lastJobCheck = now;
      const check = await this.askJob(); // null: keep waiting
      if (check !== null && typeof check === "object") return { kind: "refused", message: check.refused, lastSeq: this.lastSeq };
      this.jobWaiting = check === "waiting";
      state = check === "waiting" ? "active" : check;
      if (state === "gone" && why === "unknown" && this.lastSeq === 0 && !this.attached) return { kind: "job-gone", lastSeq: this.lastSeq };
      if (state === "finished" || state === "gone") this.jobEndedAt ??= now;
    }
    if (this.jobEndedAt !== null && now - this.jobEndedAt >= this.relayGrace) {
      return this.unavailable(
        why === "unknown"
          ? `the relay has no record of run ${o.runId} although its Job ended ${Math.round((now - this.jobEndedAt) / 1000)}s ago: check that the relay follows the Job's namespace and that the token may get pods/log there`
          : `the relay could not be read for run ${o.runId} after its Job ended: ${detail}`,
        state,
      );
    }
    return null;
  }

  // No stream now for a reason that may pass: say so, give up if the Job
  // says to, else wait (Retry-After, else the backoff, which grows).
  private async retryLater(say: string, detail: string, waitMs = this.backoff): Promise<FollowOutcome | null> {
    await this.notice(say);
    const give = await this.withoutStream("error", detail);
    if (give) return give;
    await sleep(waitMs, this.o.signal);
    this.backoff = Math.min(this.backoff * 2, this.maxBackoff);
    return null;
  }

  /** A stream is open (200): its lines, once its record is checked. The outcome, or null to open the log again. */
  private async readStream(res: LogResponse): Promise<FollowOutcome | null> {
    const o = this.o;
    // Each connection is checked before its lines: between two, the
    // relay may have dropped the run (retention, a lost store) and bound
    // its id to another Job.
    if (o.verifyRun) {
      let why: string | null = null;
      let record: RelayRun | null = null;
      try {
        record = await o.client.getRun(o.runId, o.signal, o.jobUid);
        why = record ? o.verifyRun(record) : `the relay serves run ${o.runId}'s log but has no record of it`;
      } catch (err) {
        why = `reading run ${o.runId}'s record to check it: ${message(err)}`;
      }
      if (record && why) {
        res.body.destroy();
        return { kind: "mismatch", message: why, lastSeq: this.lastSeq };
      }
      if (why) {
        res.body.destroy();
        if (o.signal.aborted) return this.aborted();
        return this.retryLater(`${why}; retrying`, why);
      }
    }
    this.authFailures = 0;
    this.jobEndedAt = null;
    this.lastTrouble = "";
    await o.onAttached?.(!this.attached);
    this.attached = true;
    const before = this.lastSeq;
    let end: RelayEnd | null | undefined;
    try {
      end = await consume(res.body, o, this.idleTimeout, (seq) => (this.lastSeq = seq), () => this.lastSeq);
    } catch (err) {
      if (o.signal.aborted) return this.aborted();
      await this.notice(`log stream broke (${message(err)}); resuming after line ${this.lastSeq}`);
    }
    if (end !== undefined) return { kind: "ended", end, lastSeq: this.lastSeq };
    if (o.signal.aborted) return this.aborted();
    // The stream ended without its end event (the relay restarted, a
    // proxy cut it, access was re-checked): resume where it stopped.
    if (this.lastSeq > before) this.backoff = this.initialBackoff;
    await sleep(this.backoff, o.signal);
    this.backoff = Math.min(this.backoff * 2, this.maxBackoff);
    return null;
  }

  /** The relay answered without a stream: the outcome, or null to ask again. */
  private async noStream(res: LogResponse): Promise<FollowOutcome | null> {
    const o = this.o;
    const body = res.text;
    if (res.status === 204) {
      // Reconnected after the end with everything read.
      return { kind: "ended", end: null, lastSeq: this.lastSeq };
    }
    if (res.status === 404) {
      // Not seen yet: its pod does not exist yet (a queued run waits for
      // its agent with no pod at all). No timeout: clipjob ends a run that
      // cannot start, and the Job check above notices a Job that is gone.
      if (!this.attached) await this.notice(`waiting for the relay to see run ${o.runId}'s pod`);
      const give = await this.withoutStream("unknown", relayMessage(body));
      if (give) return give;
      await sleep(this.unknownWaits(), o.signal);
      return null;
    }
    if (res.status === 401 || res.status === 403) {
      this.authFailures++;
      if (this.authFailures >= this.maxAuthFailures) {
        return this.unavailable(`the relay refused the token (${res.status}): ${relayMessage(body)}`);
      }
    } else if (res.status >= 400 && res.status < 500 && !TRANSIENT_4XX.has(res.status)) {
      return this.unavailable(`the relay answered ${res.status}: ${relayMessage(body)}`);
    }
    return this.retryLater(
      `relay answered ${res.status}${body ? `: ${relayMessage(body)}` : ""}; retrying`,
      `${res.status} ${relayMessage(body)}`,
      retryAfterMs(res.body.headers["retry-after"], this.maxBackoff) ?? this.backoff,
    );
  }
}

/**
 * Reads one SSE response: lines are handed on, keepalives reported.
 * Returns the end (null if it carried nothing readable) when the end event
 * came, undefined when the stream closed before it.
 */
async function consume(
  body: IncomingMessage,
  o: FollowOptions,
  idleTimeoutMs: number,
  setSeq: (seq: number) => void,
  getSeq: () => number,
): Promise<RelayEnd | null | undefined> {
  body.setEncoding("utf8");
  const parser = new SseParser({ maxLineLength: o.maxLineLength });
  let idle: NodeJS.Timeout | undefined;
  const arm = () => {
    clearTimeout(idle);
    idle = setTimeout(() => body.destroy(new Error(`no data for ${idleTimeoutMs} ms`)), idleTimeoutMs);
  };
  const onAbort = () => body.destroy();
  o.signal.addEventListener("abort", onAbort, { once: true });
  arm();
  try {
    for await (const chunk of body) {
      arm();
      for (const item of parser.push(chunk as string)) {
        if (item.kind === "comment") {
          await o.onKeepalive?.();
          continue;
        }
        const { event } = item;
        if (event.event === "line") {
          let line: RelayLine;
          try {
            line = JSON.parse(event.data) as RelayLine;
          } catch {
            continue; // not the relay's JSON: nothing to hand on
          }
          const seq = typeof line.seq === "number" ? line.seq : Number(event.id);
          if (!Number.isFinite(seq) || seq <= getSeq()) continue; // already handed on
          await o.onLine({ ...line, seq });
          setSeq(seq);
        } else if (event.event === "end") {
          try {
            return JSON.parse(event.data) as RelayEnd;
          } catch {
            return null;
          }
        }
      }
    }
    return undefined;
  } finally {
    clearTimeout(idle);
    o.signal.removeEventListener("abort", onAbort);
    body.destroy();
  }
}
