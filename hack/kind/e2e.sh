#!/usr/bin/env bash
# hack/e2e-kind.sh for a machine with no registry (prototype): the same
# steps, with the parts that need a registry replaced.
#
#   hack/e2e-kind.sh                      here
#   docker info (an engine must run)      hack/kind/dockerd.sh start (starts one)
#   kind v0.30.0                          v0.33.0 (v0.30 refuses Kubernetes 1.37)
#   kind create cluster (pulls kindest/node)  --image from hack/kind/node-image.sh,
#                                         --config hack/kind/cluster.yaml
#   docker build (pulls golang, distroless)  make image, then hack/image writes
#                                         the archive with the -e2e tag
#   kind load docker-image                kind load image-archive
#
# Environment: KIND_CLUSTER (default clipjob-e2e, kept after), KIND_VERSION,
# CLIPJOB_CACHE_DIR, KIND_WORK (default /tmp/kindwork).
# Stop everything with: hack/kind/dockerd.sh stop
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${KIND_WORK:-/tmp/kindwork}
cluster=${KIND_CLUSTER:-clipjob-e2e}
log() { echo "e2e-kind: $(date +%T) $*" >&2; }

t0=$(date +%s)
eval "$(bash "$here/up.sh")"
export DOCKER_HOST PATH="$work/bin:$PATH"
t1=$(date +%s)

version=$(sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' "$root/charts/clipjob/Chart.yaml")
image="ghcr.io/paperclipai/clipjob:$version-e2e"
log "building $image (make image, no engine)"
(cd "$root" && make image >&2 && go run ./hack/image -tag "$image" -o "$work/clipjob-image.tar" bin/image >&2)
"$KIND" load image-archive "$work/clipjob-image.tar" --name "$cluster" >&2
t2=$(date +%s)

# A kept cluster: what an earlier run left. TestInCluster deletes its Job
# without propagation, so the agent pod stays (it cannot start: its image
# is not loaded) and keeps its CPU request; on a 2-core node the next run's
# webhook pods then do not fit ("Insufficient cpu"). The test applies
# examples/paperclip.yaml again.
"$KUBECTL" --kubeconfig "$KUBECONFIG" delete namespace paperclip --ignore-not-found --wait=true --timeout=120s >&2
"$KUBECTL" --kubeconfig "$KUBECONFIG" delete pv paperclip-data --ignore-not-found >&2

cd "$root"
rc=0
KIND_KUBECONFIG="$KUBECONFIG" CLIPJOB_IMAGE="$image" go test -tags kind -count=1 -timeout 20m -v ./e2e/kind/ || rc=$?
t3=$(date +%s)
log "cluster $((t1 - t0))s, image $((t2 - t1))s, tests $((t3 - t2))s"
exit $rc
