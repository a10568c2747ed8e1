// Package e2e is clipjob's end-to-end suite. It runs against a real
// kube-apiserver: by default a local control plane started by package
// cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kwok as host processes), with the clipjob-webhook binary running on the
// host and registered through a MutatingWebhookConfiguration with a
// caBundle, exactly as the API server would call it in a cluster.
//
// Run it with `make e2e` (or go test ./e2e/). The first run builds the
// Kubernetes binaries from the Go module proxy, which takes several minutes.
package e2e
