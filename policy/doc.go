// Package policy is clipjob's pure core for validation, and the per-agent
// run claim.
//
// Evaluate checks a final (mutated) Job against the configured policy and
// returns the violations as a field.ErrorList, plus warnings: image
// allowlist, Pod Security "restricted" (k8s.io/pod-security-admission's own
// checks), label integrity, allowed namespaces and the shared claim. It has
// no I/O; the one fact it needs from the cluster, a PersistentVolumeClaim,
// comes through a lookup function. The validating webhook and
// `clipjob check` both call it, so they give the same verdict.
//
// Claims enforces "at most one active run per agent" with the API server as
// the arbiter: a coordination.k8s.io Lease per agent, created or taken over
// with optimistic concurrency, so two concurrent creates on any number of
// webhook replicas cannot both pass. A cache or a LIST would be
// check-then-act. Release and Sweep free claims whose Job finished or vanished.
package policy
