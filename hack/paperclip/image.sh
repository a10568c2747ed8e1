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
log "installing $(basename "$tgz") with @paperclipai/adapter-utils@$version"
npm install --prefix "$work/adapters" --no-audit --no-fund --loglevel=error "$tgz" "@paperclipai/adapter-utils@$version" >&2

(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/fakeagent" ./e2e/images/fakeagent)
busybox=$(command -v busybox) || { log "a static busybox is needed (Debian's busybox-static: hack/node-packages.sh)"; exit 1; }
cacerts=/etc/ssl/certs/ca-certificates.crt
[ -f "$cacerts" ] || cacerts=

cd "$root"
go run ./hack/paperclip/image -tag "$tag" -o "$out" -node "$install/node/bin/node" -server "$install/server" \
  -adapters "$work/adapters" -fakeagent "$work/fakeagent" -busybox "$busybox" -cacerts "$cacerts"
