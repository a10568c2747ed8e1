#!/usr/bin/env bash
# Runs the in-cluster e2e tests (e2e/kind) on a kind cluster: builds the
# image, loads it into the cluster's nodes and lets the tests install the
# chart with it. Needs a running Docker engine; kind itself is built from
# the Go module proxy and cached like the control-plane binaries.
#
# Environment:
#   KIND_VERSION      kind to build (default below)
#   KIND_CLUSTER      cluster name (default clipjob-e2e; created if missing, kept after)
#   CLIPJOB_CACHE_DIR cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/clipjob)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "e2e-kind: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
  log "needs a running Docker engine, and this machine has none; the local suite (make test) runs without one"
  exit 1
fi
KIND_VERSION=${KIND_VERSION:-v0.30.0}
cluster=${KIND_CLUSTER:-clipjob-e2e}
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}
bin="$cache/kind/$KIND_VERSION"
mkdir -p "$bin"
if [ ! -x "$bin/kind" ]; then
  log "building kind $KIND_VERSION"
  GOBIN="$bin" go install "sigs.k8s.io/kind@$KIND_VERSION"
fi
kind="$bin/kind"
kubeconfig="$cache/kind/$cluster.kubeconfig"
if ! "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "creating cluster $cluster"
  "$kind" create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 120s
else
  "$kind" get kubeconfig --name "$cluster" >"$kubeconfig"
fi
version=$(sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' "$root/charts/clipjob/Chart.yaml")
image="ghcr.io/paperclipai/clipjob:$version-e2e"
log "building $image"
docker build -t "$image" "$root"
"$kind" load docker-image "$image" --name "$cluster"
cd "$root"
KIND_KUBECONFIG="$kubeconfig" CLIPJOB_IMAGE="$image" go test -tags kind -count=1 -timeout 20m -v ./e2e/kind/
