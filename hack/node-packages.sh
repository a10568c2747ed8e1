#!/usr/bin/env bash
# Installs (once) what the e2e suite's real node needs from Debian's
# packages: containerd, runc, the CNI plugins, iptables and ipset (kube-proxy,
# kube-router's network policies) and a static busybox (the fake agent
# image's shell). Nothing else is changed on the
# machine; e2e/cluster starts and removes the node itself.
#
# With CLIPJOB_E2E_NODE=kwok the suite needs none of it and this does
# nothing.
set -euo pipefail
log() { echo "node-packages: $*" >&2; }

[ "${CLIPJOB_E2E_NODE:-}" = kwok ] && exit 0

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have containerd && have ctr || need+=(containerd)
have runc || need+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/firewall ] || need+=(containernetworking-plugins)
have iptables || need+=(iptables)
have ipset || need+=(ipset)
have ip || need+=(iproute2)
# The fake agent image needs busybox statically linked.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" || need+=(busybox-static)
[ ${#need[@]} -eq 0 ] && exit 0

# shellcheck source=hack/debian-packages.sh
. "$(dirname "$0")/debian-packages.sh"
debian_install "the real node" "about 150 MB" "${need[@]}" || {
  log "or run only the tests that need no real container: CLIPJOB_E2E_NODE=kwok make test"
  exit 1
}
