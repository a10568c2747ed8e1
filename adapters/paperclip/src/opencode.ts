// Entry for the OpenCode adapter (opencode_k8s): Paperclip loads one
// adapter per entry, so OpenCode agents get their own.

import type { ServerAdapterModule } from "@paperclipai/adapter-utils";

import { agentConfigurationDoc as docFor, createClipjobAdapter, OPENCODE_ADAPTER } from "./adapter.js";

export const type = OPENCODE_ADAPTER.type;
export const label = OPENCODE_ADAPTER.label;
export const models = OPENCODE_ADAPTER.models;
export const agentConfigurationDoc = docFor(OPENCODE_ADAPTER);

export function createServerAdapter(): ServerAdapterModule {
  return createClipjobAdapter(OPENCODE_ADAPTER);
}
