// Package cluster starts a real, local Kubernetes control plane for tests
// and the demo: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok (which plays the nodes and the pod lifecycle), as
// host processes on loopback. Admission therefore goes through the real API
// server's webhook machinery over TLS, and Jobs become Pods through the real
// Job controller and scheduler.
//
// The binaries come from hack/kube-binaries.sh, which builds them from the
// Go module proxy at the Kubernetes version matching go.mod and caches them;
// KUBE_BIN_DIR points at a directory that already holds them, and
// KUBEBUILDER_ASSETS (envtest) supplies etcd and kube-apiserver.
//
// The pod lifecycle is scripted by kwok stages (kwok.yaml): a pod becomes
// Running and stays so until the test annotates it with
// AnnotationExitCode, then it terminates with that code. Tests decide when
// a run ends.
package cluster
