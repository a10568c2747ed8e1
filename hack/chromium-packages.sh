#!/usr/bin/env bash
# Installs (once) headless Chromium from Debian's packages, for the runs
# page's browser tests (dashboard tests in e2e/integration drive it over
# the Chrome DevTools protocol) and `make dashboard-screenshots`. Prints
# the browser's path on stdout.
set -euo pipefail
log() { echo "chromium-packages: $*" >&2; }

find_browser() {
  local b
  for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return 0; fi
  done
  return 1
}
find_browser && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  log "the runs page's browser tests need Chromium (the chromium command)"
  log "install it as root: apt-get install chromium"
  exit 1
fi
log "installing chromium (Debian packages, about 300 MB with its libraries)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends chromium fonts-dejavu-core >&2 || {
  apt-get update >&2 && apt-get install -y --no-install-recommends chromium fonts-dejavu-core >&2
}
find_browser || { log "chromium installed, but no chromium command on PATH"; exit 1; }
