// Package kind is the e2e suite's in-cluster half, for machines with a
// Docker engine: `make e2e-kind` builds the image, loads it into a kind
// cluster and runs these tests, which install the chart as a cluster admin
// would (in-cluster pods, self-managed certificates, the Service), check
// it with clipjob doctor and try its promises through the API server. It
// shares its code path with the local suite: the chart installed through
// harness.Helm, and doctor.Run.
//
// The tests are behind the build tag "kind"; `make test` compiles them
// (go vet -tags kind), it cannot run them: the local machines have no
// Docker engine.
package kind
