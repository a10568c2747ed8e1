// Package relay is clipjob's log relay: it follows every agent pod's
// containers through the Kubernetes log API as they write, stores each
// line once, durably, with a per-run sequence number, parses the run's
// result, and serves runs and their logs over HTTP — still there after the
// Job and its pods are gone.
//
// One room per job, from the wire inward:
//
//   - collect finds agent pods (labeled paperclip.io/run-id) through a
//     work queue and follows one stream per container instance with
//     exactly-once resume;
//   - redact removes secrets from lines before they are stored;
//   - mirror keeps each run's NDJSON file on the shared volume;
//   - store says what a store keeps; store/bolt keeps runs, lines and
//     each stream's cursor in bbolt, store/postgres in PostgreSQL, where
//     replicas divide the runs (replicas);
//   - result reads the run's result from its lines;
//   - api serves runs and logs (JSON, SSE, NDJSON) behind TokenReview and
//     SubjectAccessReview.
//
// This package wires them on a controller-runtime manager (metrics,
// probes, the pod informer) and owns the shutdown order correctness
// needs — the API, then collection, then the store — in server.go.
// cmd/clipjob-relay runs it.
package relay
