#!/usr/bin/env bash
# Builds (once per version and source) the cert-manager binary of this directory (subcommands
# `controller` and `cainjector`, see main.go), copies cert-manager's CRDs
# beside it, and prints the bin directory. Everything comes from the Go
# module proxy: cert-manager's own cmd/ modules are not served there, so
# main.go wires the public packages of the main module instead.
# Cached outside the repository, keyed by version, like hack/kube-binaries.sh.
#
# Layout: $cache/cert-manager/$VERSION/bin/cert-manager
#         $cache/cert-manager/$VERSION/crds/*.yaml   (= ../crds from bin)
#
# Environment:
#   CLIPJOB_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/clipjob)
#
# Usage: hack/cert-manager/build.sh    -> prints the bin directory on stdout
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { echo "cert-manager-build: $*" >&2; }
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

# The version is the one go.mod pins, so the cache key cannot drift from it.
version=$(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?github\.com/cert-manager/cert-manager[[:space:]]+(v[^[:space:]]+).*#\2#p' "$here/go.mod" | head -1)
[ -n "$version" ] || { log "cannot find cert-manager in $here/go.mod"; exit 1; }
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}
dir="$cache/cert-manager/$version"
bin="$dir/bin"
crds="$dir/crds"

# Rebuilt when missing, or when main.go or the module files changed (the
# version key alone would keep a stale binary after an edit of main.go).
stamp=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -d' ' -f1)
built() {
  [ -x "$bin/cert-manager" ] && [ "$(cat "$bin/.source-sha256" 2>/dev/null)" = "$stamp" ] &&
    [ -e "$crds/cert-manager.io_certificates.yaml" ]
}

if ! built; then
  # One build at a time: make test starts this build beside the real-node
  # tier, whose cert-manager test runs it too and waits here for the first
  # (a warm cache takes no lock, so a read-only one serves as it is).
  mkdir -p "$dir"
  exec 9>"$dir/.build.lock"
  flock 9
  if [ ! -x "$bin/cert-manager" ] || [ "$(cat "$bin/.source-sha256" 2>/dev/null)" != "$stamp" ]; then
    log "building cert-manager $version into $bin (first run only: a few minutes)"
    mkdir -p "$bin"
    # The build does not hold the lock: a killed script lets the next go on.
    (cd "$here" && go build -trimpath -ldflags "-s -w" -o "$bin/cert-manager.tmp" .) >&2 9>&-
    mv "$bin/cert-manager.tmp" "$bin/cert-manager"
    echo "$stamp" >"$bin/.source-sha256"
  fi
  if [ ! -e "$crds/cert-manager.io_certificates.yaml" ]; then
    src=$(cd "$here" && go mod download -json "github.com/cert-manager/cert-manager@$version" 9>&- | awk -F'"' '/"Dir"/{print $4}')
    [ -d "$src/deploy/crds" ] || { log "no deploy/crds in $src"; exit 1; }
    mkdir -p "$crds"
    cp "$src"/deploy/crds/*.yaml "$crds/"
    chmod u+w "$crds"/*.yaml # the module cache is read-only
    log "copied CRDs into $crds"
  fi
  exec 9>&-
fi

echo "$bin"
