// Package e2e is clipjob's end-to-end suite. It runs against a real
// kube-apiserver: a local control plane started by package cluster (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok as host
// processes). The clipjob-webhook and clipjob-relay binaries run on the
// host, built from this module by package harness, which registers the
// chart's Mutating and ValidatingWebhookConfigurations (pointed at the host
// with a caBundle) and runs each binary as a ServiceAccount holding only
// the rules of the chart's ClusterRoles, so the API server calls them, and
// they call it, exactly as in a cluster.
//
// Each test is named after the behaviour it pins and tries to break it the
// way a client would, not only to show it working.
//
// Run it with `make e2e` (or `go test ./e2e/`). The first run builds the
// Kubernetes binaries from the Go module proxy, which takes several minutes.
package e2e
