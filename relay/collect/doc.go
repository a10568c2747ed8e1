// Package collect turns agent pods into stored log lines.
//
//   - discovery.go: the Collector watches pods labeled paperclip.io/run-id
//     and starts one follower per container instance (pod UID, container,
//     container ID); it finishes a run, with its result, once every
//     stream is drained.
//   - follow.go streams a container's log with timestamps, resumes after a
//     broken stream or a restart from the stored cursor, and reconnects
//     before the API server's long-request cut-offs.
//   - resume.go is the exactly-once rule: SinceTime has one-second
//     resolution, so a resume re-reads the second it stopped in and skips
//     what the cursor (last timestamp, lines seen at it) says is stored.
//   - redact.go removes known secret values and token patterns before
//     anything is stored.
//   - mirror.go keeps each run's agent output as NDJSON on the shared
//     volume, where Paperclip's Claude adapter reads it.
package collect
