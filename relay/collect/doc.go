// Package collect turns agent pods into stored log lines.
//
//   - controller.go: the Collector is a controller. Pod events and the
//     ends of its followers put the pod in a rate-limited work queue; a
//     reconcile per pod records its run, starts one follower per
//     container instance (pod UID, container, container ID), and finishes
//     the run, with its result, once every stream is drained. A failed
//     reconcile is tried again through the queue's rate limiter.
//   - follow.go streams a container's log with timestamps, resumes after a
//     broken stream or a restart from the stored cursor, and reconnects
//     before the API server's long-request cut-offs.
//   - resume.go is the exactly-once rule: SinceTime has one-second
//     resolution, so a resume re-reads the second it stopped in and skips
//     what the cursor (last timestamp, lines seen at it) says is stored.
//   - budget.go bounds the lines all followers hold between reading and
//     committing them.
//
// Lines are redacted (package redact) before they are stored, and each
// commit syncs the run's NDJSON file (package mirror).
package collect
