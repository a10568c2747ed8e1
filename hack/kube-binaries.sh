#!/usr/bin/env bash
# Builds (once) and prints the directory holding the binaries of a real local
# control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
# and kwok, and of a real node beside it: kubelet, kube-proxy and kube-router
# (its network policy controller only, for the egress tests). Everything
# comes from the Go module proxy; nothing is downloaded
# from anywhere else. Binaries are cached outside the repository, keyed by
# version, so only the first run pays the build (about 5-10 minutes on 2 cores).
#
# Environment:
#   KUBE_VERSION       Kubernetes version to build (default: matches k8s.io/api in go.mod)
#   ETCD_VERSION       etcd server version (default: what that Kubernetes pins)
#   KWOK_VERSION       kwok version (default below)
#   CLIPJOB_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/clipjob)
#   KUBEBUILDER_ASSETS if it holds etcd and kube-apiserver, those are used as they are
#
# Usage: hack/kube-binaries.sh        -> prints the bin directory on stdout
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "kube-binaries: $*" >&2; }

if [ -z "${KUBE_VERSION:-}" ]; then
  api=$(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?k8s\.io/api[[:space:]]+(v[^[:space:]]+).*#\2#p' "$root/go.mod" | head -1)
  [ -n "$api" ] || { log "cannot find k8s.io/api in go.mod; set KUBE_VERSION"; exit 1; }
  KUBE_VERSION="v1.${api#v0.}"
fi
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
# The newest kube-router the module proxy serves.
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}
bin="$cache/kube/$KUBE_VERSION/bin"
mkdir -p "$bin"

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kwok kube-router)
missing() { for b in "${want[@]}"; do [ -x "$bin/$b" ] || echo "$b"; done; }

# envtest users already have etcd and kube-apiserver: reuse them.
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  for b in etcd kube-apiserver; do
    if [ -x "$KUBEBUILDER_ASSETS/$b" ] && [ ! -e "$bin/$b" ]; then
      ln -s "$KUBEBUILDER_ASSETS/$b" "$bin/$b"
      log "using $b from KUBEBUILDER_ASSETS"
    fi
  done
fi

todo=$(missing | tr "\n" " ")
if [ -z "$todo" ]; then echo "$bin"; exit 0; fi

log "building $(echo $todo) for Kubernetes $KUBE_VERSION into $bin"
log "first run only: this takes several minutes on a small machine"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
staging="v0.${KUBE_VERSION#v1.}"

build_kube() {
  local mod="$work/kube"
  mkdir -p "$mod" && cd "$mod"
  go mod init clipjob.local/kube-build >/dev/null 2>&1
  # k8s.io/kubernetes replaces its staging modules with local paths; a
  # consumer must pin each of them to the matching published v0.x version.
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | awk -F'"' '/"GoMod"/{print $4}')
  {
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo "replace ("
    awk '/=> \.\/staging\/src\//{print "\t" $1 " => " $1 " '"$staging"'"}' "$gomod"
    echo ")"
  } >>go.mod
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" >&2
  local pkg=k8s.io/component-base/version
  local ld="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  # One go build for all of them: their packages compile once, in
  # parallel, and the links overlap.
  local pkgs=() b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [ -x "$bin/$b" ] || pkgs+=("k8s.io/kubernetes/cmd/$b")
  done
  if [ ${#pkgs[@]} -gt 0 ]; then
    log "go build ${pkgs[*]##*/}"
    # Built beside the cache, then renamed into place: a build cut short
    # leaves no binary that passes for a whole one.
    local out
    out=$(mktemp -d "$bin/.build-XXXXXX")
    go build -trimpath -ldflags "$ld" -o "$out/" "${pkgs[@]}"
    for b in "${pkgs[@]##*/}"; do mv "$out/$b" "$bin/$b"; done
    rmdir "$out"
  fi
  if [ ! -x "$bin/etcd" ]; then
    ETCD_VERSION=${ETCD_VERSION:-$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$gomod")}
    build_etcd
  fi
}

build_etcd() {
  local mod="$work/etcd"
  mkdir -p "$mod" && cd "$mod"
  go mod init clipjob.local/etcd-build >/dev/null 2>&1
  cat >main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "go build etcd $ETCD_VERSION"
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" . && mv "$bin/etcd.tmp" "$bin/etcd"
}

build_kwok() {
  local mod="$work/kwok"
  mkdir -p "$mod" && cd "$mod"
  go mod init clipjob.local/kwok-build >/dev/null 2>&1
  log "go build kwok $KWOK_VERSION"
  go get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$bin/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok && mv "$bin/kwok.tmp" "$bin/kwok"
}

build_kube_router() {
  local mod="$work/kube-router"
  mkdir -p "$mod" && cd "$mod"
  go mod init clipjob.local/kube-router-build >/dev/null 2>&1
  log "go build kube-router $KUBE_ROUTER_VERSION"
  go get "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$bin/kube-router.tmp" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router && mv "$bin/kube-router.tmp" "$bin/kube-router"
}

case " $todo " in *" kube"*|*" etcd "*) build_kube ;; esac
[ -x "$bin/etcd" ] || { ETCD_VERSION=${ETCD_VERSION:-v3.7.0}; build_etcd; }
[ -x "$bin/kwok" ] || build_kwok
[ -x "$bin/kube-router" ] || build_kube_router

todo=$(missing | tr "\n" " ")
[ -z "$todo" ] || { log "still missing: $todo"; exit 1; }
log "done: $bin"
echo "$bin"
