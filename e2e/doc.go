// Package e2e holds clipjob's end-to-end tests, in tiers by what they
// need (docs/development.md, "Tiers"):
//
//   - integration: one local control plane (etcd, kube-apiserver,
//     controller manager, scheduler, kwok) shared by tests running in
//     parallel, each with clipjob installed for namespaces of its own
//     (harness.Install): admission, claims, queueing, RBAC, the relay and
//     the Paperclip adapter against simulated pods.
//   - realnode: the same control plane with a real kubelet and containerd
//     beside kwok, for what needs real containers: the agents' floor on a
//     real runtime, the chart's own pods, cert-manager, egress policies,
//     the real Paperclip server.
//
// Package cluster starts the control plane and the real node; package
// harness installs clipjob into it the way the Helm chart would, and holds
// the helpers tests share. The clipjob-webhook and clipjob-relay binaries
// run on the host with the chart's ServiceAccounts' tokens, so the API
// server calls them, and they call it, exactly as in a cluster.
//
// Each test is named after the behaviour it pins and tries to break it the
// way a client would, not only to show it working.
package e2e
