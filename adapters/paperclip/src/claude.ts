// Entry for the Claude adapter (claude_k8s), the same as the main entry.

import type { ServerAdapterModule } from "@paperclipai/adapter-utils";

import { agentConfigurationDoc as docFor, CLAUDE_ADAPTER, createClipjobAdapter } from "./adapter.js";

export const type = CLAUDE_ADAPTER.type;
export const label = CLAUDE_ADAPTER.label;
export const models = CLAUDE_ADAPTER.models;
export const agentConfigurationDoc = docFor(CLAUDE_ADAPTER);

export function createServerAdapter(): ServerAdapterModule {
  return createClipjobAdapter(CLAUDE_ADAPTER);
}
