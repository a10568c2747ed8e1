// Package charts holds clipjob's Helm chart (charts/clipjob) and renders
// it with Helm's own Go engine, so the chart tests, the e2e suite and
// `clipjob doctor` use exactly the objects a `helm install` creates: the
// e2e suite runs the binaries with the chart's RBAC and registers the
// chart's webhook configurations.
package charts
