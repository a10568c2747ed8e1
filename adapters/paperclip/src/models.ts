// The models an agent may pick, as Paperclip's built-in adapter of the same
// agent CLI lists them: the agent in the pod is the same CLI (clipjob's
// claude_local and opencode_local profiles), so it takes the same models.
// The list is read from the built-in adapter the Paperclip server itself
// ships (so it follows the server's version); a copy of
// Paperclip 2026.916's is the fallback when that cannot be loaded.

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

import type { AdapterModel } from "@paperclipai/adapter-utils";

/** @paperclipai/adapter-claude-local 2026.916.1's models. */
export const CLAUDE_MODELS: AdapterModel[] = [
  { id: "claude-opus-4-8", label: "Claude Opus 4.8" },
  { id: "claude-sonnet-5", label: "Claude Sonnet 5" },
  { id: "claude-fable-5-1", label: "Claude Fable 5.1" },
  { id: "claude-fable-5", label: "Claude Fable 5" },
  { id: "claude-mythos-5", label: "Claude Mythos 5" },
  { id: "claude-opus-5", label: "Claude Opus 5" },
  { id: "claude-opus-4-7", label: "Claude Opus 4.7" },
  { id: "claude-opus-4-6", label: "Claude Opus 4.6" },
  { id: "claude-sonnet-4-6", label: "Claude Sonnet 4.6" },
  { id: "claude-sonnet-4-5", label: "Claude Sonnet 4.5" },
  { id: "claude-haiku-4-5", label: "Claude Haiku 4.5" },
];

/** @paperclipai/adapter-opencode-local 2026.916.1's models. */
export const OPENCODE_MODELS: AdapterModel[] = [
  "openai/gpt-5.2-codex",
  "openai/gpt-5.5",
  "openai/gpt-5.4",
  "openai/gpt-5.4-mini",
  "openai/gpt-5.2",
  "openai/gpt-5.1-codex-max",
  "openai/gpt-5.1-codex-mini",
].map((id) => ({ id, label: id }));

/**
 * The models of the built-in adapter package `builtin` as the running
 * Paperclip server has it (resolved from the server's own entry point),
 * else `fallback`.
 */
export async function builtinModels(builtin: string, fallback: AdapterModel[], entry = process.argv[1]): Promise<AdapterModel[]> {
  if (!entry) return fallback;
  try {
    const resolved = createRequire(entry).resolve(builtin);
    const mod = (await import(pathToFileURL(resolved).href)) as { models?: unknown };
    const models = Array.isArray(mod.models) ? mod.models.filter(isModel) : [];
    return models.length > 0 ? models : fallback;
  } catch {
    return fallback;
  }
}

function isModel(m: unknown): m is AdapterModel {
  return typeof m === "object" && m !== null && typeof (m as AdapterModel).id === "string" && typeof (m as AdapterModel).label === "string";
}
