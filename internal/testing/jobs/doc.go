// Package jobs builds agent Jobs, and the Pods a Job controller makes from
// them, for tests, so a test reads like the run it describes:
//
//	jobs.MakeJob("run-1", "paperclip").Agent("a").Adapter("claude_local").Queued().Obj()
//
// The shape follows Kueue's testingjobs wrappers: a wrapper around the API
// object, one method per fact, Obj() to finish. Every Job it builds has a
// UID derived from its name, as the API server would give it one.
package jobs
