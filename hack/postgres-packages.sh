#!/usr/bin/env bash
# Installs (once) PostgreSQL's server binaries from Debian's packages, for
# the relay's PostgreSQL store tests (relay/store/postgres/pgtest starts a
# throwaway server from them in a temporary directory, and uses no cluster
# or service the package may have set up).
set -euo pipefail
log() { echo "postgres-packages: $*" >&2; }

have_server() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  done
  return 1
}
have_server && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  log "the relay's PostgreSQL store tests need PostgreSQL's server (initdb and postgres under /usr/lib/postgresql/<version>/bin)"
  log "install it as root: apt-get install postgresql"
  exit 1
fi
log "installing postgresql (Debian packages, about 50 MB)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends postgresql >&2 || {
  apt-get update >&2 && apt-get install -y --no-install-recommends postgresql >&2
}
have_server || { log "postgresql installed, but no initdb and postgres under /usr/lib/postgresql/*/bin"; exit 1; }
