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

# shellcheck source=hack/debian-packages.sh
. "$(dirname "$0")/debian-packages.sh"
debian_install "the relay's PostgreSQL store tests (initdb and postgres under /usr/lib/postgresql/<version>/bin)" "about 50 MB" postgresql
have_server || { log "postgresql installed, but no initdb and postgres under /usr/lib/postgresql/*/bin"; exit 1; }
