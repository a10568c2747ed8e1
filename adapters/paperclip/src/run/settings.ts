// The run's first stage: its settings (the agent's config over the
// server's environment) and the clients of the cluster and the relay.
// Invalid settings end the run with nothing created.

import type { AdapterExecutionContext } from "@paperclipai/adapter-utils";

import { resolveSettings, SettingsError, type ClipjobSettings } from "../config.js";
import type { AdapterDefinition } from "../definitions.js";
import { kubeClient, relayClient, type AdapterDeps } from "../deps.js";
import { ErrorCodes, failureResult, message } from "../errors.js";
import type { KubeApi } from "../kube.js";
import type { RelayClient } from "../relay.js";
import { noticeFor, type RunEnds } from "./run.js";

/** The run's settings, its warnings said as notices; config_invalid when they cannot be resolved. */
export async function runSettings(def: AdapterDefinition, ctx: AdapterExecutionContext, deps: AdapterDeps): Promise<{ settings: ClipjobSettings } | RunEnds> {
  const notice = noticeFor(ctx);
  const warnings: string[] = [];
  let settings: ClipjobSettings;
  try {
    settings = resolveSettings(ctx.config ?? {}, { profile: def.profile }, (w) => warnings.push(w), deps.env);
  } catch (err) {
    if (!(err instanceof SettingsError)) throw err;
    for (const w of warnings) await notice(w);
    return { result: failureResult(ErrorCodes.configInvalid, `The run cannot be submitted (nothing was created): ${err.message}`) };
  }
  for (const w of warnings) await notice(w);
  return { settings };
}

/** The run's cluster and relay clients; a cluster configuration that cannot be loaded ends the run. */
export function runClients(settings: ClipjobSettings, deps: AdapterDeps): { kube: KubeApi; relay: RelayClient } | RunEnds {
  let kube: KubeApi;
  try {
    kube = kubeClient(settings, deps);
  } catch (err) {
    return {
      result: failureResult(
        ErrorCodes.jobCreateFailed,
        `Loading the Kubernetes client configuration${settings.kubeconfig ? ` from ${settings.kubeconfig}` : ""}: ${message(err)}`,
      ),
    };
  }
  return { kube, relay: relayClient(settings, deps) };
}
