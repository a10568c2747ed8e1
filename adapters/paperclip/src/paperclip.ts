// What the adapter asks the Paperclip server it runs in: whether a run is
// still live there. A Job outlives the server that follows it: after a
// crash (SIGKILL, an OOM kill, a lost node) Paperclip marks the run
// `process_lost` and nobody follows its Job, which keeps the agent's
// claim, so clipjob refuses (or queues) every later run of the agent
// until it ends. Paperclip is the one who knows a run is over; it answers
// with the run's own token (the agent's JWT, which reads its company's
// runs).

import { apiBase } from "./podenv.js";

/** Run statuses after which Paperclip follows the run no more. */
export const ENDED_RUN_STATUSES = new Set(["succeeded", "failed", "cancelled", "timed_out", "interrupted"]);

export interface PaperclipRuns {
  /** The run's status in Paperclip, or why it cannot be learnt (no URL or token, not found, an error). */
  runStatus(runId: string, signal?: AbortSignal): Promise<{ status: string } | { unknown: string }>;
}

/** Paperclip's API at baseUrl (the server's own PAPERCLIP_API_URL), as the run whose token is token. */
export function paperclipRuns(baseUrl: string, token: string | undefined, fetchImpl: typeof fetch = fetch): PaperclipRuns {
  return {
    async runStatus(runId, signal) {
      if (!baseUrl) return { unknown: "the server's PAPERCLIP_API_URL is not set" };
      if (!token) return { unknown: "the run has no token for Paperclip's API" };
      const base = apiBase(baseUrl);
      if (!base) return { unknown: `PAPERCLIP_API_URL ${JSON.stringify(baseUrl)} is not a URL` };
      const url = `${base.origin}${base.path}/api/heartbeat-runs/${encodeURIComponent(runId)}`;
      try {
        const res = await fetchImpl(url, {
          headers: { authorization: `Bearer ${token}`, accept: "application/json" },
          signal: signal ? AbortSignal.any([signal, AbortSignal.timeout(10_000)]) : AbortSignal.timeout(10_000),
        });
        if (!res.ok) return { unknown: `Paperclip answered HTTP ${res.status} for run ${runId}` };
        const body = (await res.json()) as { status?: unknown };
        return typeof body.status === "string" ? { status: body.status } : { unknown: `Paperclip's answer for run ${runId} has no status` };
      } catch (err) {
        return { unknown: `asking Paperclip about run ${runId}: ${err instanceof Error ? err.message : String(err)}` };
      }
    },
  };
}
