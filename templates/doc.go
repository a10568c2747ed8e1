// Package templates is clipjob's pure core for mutation: it turns a bare
// agent Job into the complete Job that runs.
//
// Two steps, both without I/O:
//
//   - Inherit reads the source workload's pod template (the Paperclip
//     Deployment) into an Inherited value: image, pull secrets, DNS, the
//     shared PersistentVolumeClaim, secret volumes, filtered env and envFrom.
//     The webhook computes it once per source revision, not per request.
//   - Render applies the selected profile and the inherited values to a Job,
//     restores the security floor and records what it did in annotations.
//
// Precedence is inherited < profile < what the Job sets itself, except for
// the security floor, which nothing lowers. A field left at the value the
// API server defaults it to (backoffLimit 6, dnsPolicy ClusterFirst,
// restartPolicy Always) counts as unset, because by the time a mutating
// webhook sees a Job the API server has already defaulted it and cannot
// tell "unset" from "set to the default".
//
// Render is idempotent: rendering a rendered Job returns it unchanged. The
// webhook (package webhook), the offline CLI (clipjob render) and the golden
// tests in testdata/ all call Render, so what the CLI prints is what the
// cluster stores.
package templates
