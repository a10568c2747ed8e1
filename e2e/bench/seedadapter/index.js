// The baseline's file-tail type (bench_seed_file): the seed claude-k8s
// adapter's log path since its v0.2 (the pod tees its stdout to the
// shared volume, the server tails that file).
import { createSeedAdapter } from "./seed.js";

export const type = "bench_seed_file";
export const label = "Seed claude-k8s (file tail), make bench's baseline";

export function createServerAdapter() {
  return createSeedAdapter(type, "file");
}
