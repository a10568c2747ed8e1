// The package's entry: Paperclip's plugin loader imports it and calls
// createServerAdapter(). The main entry is the Claude adapter (claude_k8s);
// "./opencode" is the OpenCode one, and createClipjobAdapter() makes one
// for any other clipjob profile.

import type { ServerAdapterModule } from "@paperclipai/adapter-utils";

import { agentConfigurationDoc as docFor, CLAUDE_ADAPTER, createClipjobAdapter } from "./adapter.js";

export const type = CLAUDE_ADAPTER.type;
export const label = CLAUDE_ADAPTER.label;
export const models = CLAUDE_ADAPTER.models;
export const agentConfigurationDoc = docFor(CLAUDE_ADAPTER);

export function createServerAdapter(): ServerAdapterModule {
  return createClipjobAdapter(CLAUDE_ADAPTER);
}

export {
  CLAUDE_ADAPTER,
  OPENCODE_ADAPTER,
  REQUIRED_ACCESS,
  createClipjobAdapter,
  executeRun,
  sessionCodec,
  testClipjobEnvironment,
  type AdapterDefinition,
  type AdapterDeps,
} from "./adapter.js";
export { resolveSettings, type ClipjobSettings, DEFAULT_RELAY_URL, DEFAULT_RELAY_TOKEN_FILE } from "./config.js";
export * as contract from "./contract.js";
export { ErrorCodes, classifyCreateError, readKubeError, type ErrorCode } from "./errors.js";
export { buildRunObjects, jobNameFor, type RunObjects, type BuildRunInput } from "./job.js";
export { kubeApi, loadKubeConfig, type KubeApi } from "./kube.js";
export { RelayClient, followRun, type RelayRun, type RelayResult, type RelayLine, type RelayEnd, type FollowOutcome } from "./relay.js";
export { toExecutionResult } from "./result.js";
