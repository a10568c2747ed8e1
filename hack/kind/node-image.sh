#!/usr/bin/env bash
# Builds (once per set of inputs) a kind node image with no registry: a
# Debian bookworm rootfs from Debian's packages (mmdebstrap), kind's base
# image files on top, kubelet/kubeadm/kubectl built from the Go module
# proxy, and the control-plane images preloaded into the node's containerd,
# each assembled FROM scratch from binaries built on this machine:
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy (on a
# small Debian rootfs: it needs iptables), etcd, CoreDNS and pause, tagged as
# kubeadm expects (registry.k8s.io/...).
#
# What differs from kind's own node image, for this machine (cgroup v1,
# no CAP_SYS_RESOURCE) and for having no registry:
#   - containerd, runc and the CNI plugins are Debian's (1.6.20, 1.1.5, 1.1.1)
#   - containerd.service has no OOMScoreAdjust/Limit* lines and the CRI config
#     says restrict_oom_score_adj = true (both need CAP_SYS_RESOURCE)
#   - a bridge CNI config is baked in (/etc/cni/net.d): clusters use
#     networking.disableDefaultCNI: true (kindnet's image cannot be pulled)
#   - the default StorageClass "standard" has no provisioner; a few hostPath
#     PersistentVolumes (mode 0777 directories) bind to claims instead
#     (kind's local-path-provisioner image cannot be pulled)
#
# Needs: root, Go, mmdebstrap (installed if missing), a Docker engine
# (DOCKER_HOST; hack/kind/dockerd.sh start) for the final `docker import`.
#
# Environment:
#   KUBE_VERSION       default v1.37.1
#   KIND_VERSION       kind whose base files are used, default v0.33.0
#   CLIPJOB_CACHE_DIR  cache root; everything goes to $CLIPJOB_CACHE_DIR/kind
#   KIND_WORK          scratch dir, default /tmp/kindwork
#
# Usage: hack/kind/node-image.sh   -> prints the image reference on stdout
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
log() { echo "node-image: $(date +%T) $*" >&2; }

KUBE_VERSION=${KUBE_VERSION:-v1.37.1}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cacheroot=${CLIPJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clipjob}
cache=$cacheroot/kind
work=${KIND_WORK:-/tmp/kindwork}
kbin=$cache/kube/$KUBE_VERSION
mkdir -p "$cache" "$work" "$kbin"
# the engine of hack/kind/dockerd.sh, through its own (API 1.41) client
if [ -z "${DOCKER_HOST:-}" ]; then
  DOCKER_HOST=$(bash "$here/dockerd.sh" env | sed 's/^DOCKER_HOST=//') || true
  [ -n "$DOCKER_HOST" ] || { log "no Docker engine: run hack/kind/dockerd.sh start"; exit 1; }
fi
export DOCKER_HOST
docker() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else command docker "$@"; fi; }
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

