// Package dashboard is the runs page: who is running, who waits in the
// queue and behind whom, which runs clipjob refused at their start and
// why, what each run prints (live), and what finished runs cost.
//
// It is served by `clipjob dashboard` on loopback, as `kubectl proxy` and
// `istioctl dashboard` serve theirs: the command reads Jobs and claim
// Leases with the viewer's own kubeconfig, so the viewer sees exactly the
// runs their RBAC lets them list, and nothing more. Logs, results and runs
// whose Job is gone come from the relay's API with a relay token the
// viewer already holds; the command shows a relay record only in a
// namespace where the viewer, as their kubeconfig, may also `get pods/log`
// (a SelfSubjectAccessReview). No credential is made for the page and the
// token never reaches the browser.
//
// rows.go turns Jobs, Leases and relay records into the page's run rows
// (pure, unit-tested); server.go serves the page (web/, embedded: no
// external asset, no build step), the rows as JSON and as a live event
// stream, and each run's log followed through the relay.
package dashboard
