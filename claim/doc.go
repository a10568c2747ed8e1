// Package claim enforces "at most one active run per agent" and runs the
// agent queue.
//
// Lock is the arbiter: a coordination.k8s.io Lease per agent, created or
// taken over with optimistic concurrency, so two concurrent creates on any
// number of webhook replicas cannot both pass (a cache or a LIST would be
// check-then-act). The validating webhook calls Acquire; a dry run decides
// the same way and writes nothing. kube.go reaches the API server live for
// it, never through a cache.
//
// Controller is the reconciler half, on the webhook's controller-runtime
// manager and run by the elected replica only: keyed by agent, it frees the
// claim of a run whose Job finished or was deleted once its pods are gone,
// and starts the oldest queued run of a free agent (Queue mode), with
// rate-limited requeues rather than timers. A sweeper deletes claims no
// event freed and wakes agents with queued runs. Admission never depends
// on the controller for safety: a claim whose holder ended is free to take
// anyway.
//
// The Lock's tests keep a hand-written Lease store: client-go's fake does
// not check resourceVersions, and the races it must survive are exactly
// conflicting writes at a stale resourceVersion.
package claim
