// Whether a Job is this server's: clipjob's webhook records the user who
// created each Job (created-by), and only Jobs this server created are its
// runs, whatever labels they carry (anyone who may create Jobs here can
// copy those). Asked before re-attaching, before following an earlier
// attempt's Job, and before deleting an orphan.

import type { V1Job } from "@kubernetes/client-node";

import { ANNOTATION_CREATED_BY } from "../contract.js";
import { readKubeError } from "../errors.js";
import type { Run } from "./run.js";

/** Whether clipjob says this server created a Job, or why that cannot be told. */
export type Ownership = { ours: true } | { foreign: string } | { unknown: string };

/** The Job's created-by (written by clipjob's webhook) against this server's user `me`. */
export function ownership(job: V1Job, me: string | { error: string }): Ownership {
  const by = job.metadata?.annotations?.[ANNOTATION_CREATED_BY];
  if (by === undefined) return { unknown: `it does not record who created it (no ${ANNOTATION_CREATED_BY}: clipjob did not admit it, or is older than that annotation)` };
  if (typeof me !== "string") return { unknown: `this server's own user could not be read to compare (SelfSubjectReview: ${me.error})` };
  return by === me ? { ours: true } : { foreign: `it was created by ${by}, not by this server (${me})` };
}

/** Whether the run's server created the Job, asking the API server who it is once. */
export async function ownershipOf(run: Run, job: V1Job): Promise<Ownership> {
  try {
    return ownership(job, await run.selfUser());
  } catch (err) {
    return ownership(job, { error: readKubeError(err).message });
  }
}
