// Package relay is clipjob's log relay: it follows every agent pod's
// containers through the Kubernetes log API as they write, stores each
// line once, durably, with a per-run sequence number, parses the run's
// result, and serves runs and their logs over HTTP — still there after the
// Job and its pods are gone.
//
// The pieces, from the wire inward:
//
//   - discovery.go watches pods labeled paperclip.io/run-id and starts one
//     follower per container instance (pod UID, container, container ID).
//   - follow.go streams a container's log with timestamps, resumes after a
//     broken stream or a restart from the stored cursor, and reconnects
//     before the API server's long-request cut-offs.
//   - cursor.go is the exactly-once rule: SinceTime has one-second
//     resolution, so a resume re-reads the second it stopped in and skips
//     what the cursor (last timestamp, lines seen at it) says is stored.
//   - store.go keeps lines, cursors and run metadata in bbolt; lines and
//     their cursor commit in one transaction.
//   - redact.go removes known secret values and token patterns before
//     anything is stored; result.go reads Claude stream-json and OpenCode
//     JSON results.
//   - api.go serves the HTTP API (SSE and NDJSON) behind TokenReview and
//     SubjectAccessReview.
//
// cmd/clipjob-relay runs it.
package relay
