#!/usr/bin/env bash
# Runs the in-cluster e2e tests (e2e/kind) on a kind cluster, on a machine
# with no container registry: everything comes from the Go module proxy and
# Debian's packages (hack/kind/: a Docker engine of its own, kind, a node
# image built locally, clipjob's image from `make image`). See
# hack/kind/e2e.sh for the steps and docs/real-node.md for the times.
set -euo pipefail
exec bash "$(dirname "$0")/kind/e2e.sh" "$@"