# Packages of the node (kind's base image list, less what it does not need
# here: nfs, iscsi, fuse-overlayfs) plus Debian's container runtime.
NODE_PACKAGES="systemd,systemd-sysv,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins"
PROXY_PACKAGES="iptables,conntrack,kmod"
DPKG_SLIM=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/info/*')

# --- inputs ---------------------------------------------------------------

# kubelet (and the control-plane binaries) as hack/kube-binaries.sh builds them
kube_bin=$cacheroot/kube/$KUBE_VERSION/bin
have_kube_bin() {
  local b
  for b in kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd; do
    [ -x "$kube_bin/$b" ] || return 1
  done
}
if ! have_kube_bin; then
  kube_bin=$(KUBE_VERSION=$KUBE_VERSION bash "$root/hack/kube-binaries.sh")
fi

# kubeadm and kubectl: the same throwaway module as hack/kube-binaries.sh
build_kube_tools() {
  local todo=()
  for b in kubeadm kubectl; do [ -x "$kbin/$b" ] || todo+=("$b"); done
  [ ${#todo[@]} -eq 0 ] && return 0
  log "go build ${todo[*]} $KUBE_VERSION (first run only, a few minutes)"
  local mod=$work/kube-build minor staging gomod
  rm -rf "$mod" && mkdir -p "$mod"
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  staging="v0.${KUBE_VERSION#v1.}"
  (
    cd "$mod"
    go mod init clipjob.local/kube-build >/dev/null 2>&1
    gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | awk -F'"' '/"GoMod"/{print $4}')
    {
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo "replace ("
      awk '/=> \.\/staging\/src\//{print "\t" $1 " => " $1 " '"$staging"'"}' "$gomod"
      echo ")"
    } >>go.mod
    go get "k8s.io/kubernetes/cmd/kubeadm@$KUBE_VERSION" "k8s.io/kubernetes/cmd/kubectl@$KUBE_VERSION" >&2
    pkg=k8s.io/component-base/version
    ld="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    # kubectl's version comes from client-go's copy of the version package
    ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    for b in "${todo[@]}"; do
      log "go build $b"
      go build -trimpath -ldflags "$ld" -o "$kbin/$b.tmp" "k8s.io/kubernetes/cmd/$b"
      mv "$kbin/$b.tmp" "$kbin/$b"
    done
  )
  rm -rf "$mod"
}
build_kube_tools

# the images kubeadm wants: registry.k8s.io/kube-apiserver:v1.37.1, ...
images=$("$kbin/kubeadm" config images list --kubernetes-version "$KUBE_VERSION" 2>/dev/null)
img() { echo "$images" | grep "/$1:" | head -1; }
coredns_image=$(img coredns); etcd_image=$(img etcd); pause_image=$(img pause)
COREDNS_VERSION=${coredns_image##*:}

# CoreDNS from the module proxy
if [ ! -x "$cache/coredns/$COREDNS_VERSION/coredns" ]; then
  log "go install github.com/coredns/coredns@$COREDNS_VERSION (first run only, ~2.5 min)"
  GOBIN="$cache/coredns/$COREDNS_VERSION" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
fi

# pause: a static Go program that reaps children and exits on SIGINT/SIGTERM
if [ ! -x "$cache/pause/pause" ]; then
  log "go build pause"
  mkdir -p "$work/pause-build" "$cache/pause"
  cat >"$work/pause-build/main.go" <<'GO'
// pause holds a pod's namespaces: it sleeps, reaps orphans, exits on a signal.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 8)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
GO
  (cd "$work/pause-build" && { [ -f go.mod ] || go mod init pause >/dev/null 2>&1; } && go build -trimpath -ldflags "-s -w" -o "$cache/pause/pause" .)
  rm -rf "$work/pause-build"
fi

# kind's base image files, from its module zip
kind_dir=$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | awk -F'"' '/"Dir"/{print $4}')
kind_files=$kind_dir/images/base/files
[ -d "$kind_files" ] || { log "no $kind_files"; exit 1; }

# --- cache key ------------------------------------------------------------
key=$( {
  echo "$KUBE_VERSION $KIND_VERSION $SUITE $MIRROR $NODE_PACKAGES $PROXY_PACKAGES $images"
  cat "$0"
  (cd "$kind_files" && find . -type f | sort | xargs sha256sum)
  sha256sum "$kube_bin"/{kubelet,kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,etcd} \
    "$kbin"/{kubeadm,kubectl} "$cache/coredns/$COREDNS_VERSION/coredns" "$cache/pause/pause" | awk '{print $1}'
} | sha256sum | cut -c1-12)
image=${KIND_NODE_IMAGE:-clipjob.local/kind-node:$KUBE_VERSION-$key}

if docker image inspect "$image" >/dev/null 2>&1; then
  log "up to date: $image"
  echo "$image"
  exit 0
fi

command -v mmdebstrap >/dev/null || {
  log "installing mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >&2; }
}

# --- Debian rootfs (cached by package list) ---------------------------------
debroot() { # debroot NAME PACKAGES -> prints the cached tarball
  local name=$1 pkgs=$2 k f
  k=$(echo "$SUITE $MIRROR $pkgs ${DPKG_SLIM[*]}" | sha256sum | cut -c1-12)
  f=$cache/rootfs/$name-$SUITE-$k.tar
  if [ ! -s "$f" ]; then
    mkdir -p "$cache/rootfs"
    log "mmdebstrap $name ($SUITE: $pkgs)"
    mmdebstrap --variant=essential --format=tar --include="$pkgs" --skip=output/dev \
      --aptopt='APT::Install-Recommends "false"' "${DPKG_SLIM[@]}" \
      --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
      "$SUITE" "$f.tmp" "$MIRROR" >&2
    mv "$f.tmp" "$f"
  fi
  echo "$f"
}
node_tar=$(debroot node "$NODE_PACKAGES")
proxy_tar=$(debroot kube-proxy-base "$PROXY_PACKAGES")

# --- image archives (docker-archive, what ctr images import reads) -----------
arch=$(go env GOARCH)
layer() { # layer OUT DIR: a reproducible tar of DIR
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$2" -cf "$1" .
}
archive() { # archive OUT TAG CONFIG_JSON LAYER_TAR...
  local out=$1 tag=$2 cfg=$3 d ids=() names=() l s
  shift 3
  d=$(mktemp -d "${build:-$work}/archive.XXXX")
  for l in "$@"; do
    s=$(sha256sum "$l" | cut -d' ' -f1)
    ln "$l" "$d/$s.tar" 2>/dev/null || cp "$l" "$d/$s.tar"
    ids+=("\"sha256:$s\""); names+=("\"$s.tar\"")
  done
  local idj namej
  idj=$(IFS=,; echo "${ids[*]}"); namej=$(IFS=,; echo "${names[*]}")
  jq -c -n --argjson c "$cfg" --argjson ids "[$idj]" --arg arch "$arch" \
    '{architecture:$arch, os:"linux", created:"1970-01-01T00:00:00Z", config:$c, rootfs:{type:"layers", diff_ids:$ids}}' >"$d/config.json"
  s=$(sha256sum "$d/config.json" | cut -d' ' -f1)
  mv "$d/config.json" "$d/$s.json"
  jq -c -n --arg cfg "$s.json" --arg tag "$tag" --argjson layers "[$namej]" \
    '[{Config:$cfg, RepoTags:[$tag], Layers:$layers}]' >"$d/manifest.json"
  tar -C "$d" -cf "$out" .
  rm -rf "$d"
}
bin_image() { # bin_image OUT TAG BINARY ENTRY [BASE_LAYER]: BINARY at /usr/local/bin
  local out=$1 tag=$2 bin=$3 entry=$4 base=${5:-} d
  d=$(mktemp -d "${build:-$work}/layer.XXXX")
  mkdir -p "$d/root/usr/local/bin" "$d/root/etc" "$d/root/tmp"
  chmod 1777 "$d/root/tmp"
  cp "$bin" "$d/root/usr/local/bin/$(basename "$bin")"
  if [ -z "$base" ]; then
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$d/root/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' >"$d/root/etc/group"
  fi
  layer "$d/layer.tar" "$d/root"
  local cfg
  cfg=$(jq -c -n --arg e "$entry" '{Env:["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"], Entrypoint:[$e]}')
  if [ -n "$base" ]; then archive "$out" "$tag" "$cfg" "$base" "$d/layer.tar"; else archive "$out" "$tag" "$cfg" "$d/layer.tar"; fi
  rm -rf "$d"
}

build=$work/node-build
rm -rf "$build"
mkdir -p "$build/images"
log "assembling the control-plane images"
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  bin_image "$build/images/$b.tar" "registry.k8s.io/$b:$KUBE_VERSION" "$kube_bin/$b" "/usr/local/bin/$b"
done
bin_image "$build/images/etcd.tar" "$etcd_image" "$kube_bin/etcd" /usr/local/bin/etcd
# kubeadm's CoreDNS Deployment runs /coredns
d=$(mktemp -d "${build:-$work}/layer.XXXX")
mkdir -p "$d/root/etc"
cp "$cache/coredns/$COREDNS_VERSION/coredns" "$d/root/coredns"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$d/root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/root/etc/group"
layer "$d/layer.tar" "$d/root"
archive "$build/images/coredns.tar" "$coredns_image" '{"Entrypoint":["/coredns"]}' "$d/layer.tar"
rm -rf "$d"
d=$(mktemp -d "${build:-$work}/layer.XXXX")
mkdir -p "$d/root"
cp "$cache/pause/pause" "$d/root/pause"
layer "$d/layer.tar" "$d/root"
archive "$build/images/pause.tar" "$pause_image" '{"Entrypoint":["/pause"]}' "$d/layer.tar"
rm -rf "$d"
bin_image "$build/images/kube-proxy.tar" "registry.k8s.io/kube-proxy:$KUBE_VERSION" "$kube_bin/kube-proxy" /usr/local/bin/kube-proxy "$proxy_tar"

# --- the node's rootfs --------------------------------------------------------
rootfs=$build/rootfs
mkdir -p "$rootfs"
log "unpacking the node rootfs"
tar -C "$rootfs" -xf "$node_tar"

log "kind $KIND_VERSION base files"
install -d -m 0755 "$rootfs/kind" "$rootfs/kind/bin" "$rootfs/kind/manifests" "$rootfs/LICENSES" \
  "$rootfs/etc/containerd" "$rootfs/etc/default" "$rootfs/etc/sysctl.d" \
  "$rootfs/etc/systemd/system/kubelet.service.d" "$rootfs/etc/kubernetes/manifests" "$rootfs/etc/cni/net.d"
install -m 0755 "$kind_files"/usr/local/bin/* "$rootfs/usr/local/bin/"
install -m 0644 "$kind_files"/kind/README.txt "$rootfs/kind/"
install -m 0755 "$kind_files"/kind/bin/* "$rootfs/kind/bin/"
install -m 0644 "$kind_files"/LICENSES/* "$rootfs/LICENSES/"
install -m 0644 "$kind_files"/etc/crictl.yaml "$rootfs/etc/"
install -m 0644 "$kind_files"/etc/containerd/* "$rootfs/etc/containerd/"
install -m 0644 "$kind_files"/etc/default/* "$rootfs/etc/default/"
install -m 0644 "$kind_files"/etc/sysctl.d/* "$rootfs/etc/sysctl.d/"
install -m 0644 "$kind_files"/etc/systemd/system/*.service "$kind_files"/etc/systemd/system/*.slice "$rootfs/etc/systemd/system/"
install -m 0644 "$kind_files"/etc/systemd/system/kubelet.service.d/* "$rootfs/etc/systemd/system/kubelet.service.d/"
rm -f "$rootfs/etc/systemd/system/containerd-fuse-overlayfs.service"

# containerd.service: Debian's binary; no OOMScoreAdjust/Limit* (need CAP_SYS_RESOURCE)
sed -i -e 's#^ExecStart=/usr/local/bin/containerd#ExecStart=/usr/bin/containerd#' \
  -e '/^OOMScoreAdjust=/d' -e '/^Limit[A-Z]*=/d' "$rootfs/etc/systemd/system/containerd.service"

# containerd's config: kind's, with restrict_oom_score_adj, the pause image
# kubeadm names, Debian's CNI plugin dir, no fuse-overlayfs proxy plugin
cfg=$rootfs/etc/containerd/config.toml
sed -i -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
  -e "s#sandbox_image = .*#sandbox_image = \"$pause_image\"#" \
  -e '/^\[proxy_plugins\]/,/^  address = /d' -e '/^# fuse-overlayfs is used for rootless/d' "$cfg"
cat >>"$cfg" <<'EOF'

[plugins."io.containerd.grpc.v1.cri".cni]
  # Debian's containernetworking-plugins
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
EOF
grep -q 'restrict_oom_score_adj = true' "$cfg" || { log "containerd config: restrict_oom_score_adj not set"; exit 1; }
mkdir -p "$rootfs/opt/cni"
ln -sfn /usr/lib/cni "$rootfs/opt/cni/bin"

# the base OCI spec kind's containerd config names (kind: ctr oci spec | jq)
ctr oci spec |
  jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
  jq 'del(.process.rlimits)' >"$rootfs/etc/containerd/cri-base.json"

# bridge CNI for the pod network (kind's default podSubnet; one node)
cat >"$rootfs/etc/cni/net.d/10-bridge.conflist" <<'EOF'
{
  "cniVersion": "0.4.0",
  "name": "kind-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.244.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

# default StorageClass without a provisioner, and hostPath volumes for it
{
  cat <<'EOF'
# No provisioner image can be pulled here: claims of the default class bind
# to these hostPath volumes (directories of the node, mode 0777).
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
  for i in $(seq 0 7); do
    cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: kind-hostpath-$i
spec:
  storageClassName: standard
  capacity: {storage: 50Gi}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: /var/local-volumes/pv$i, type: DirectoryOrCreate}
EOF
  done
} >"$rootfs/kind/manifests/default-storage.yaml"
for i in $(seq 0 7); do install -d -m 0777 "$rootfs/var/local-volumes/pv$i"; done

# binaries
install -m 0755 "$kube_bin/kubelet" "$kbin/kubeadm" "$kbin/kubectl" "$rootfs/usr/bin/"
printf '%s' "$KUBE_VERSION" >"$rootfs/kind/version"

# systemd as kind's Dockerfile sets it up
log "systemd units"
find "$rootfs/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
rm -f "$rootfs"/lib/systemd/system/multi-user.target.wants/* \
  "$rootfs"/etc/systemd/system/*.wants/* \
  "$rootfs"/lib/systemd/system/local-fs.target.wants/* \
  "$rootfs"/lib/systemd/system/sockets.target.wants/*udev* \
  "$rootfs"/lib/systemd/system/sockets.target.wants/*initctl* \
  "$rootfs"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$rootfs/etc/systemd/journald.conf"
[ -e "$rootfs/sbin/init" ] || ln -s /usr/lib/systemd/systemd "$rootfs/sbin/init"
# systemctl enable kubelet containerd undo-mount-hacks; systemctl mask systemd-binfmt
mkdir -p "$rootfs/etc/systemd/system/multi-user.target.wants"
for u in kubelet.service containerd.service undo-mount-hacks.service; do
  ln -sfn "/etc/systemd/system/$u" "$rootfs/etc/systemd/system/multi-user.target.wants/$u"
done
ln -sfn /dev/null "$rootfs/etc/systemd/system/systemd-binfmt.service"
# the machine id is made per node by the entrypoint
: >"$rootfs/etc/machine-id"

# preload the images into the node's containerd, unpacked on first use (as kind does)
log "preloading images into the node's containerd"
pre=$work/preload
rm -rf "$pre" && mkdir -p "$pre"
cat >"$pre/config.toml" <<EOF
version = 2
root = "$rootfs/var/lib/containerd"
state = "$pre/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$pre/c.sock"
[ttrpc]
  address = "$pre/c.sock.ttrpc"
[debug]
  address = "$pre/d.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$pre/opt"
EOF
containerd --config "$pre/config.toml" >"$pre/containerd.log" 2>&1 &
cpid=$!
trap 'kill $cpid 2>/dev/null || true' EXIT
for _ in $(seq 50); do ctr --address "$pre/c.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
for f in "$build"/images/*.tar; do
  ctr --address "$pre/c.sock" -n k8s.io images import --label=io.cri-containerd.pinned=pinned \
    --all-platforms --no-unpack - <"$f" >&2
done
ctr --address "$pre/c.sock" -n k8s.io images ls -q >&2
kill $cpid; wait $cpid 2>/dev/null || true
trap - EXIT
rm -rf "$pre"

# --- the image -----------------------------------------------------------------
log "docker load $image"
# one layer, the rootfs as it is (owners kept); a docker-archive rather than
# `docker import`, which cannot set STOPSIGNAL (systemd stops on SIGRTMIN+3)
tar --sort=name --numeric-owner -C "$rootfs" -cf "$build/rootfs.tar" .
rm -rf "$rootfs"
archive "$build/node.tar" "$image" \
  "$(jq -c -n --arg k "$key" '{Env:["container=docker","PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], Entrypoint:["/usr/local/bin/entrypoint","/sbin/init"], StopSignal:"SIGRTMIN+3", Labels:{"io.clipjob.kind-node.key":$k}}')" \
  "$build/rootfs.tar"
rm -f "$build/rootfs.tar"
docker load -i "$build/node.tar" >&2
docker tag "$image" "clipjob.local/kind-node:$KUBE_VERSION"
# older builds (a node still running one keeps it)
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' clipjob.local/kind-node | grep -v -x -e "$image" -e "clipjob.local/kind-node:$KUBE_VERSION" || true); do
  docker rmi "$old" >/dev/null 2>&1 && log "removed $old" || true
done
rm -rf "$build"
log "done: $image"
echo "$image"
