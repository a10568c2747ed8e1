// Package images holds the programs of the e2e suite's container images,
// assembled with internal/ociimage and loaded into the real node's
// containerd by e2e/cluster: pause (the pod sandbox) and fakeagent (an
// agent CLI that behaves like a real run without a model).
package images
