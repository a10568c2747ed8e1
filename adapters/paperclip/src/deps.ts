// What a run and the environment check reach outside the process through
// (the cluster, the relay, Paperclip's API) and the follower's timings:
// the seams tests replace, and the real clients used when they do not.

import type { ClipjobSettings } from "./config.js";
import { kubeApi, loadKubeConfig, type KubeApi } from "./kube.js";
import { paperclipRuns, type PaperclipRuns } from "./paperclip.js";
import { RelayClient, type FollowOptions } from "./relay.js";
import { SHARED_VOLUME_PATH } from "./contract.js";
import { serverHome, type RunHome } from "./rundirs.js";

/** Seams for tests: the cluster, the relay, and the follower's timings. */
export interface AdapterDeps {
  kube?: (settings: ClipjobSettings) => KubeApi;
  relay?: (settings: ClipjobSettings) => RelayClient;
  follow?: Partial<
    Pick<FollowOptions, "initialBackoffMs" | "maxBackoffMs" | "unknownRunPollMs" | "jobCheckEveryMs" | "relayGraceMs" | "idleTimeoutMs" | "maxAuthFailures">
  >;
  /** How often a cancelled Job is checked for being gone. Default 1 s. */
  cancelPollMs?: number;
  /** How long a run waits for clipjob to let go of an agent whose holding Job has ended. Default 15 s. */
  releaseGraceMs?: number;
  env?: NodeJS.ProcessEnv;
  /** Paperclip's API, as the run (whether a run is still live there). */
  paperclip?: (settings: ClipjobSettings, token: string | undefined) => PaperclipRuns;
  /** Where the server's home and the shared volume are: the test's, else PAPERCLIP_HOME and /paperclip. */
  runHome?: RunHome;
}

const defaultKube = (s: ClipjobSettings): KubeApi => kubeApi(loadKubeConfig(s.kubeconfig));
const defaultRelay = (s: ClipjobSettings): RelayClient =>
  new RelayClient({ baseUrl: s.relayUrl, tokenFile: s.relayTokenFile, caFile: s.relayCaFile || undefined });

/** The cluster's API for these settings: the test's, else from the kubeconfig (throws when there is none). */
export function kubeClient(settings: ClipjobSettings, deps: AdapterDeps): KubeApi {
  return (deps.kube ?? defaultKube)(settings);
}

/** The relay's client for these settings: the test's, else the real one. */
export function relayClient(settings: ClipjobSettings, deps: AdapterDeps): RelayClient {
  return (deps.relay ?? defaultRelay)(settings);
}

/** Paperclip's API as the run whose token is token: the test's, else the server's own (PAPERCLIP_API_URL). */
export function paperclipClient(settings: ClipjobSettings, token: string | undefined, deps: AdapterDeps): PaperclipRuns {
  return deps.paperclip ? deps.paperclip(settings, token) : paperclipRuns(settings.serverApiUrl, token);
}

/** Where the server's home and the volume pods share are. */
export function runHome(deps: AdapterDeps): RunHome {
  return deps.runHome ?? { ...serverHome(), sharedVolume: SHARED_VOLUME_PATH };
}
