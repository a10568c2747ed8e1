// Package compile turns what templates.Render does to a bare agent Job
// into admission policies the API server evaluates itself, so an agent
// Job is completed even while clipjob's webhook is unreachable, at the
// cost of in-process CEL instead of a webhook round trip.
//
// The policies are compiled from Render, not written beside it: the
// compiler renders a probe Job carrying every run value (labels, run
// options, the env Secret, the working directory, the prompt) as a
// sentinel, then without each one in turn, and writes what the renders
// have in common as constants and what one value changes as CEL guarded
// by that value's presence, with the request's value in place of the
// sentinel. A render the compiler cannot express that way (a field two
// values change, a sentinel inside a longer string, a field Render newly
// sets) fails the compile rather than approximating it.
//
// Values longer than a line or two of CEL (the container's fields, the
// volumes) are policy variables the patch reads: the API server's type
// check grows with the square of an expression's size (see hoist).
//
// A policy applies only to the Jobs it completes exactly as Render does
// (its matchConditions): bare Jobs of its profile whose run values Render
// accepts. Everything else — a Job with containers of its own, a value
// Render refuses (a mutating policy cannot refuse) — is left to the
// webhook. The tests hold each policy's result equal to Render's over the
// golden fixtures, every combination of run values and fuzzed values.
package compile
