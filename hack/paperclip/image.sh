#!/usr/bin/env bash
# Builds the Paperclip image (docs/paperclip.md) as a docker-archive, with
# no registry and no container engine (`make paperclip-image`): the pinned
# paperclipai and Node.js 24 of install.sh, clipjob's adapter installed as
# its README installs it (npm pack, then npm install into a prefix of its
# own with the server's @paperclipai/adapter-utils), and the fake agent in
# place of the agents' CLIs.
#
# Usage: hack/paperclip/image.sh ARCHIVE [TAG]
#   TAG defaults to docker.io/local/paperclip-clipjob:<paperclipai version>.
#   CLIPJOB_ADAPTER_BUILT=1: adapters/paperclip is built already; pack it
#   without npm ci or a build.
# The inputs are assembled in ARCHIVE.d beside the archive.
#
# The archive is cached in $CLIPJOB_CACHE_DIR/paperclip-image/<key>/ (the
# cache of install.sh and kube-binaries.sh), keyed by what goes in it: the
# tag, Paperclip's install (itself keyed by its lockfiles), the adapter's
# packed files, the fake agent's and busybox's binaries, the CA bundle,
# this script and the Go code that assembles the image. With the same
# inputs ARCHIVE is a hard link to the cached archive, made in seconds;
# only the newest key is kept (the archive is over 500 MiB). npm resolves
# the adapter's own dependencies (its package.json's ranges, no lockfile
# in a tarball) when the archive is made: delete the cache to resolve
# them again.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 ARCHIVE [TAG]" >&2; exit 2; }
out=$(realpath -m "$1")
version=$(sed -n 's/.*"paperclipai": *"\([^"]*\)".*/\1/p' "$root/hack/paperclip/server/package.json")
tag=${2:-docker.io/local/paperclip-clipjob:$version}
log() { echo "paperclip-image: $*" >&2; }

install=$(bash "$root/hack/paperclip/install.sh")
# npm runs on the Node.js the server runs on (Paperclip needs 24).
export PATH="$install/node/bin:$PATH"
work="$out.d"
rm -rf "$work"
mkdir -p "$work"

start=$(date +%s)
log "packing clipjob's adapter"
if [ "${CLIPJOB_ADAPTER_BUILT:-}" = 1 ]; then
  # The caller built it and holds its node_modules (the e2e suite, whose
  # other tests run the same dist/ meanwhile): packed as it is.
  (cd "$root/adapters/paperclip" && npm pack --ignore-scripts --pack-destination "$work" --loglevel=error >/dev/null)
else
  (cd "$root/adapters/paperclip" && npm ci --no-audit --no-fund --loglevel=error >&2 &&
    npm pack --pack-destination "$work" --loglevel=error >/dev/null)
fi
tgz=$(ls "$work"/clipjob-paperclip-adapter-*.tgz)
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/fakeagent" ./e2e/images/fakeagent)
busybox=$(command -v busybox) || { log "a static busybox is needed (Debian's busybox-static: hack/node-packages.sh)"; exit 1; }
cacerts=/etc/ssl/certs/ca-certificates.crt
[ -f "$cacerts" ] || cacerts=

# The cache key. The tarball's names and contents, not its bytes: its
# timestamps are npm's to choose.
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}/paperclip-image
key=$({
  echo "$tag" "$install"
  tar -tzf "$tgz" | LC_ALL=C sort
  tar -xzOf "$tgz" | sha256sum
  sha256sum "$work/fakeagent" "$busybox" ${cacerts:+"$cacerts"} "$0" | cut -d' ' -f1
  (cd "$root" && find hack/paperclip/image internal/ociimage -type f ! -name '*_test.go' | LC_ALL=C sort | xargs sha256sum)
} | sha256sum | cut -c1-12)
cached="$cache/$key/paperclip-image.tar"
link() { rm -f "$out"; ln "$cached" "$out" 2>/dev/null || cp "$cached" "$out"; }

if [ -f "$cached" ]; then
  link
  rm -rf "$work"
  log "$out: the cached archive of these inputs ($cache/$key)"
  exit 0
fi

log "installing $(basename "$tgz") with @paperclipai/adapter-utils@$version"
npm install --prefix "$work/adapters" --no-audit --no-fund --loglevel=error "$tgz" "@paperclipai/adapter-utils@$version" >&2

cd "$root"
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
go run ./hack/paperclip/image -tag "$tag" -o "$tmp/paperclip-image.tar" -node "$install/node/bin/node" -server "$install/server" \
  -adapters "$work/adapters" -fakeagent "$work/fakeagent" -busybox "$busybox" -cacerts "$cacerts"
chmod a+r "$tmp/paperclip-image.tar"
# Only this key is kept; another run making the same key meanwhile made
# the same archive.
find "$cache" -mindepth 1 -maxdepth 1 ! -name "$key" ! -name '.tmp.*' -exec rm -rf {} +
if ! mv -T "$tmp" "$cache/$key" 2>/dev/null; then
  rm -rf "$tmp"
fi
trap - EXIT
link
rm -rf "$work"
log "$out: built in $(( $(date +%s) - start ))s and cached ($cache/$key)"
