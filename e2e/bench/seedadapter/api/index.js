// The baseline's log-API type (bench_seed_api): the seed adapters' other
// log path (claude-k8s before v0.2, opencode-k8s still): wait for the pod
// to run, then follow the Kubernetes log API.
import { createSeedAdapter } from "../seed.js";

export const type = "bench_seed_api";
export const label = "Seed claude-k8s (log API), make bench's baseline";

export function createServerAdapter() {
  return createSeedAdapter(type, "api");
}
