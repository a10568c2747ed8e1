#!/usr/bin/env bash
# Brings up a kind cluster on this machine with no registry: the Docker
# engine of hack/kind/dockerd.sh, kind built from the Go module proxy, the
# node image of hack/kind/node-image.sh, the config hack/kind/cluster.yaml.
# Idempotent: an existing cluster of that name is kept.
#
# Environment:
#   KIND_VERSION      default v0.33.0
#   KIND_CLUSTER      default clipjob-e2e
#   CLIPJOB_CACHE_DIR cache root (kind, kubectl, the node image's inputs under kind/)
#
# Prints on stdout: DOCKER_HOST=..., KIND=..., KUBECONFIG=..., KUBECTL=...
# (eval-able).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { echo "up: $(date +%T) $*" >&2; }
KIND_VERSION=${KIND_VERSION:-v0.33.0}
KUBE_VERSION=${KUBE_VERSION:-v1.37.1}
cluster=${KIND_CLUSTER:-clipjob-e2e}
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}/kind
work=${KIND_WORK:-/tmp/kindwork}

eval "$(bash "$here/dockerd.sh" start)"
export DOCKER_HOST
# kind runs `docker`: the engine's own client first
export PATH="$work/bin:$PATH"

kind=$cache/$KIND_VERSION/kind
if [ ! -x "$kind" ]; then
  log "go install sigs.k8s.io/kind@$KIND_VERSION"
  GOBIN="$cache/$KIND_VERSION" GOFLAGS= go install "sigs.k8s.io/kind@$KIND_VERSION"
fi

image=$(bash "$here/node-image.sh")
kubeconfig=$cache/$cluster.kubeconfig
if ! "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "kind create cluster $cluster ($image)"
  "$kind" create cluster --name "$cluster" --image "$image" --config "$here/cluster.yaml" \
    --kubeconfig "$kubeconfig" --wait 120s >&2
else
  "$kind" get kubeconfig --name "$cluster" >"$kubeconfig"
  # a kept cluster: hostPath volumes released by an earlier run (Retain,
  # no provisioner to recycle them) are emptied and made Available again
  kubectl=$cache/kube/$KUBE_VERSION/kubectl
  for pv in $("$kubectl" --kubeconfig "$kubeconfig" get pv -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{" "}{.spec.hostPath.path}{"\n"}{end}' | awk '$1 ~ /^kind-hostpath-/ {print $1 "=" $2}'); do
    name=${pv%%=*} dir=${pv#*=}
    log "recycling $name"
    docker exec "$cluster-control-plane" sh -c "find '$dir' -mindepth 1 -delete; chmod 0777 '$dir'"
    "$kubectl" --kubeconfig "$kubeconfig" patch pv "$name" --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null
  done
fi
echo "DOCKER_HOST=$DOCKER_HOST"
echo "KIND=$kind"
echo "KUBECONFIG=$kubeconfig"
echo "KUBECTL=$cache/kube/$KUBE_VERSION/kubectl"
