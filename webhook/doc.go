// Package webhook is clipjob's admission server: the mutating handler that
// completes bare agent Jobs, the validating handler that enforces policy on
// the final Job and takes the agent's claim, the informer cache of the
// source Deployment, metrics and /configz, and the controller-runtime
// manager that serves them over TLS with certificates reloaded from disk.
//
// Handlers are thin: decode the request (decode.go, shared by both), fetch
// the facts (the Config in force, the inherited source values, PVCs)
// through small interfaces, call a pure core — templates.Render to
// complete, policy.Evaluate to judge — and turn its result into an
// admission response. Nothing here renders a Job or decides a rule.
//
// Run wires it all together from Options (DefaultOptions holds every
// default); cmd/clipjob-webhook/app binds flags to them.
package webhook
