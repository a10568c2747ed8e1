// Package relay is clipjob's log relay: it follows every agent pod's
// containers through the Kubernetes log API as they write, stores each
// line once, durably, with a per-run sequence number, parses the run's
// result, and serves runs and their logs over HTTP — still there after the
// Job and its pods are gone.
//
// One room per job, from the wire inward:
//
//   - collect finds agent pods (labeled paperclip.io/run-id), follows one
//     stream per container instance with exactly-once resume, redacts
//     secrets, and keeps the NDJSON mirror on the shared volume;
//   - store keeps runs, lines and each stream's cursor in bbolt;
//   - result reads the run's result from its lines;
//   - api serves runs and logs (JSON, SSE, NDJSON) behind TokenReview and
//     SubjectAccessReview.
//
// This package wires them on a controller-runtime manager (metrics,
// probes, the pod informer) and owns the shutdown order correctness
// needs — the API, then collection, then the store — in server.go.
// cmd/clipjob-relay runs it.
package relay
