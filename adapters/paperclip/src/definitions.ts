// The adapter types this package provides: each is a Paperclip adapter
// type and the clipjob profile its runs use.

import type { AdapterModel } from "@paperclipai/adapter-utils";

import { CLAUDE_MODELS, OPENCODE_MODELS } from "./models.js";

/** One Paperclip adapter type and the clipjob profile its runs use. */
export interface AdapterDefinition {
  /**
   * Paperclip's adapter type. Not a built-in type: Paperclip would let it
   * take one over, which would move every local agent of that type to
   * Kubernetes at once (see the README).
   */
  type: string;
  label: string;
  /** The paperclip.io/adapter-type label: the clipjob profile (config key `profile` overrides it). */
  profile: string;
  /** The models an agent may pick, and the built-in adapter package whose list they follow. */
  models?: AdapterModel[];
  builtinPackage?: string;
}

export const CLAUDE_ADAPTER: AdapterDefinition = {
  type: "claude_k8s",
  label: "Claude (Kubernetes, clipjob)",
  profile: "claude_local",
  models: CLAUDE_MODELS,
  builtinPackage: "@paperclipai/adapter-claude-local",
};
export const OPENCODE_ADAPTER: AdapterDefinition = {
  type: "opencode_k8s",
  label: "OpenCode (Kubernetes, clipjob)",
  profile: "opencode_local",
  models: OPENCODE_MODELS,
  builtinPackage: "@paperclipai/adapter-opencode-local",
};
