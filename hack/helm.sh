#!/usr/bin/env bash
# Builds (once) and prints the path of the helm binary the documented
# install commands use: Helm's own CLI, at the version go.mod pins for the
# suite's Helm SDK, from the Go module proxy (nothing downloaded from
# anywhere else, and no helm assumed installed). Cached outside the
# repository, keyed by version.
#
# Environment:
#   HELM_VERSION       Helm version to build (default: helm.sh/helm/v3 in go.mod)
#   CLIPJOB_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/clipjob)
#
# Usage: hack/helm.sh        -> prints the helm binary's path on stdout
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "helm: $*" >&2; }

if [ -z "${HELM_VERSION:-}" ]; then
  HELM_VERSION=$(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?helm\.sh/helm/v3[[:space:]]+(v[^[:space:]]+).*#\2#p' "$root/go.mod" | head -1)
  [ -n "$HELM_VERSION" ] || { log "cannot find helm.sh/helm/v3 in go.mod; set HELM_VERSION"; exit 1; }
fi
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}
bin="$cache/helm/$HELM_VERSION/bin"
if [ -x "$bin/helm" ]; then echo "$bin/helm"; exit 0; fi

log "building helm $HELM_VERSION into $bin (first run only: a minute or two)"
mkdir -p "$bin"
# Built beside the cache, then renamed into place: a build cut short
# leaves no binary that passes for a whole one. Outside any module
# (GOFLAGS/GOWORK cleared), so helm's own go.mod decides its dependencies.
out=$(mktemp -d "$bin/.build-XXXXXX")
trap 'rm -rf "$out"' EXIT
major=${HELM_VERSION#v}; major=${major%%.*}
mod=helm.sh/helm/v3
[ "$major" = 3 ] || mod=helm.sh/helm/v$major
(cd "$out" && GOFLAGS= GOWORK=off CGO_ENABLED=0 GOBIN="$out" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v$major/internal/version.version=$HELM_VERSION" "$mod/cmd/helm@$HELM_VERSION" >&2)
mv "$out/helm" "$bin/helm"
log "done: $bin/helm"
echo "$bin/helm"
