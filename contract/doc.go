// Package contract names the bare-Job contract between Paperclip and
// clipjob: the labels and annotations a client puts on a Job, the ones
// clipjob writes back, and the env and paths an agent container reads.
//
// It depends on the standard library alone, so every room that needs to
// know what an agent run looks like — the renderer, the policy, the claim
// controller, the relay, the CLI and the e2e suite — can import it without
// importing one another. docs/contract.md is the user-facing
// description of the same names.
package contract
