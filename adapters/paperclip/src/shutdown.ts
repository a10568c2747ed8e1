// What happens to the Jobs this server follows when the server stops.
// Paperclip's graceful shutdown (SIGTERM, SIGINT) marks every running run
// `interrupted` and does not run it again for an external adapter; it calls
// no adapter hook and does not abort the run's signal, and exits about five
// seconds later. A Job left running would hold the agent's claim with
// nobody following it, so the agent's next runs would be refused (or
// queued) until its deadline. So on that signal the adapter deletes the
// Jobs of the runs it follows, as a cancel does. A crash gives no signal:
// the next run of the agent finds the orphan through clipjob's 409 and
// Paperclip's record of the run (run/submit.ts, reapOrphan).

import type { DeletePropagation } from "./config.js";
import type { KubeApi } from "./kube.js";

interface Followed {
  kube: KubeApi;
  namespace: string;
  job: string;
  uid?: string;
  propagation: DeletePropagation;
  notice: (msg: string) => Promise<void>;
}

const followed = new Map<symbol, Followed>();
// The signal the server is stopping on, once it came.
let stoppingOn: string | null = null;

/** The signal the server is stopping on, or null while it serves. */
export function serverStopping(): string | null {
  return stoppingOn;
}

/** The signals of a graceful stop. */
export const SHUTDOWN_SIGNALS = ["SIGTERM", "SIGINT"] as const;

/**
 * Records that this process follows Job namespace/job, so that a graceful
 * stop of the server deletes it; the returned function forgets it.
 */
export function followUntilShutdown(entry: Followed): () => void {
  if (stoppingOn) {
    // A Job created after the signal was handled: deleted now, as the
    // others were.
    void deleteJob(entry, stoppingOn);
    return () => {};
  }
  const key = Symbol(entry.job);
  followed.set(key, entry);
  watchServerStop();
  return () => followed.delete(key);
}

const handlers = new Map<string, () => void>();

/**
 * Listens for the server's graceful stop, once per process. A run calls
 * it before it creates its Job: a signal between the Job's creation and
 * its follow is then heard, and the follow deletes the Job. Not at
 * import: the host's own handlers are counted here, and Paperclip's
 * server sets them before it serves, so before any run.
 */
export function watchServerStop(): void {
  if (handlers.size > 0) return;
  for (const sig of SHUTDOWN_SIGNALS) {
    // Whether the host handles the signal itself. Counted now, because a
    // handler added with once() is gone by the time the signal reaches
    // this one.
    const hostHandles = process.listenerCount(sig) > 0;
    const handler = () => void onShutdown(sig, hostHandles);
    handlers.set(sig, handler);
    process.on(sig, handler);
  }
}

/** The Jobs followed now (for tests). */
export function followedJobs(): string[] {
  return [...followed.values()].map((f) => `${f.namespace}/${f.job}`);
}

/** Deletes every followed Job; resolves when each deletion was answered. */
export async function deleteFollowedJobs(signal: string): Promise<void> {
  stoppingOn = signal;
  const entries = [...followed.values()];
  followed.clear();
  await Promise.all(entries.map((f) => deleteJob(f, signal)));
}

async function deleteJob(f: Followed, signal: string): Promise<void> {
  await f.notice(`the Paperclip server is stopping (${signal}); it will not follow this run again, so its Job ${f.namespace}/${f.job} is deleted`).catch(() => {});
  await f.kube.deleteJob(f.namespace, f.job, f.propagation, f.uid).catch(() => {});
}

/** Forgets a stop (for tests: one process runs many). */
export function resetStopping(): void {
  stoppingOn = null;
}

/** Stops listening, as a process that never ran a run (for tests). */
export function unwatchServerStop(): void {
  for (const [sig, handler] of handlers) process.off(sig, handler);
  handlers.clear();
}

async function onShutdown(sig: (typeof SHUTDOWN_SIGNALS)[number], hostHandles: boolean): Promise<void> {
  await deleteFollowedJobs(sig);
  // A host with no handler of its own (not Paperclip's server) would have
  // ended on the signal: end as it would have. Paperclip's own shutdown
  // (its drain of runs) must not be cut short.
  if (!hostHandles && process.listenerCount(sig) === 1) process.exit(sig === "SIGTERM" ? 143 : 130);
}
