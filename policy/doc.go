// Package policy is clipjob's pure core for validation.
//
// Evaluate checks a final (mutated) Job against the configured policy and
// returns the violations as a field.ErrorList, plus warnings: image
// allowlist, Pod Security "restricted" (k8s.io/pod-security-admission's own
// checks), label integrity, allowed namespaces and the shared claim. It has
// no I/O; the one fact it needs from the cluster, a PersistentVolumeClaim,
// comes through a lookup function. The validating webhook and
// `clipjob check` both call it, so they give the same verdict.
//
// "One active run per agent" is not a rule of this package: it needs the
// API server as the arbiter, and lives in package claim.
package policy
