// Package webhook is clipjob's admission server: the mutating handler that
// completes bare agent Jobs (and, later, the validating one), the informer
// cache of the source Deployment, metrics, and the controller-runtime
// server that serves them over TLS with certificates reloaded from disk.
//
// Handlers are thin: decode the request, fetch the facts (the Config in
// force, the inherited source values) through small interfaces, call the
// pure core in package templates, and turn its result into an admission
// response. Nothing here renders a Job; see templates.Render.
//
// Run wires it all together; cmd/clipjob-webhook is a flag parser around it.
package webhook
