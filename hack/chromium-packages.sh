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

# shellcheck source=hack/debian-packages.sh
. "$(dirname "$0")/debian-packages.sh"
debian_install "the runs page's browser test (the chromium command)" "about 300 MB with its libraries" chromium fonts-dejavu-core
find_browser || { log "chromium installed, but no chromium command on PATH"; exit 1; }
