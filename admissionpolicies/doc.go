// Package admissionpolicies keeps clipjob's compiled
// MutatingAdmissionPolicy (package compile) in the cluster, for the
// source's namespace, compiled from the source Deployment
// and the config in force, rewritten when either changes or someone else
// changes them, deleted when they are no longer wanted. It runs on the
// elected webhook replica when the webhook is started with
// --compiled-policies (chart value compiledPolicies.enabled).
//
// The policies let the API server complete a bare agent Job itself; the
// chart then registers the mutating webhook so that it is not called for
// a Job a policy completed, and the validating webhook's rendered rule
// refuses any Job that is not exactly clipjob's render — one a stale
// policy completed included — so a policy can only ever save a round
// trip, never admit a Job clipjob would not.
package admissionpolicies
