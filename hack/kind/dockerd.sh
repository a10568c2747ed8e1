#!/usr/bin/env bash
# Starts (or stops) a Docker engine of its own for kind on a machine with no
# systemd and no registry: Debian's docker.io (installed if missing), its own
# containerd, a runc wrapper as default runtime (runc-nosysresource: this
# machine's processes lack CAP_SYS_RESOURCE, so a --privileged container
# fails "unable to apply caps" without it). Idempotent.
#
# It touches as little of the machine as it can, since other tests run real
# nodes on it at the same time: no iptables rules (--iptables=false, so no
# FORWARD DROP policy and no DOCKER chains), no ip_forward change, no
# docker0 bridge; kind's own network and its published ports (docker-proxy)
# work without them. Everything lives under the work dir and the cache:
#
#   $KIND_WORK (default /tmp/kindwork)          socket, exec-root, containerd, logs
#   $CLIPJOB_CACHE_DIR/kind/docker              data-root (images: the node image stays)
#
# The kubelet of a kind node writes a few machine-wide sysctls (vm.*,
# kernel.panic*, kernel.keys.*); start saves them, stop puts them back.
#
# Usage:
#   hack/kind/dockerd.sh start   -> prints DOCKER_HOST=unix://... on stdout
#   hack/kind/dockerd.sh stop    -> deletes this engine's kind clusters, stops it
#   hack/kind/dockerd.sh env     -> prints DOCKER_HOST=... if it runs
#   eval "$(hack/kind/dockerd.sh start)"; export DOCKER_HOST
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=${KIND_WORK:-/tmp/kindwork}
cache=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}/kind
sock="$work/docker.sock"
ctrd="$work/containerd"
state="$work/machine-state"
log() { echo "dockerd.sh: $*" >&2; }
host="unix://$sock"
# The engine is 20.10 (API 1.41); use its own client.
docker() { DOCKER_HOST=$host /usr/bin/docker "$@"; }

sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes fs.inotify.max_user_instances
  fs.inotify.max_user_watches)

running() { [ -S "$sock" ] && docker version >/dev/null 2>&1; }

install_packages() {
  command -v dockerd >/dev/null && [ -x /usr/bin/docker ] && return 0
  log "installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  # no systemd here; keep the package's init script from starting a daemon
  apt-get install -y --no-install-recommends docker.io >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends docker.io >&2; }
}

save_machine_state() {
  mkdir -p "$state"
  [ -e "$state/saved" ] && return 0
  for s in "${sysctls[@]}"; do
    cat "/proc/sys/${s//.//}" >"$state/$s" 2>/dev/null || true
  done
  # docker creates missing bind sources; kind mounts /lib/modules
  [ -e /lib/modules ] || touch "$state/no-lib-modules"
  [ -e /run/containerd ] || touch "$state/no-run-containerd"
  touch "$state/saved"
}

restore_machine_state() {
  [ -e "$state/saved" ] || return 0
  for s in "${sysctls[@]}"; do
    [ -s "$state/$s" ] && cat "$state/$s" >"/proc/sys/${s//.//}" 2>/dev/null || true
  done
  [ -e "$state/no-lib-modules" ] && rmdir /lib/modules 2>/dev/null || true
  # containerd puts shim sockets in /run/containerd/s whatever its config
  if [ -e "$state/no-run-containerd" ]; then
    rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  fi
  rm -rf "$state"
}

start() {
  if running; then echo "DOCKER_HOST=$host"; return 0; fi
  install_packages
  save_machine_state
  mkdir -p "$work/bin" "$ctrd" "$cache/docker"
  install -m 0755 "$here/runc-nosysresource" "$work/bin/runc-nosysresource"
  # kind runs `docker` from PATH: put the engine's own client first
  ln -sfn /usr/bin/docker "$work/bin/docker"
  if ! { [ -S "$ctrd/containerd.sock" ] && ctr --address "$ctrd/containerd.sock" version >/dev/null 2>&1; }; then
    cat >"$ctrd/config.toml" <<EOF
version = 2
root = "$cache/docker/containerd-root"
state = "$ctrd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$ctrd/containerd.sock"
[ttrpc]
  address = "$ctrd/containerd.sock.ttrpc"
[debug]
  address = "$ctrd/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$ctrd/opt"
EOF
    log "starting containerd ($ctrd)"
    setsid containerd --config "$ctrd/config.toml" >"$work/containerd.log" 2>&1 </dev/null &
    echo $! >"$ctrd/containerd.pid"
    for _ in $(seq 50); do
      ctr --address "$ctrd/containerd.sock" version >/dev/null 2>&1 && break
      sleep 0.2
    done
  fi
  log "starting dockerd ($host, data in $cache/docker)"
  setsid dockerd \
    --host "$host" \
    --data-root "$cache/docker" \
    --exec-root "$work/exec" \
    --pidfile "$work/dockerd.pid" \
    --containerd "$ctrd/containerd.sock" \
    --add-runtime "nosysresource=$work/bin/runc-nosysresource" \
    --default-runtime nosysresource \
    --storage-driver overlay2 \
    --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
    --oom-score-adjust=0 \
    --log-level warn \
    >"$work/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 100); do
    running && break
    sleep 0.2
  done
  if ! running; then
    log "dockerd did not come up; see $work/dockerd.log"
    tail -20 "$work/dockerd.log" >&2
    exit 1
  fi
  echo "DOCKER_HOST=$host"
}

stop_pid() { # stop_pid PIDFILE NAME
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $2 ($pid)"
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$f"
}

stop() {
  if running; then
    # kind's clusters of this engine
    local kind
    for kind in "$cache"/v*/kind; do
      [ -x "$kind" ] || continue
      for c in $(DOCKER_HOST=$host PATH="$work/bin:$PATH" "$kind" get clusters 2>/dev/null); do
        log "deleting kind cluster $c"
        DOCKER_HOST=$host PATH="$work/bin:$PATH" "$kind" delete cluster --name "$c" >&2 || true
      done
    done
    ids=$(docker ps -aq)
    [ -z "$ids" ] || docker rm -f $ids >/dev/null || true
    # user networks (kind's) have a bridge link on the machine: remove them
    for n in $(docker network ls --filter driver=bridge --format '{{.Name}}'); do
      case "$n" in bridge) ;; *) docker network rm "$n" >/dev/null 2>&1 || true ;; esac
    done
  fi
  stop_pid "$work/dockerd.pid" dockerd
  stop_pid "$ctrd/containerd.pid" containerd
  # shims left behind (they outlive containerd by design)
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $ctrd/containerd.sock" || true); do
    kill "$p" 2>/dev/null || true
  done
  # mounts left under the work dir (exec-root, containerd state)
  for m in $(grep -o " $work/[^ ]*" /proc/self/mountinfo 2>/dev/null | sort -r || true); do
    umount -l "$m" 2>/dev/null || true
  done
  restore_machine_state
  rm -f "$sock"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  env) running && echo "DOCKER_HOST=$host" ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
