# Sourced by the *-packages.sh scripts: installs Debian packages as root,
# or says what to install and fails.
#
#   debian_install WHY "SIZE" PACKAGE...
#
# WHY says what needs them; log is the caller's (its name first).
debian_install() {
  local why=$1 size=$2; shift 2
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "$why needs these Debian packages: $*"
    log "install them as root: apt-get install $*"
    return 1
  fi
  log "installing $* (Debian packages, $size)"
  export DEBIAN_FRONTEND=noninteractive
  # A machine whose package lists are old or absent gets them once.
  apt-get install -y --no-install-recommends "$@" >&2 || {
    apt-get update >&2 && apt-get install -y --no-install-recommends "$@" >&2
  }
}
