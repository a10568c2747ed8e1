// Package decide is clipjob's one decision about a Job: whether it is an
// agent run, what it becomes, and whether it is admitted. The mutating
// webhook calls Mutate, the validating webhook Validate, and the offline
// CLI Create, which is the two in the order the API server runs them; so
// the cluster and `clipjob check` cannot decide differently.
//
// What a decision needs of the cluster comes in as Facts: the source
// workload, and the Secrets and PersistentVolumeClaims a Job references.
// The webhook answers from its caches and the API server; the CLI from
// the manifests it was given, and for anything else a
// *policy.FactUnknown, which the verdict reports as undecided, saying
// what the cluster would do with and without the fact, never guessing.
//
// The package is pure: no I/O but through Facts, no Kubernetes client.
package decide
