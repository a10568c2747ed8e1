#!/usr/bin/env bash
# Proves a kind cluster made by hack/kind/up.sh works with no registry: the
# nodes are Ready, a pod runs, `kubectl logs` returns its output, a Service
# reaches a pod, in-cluster DNS answers. The test image is Debian's static
# busybox, assembled here and loaded with `kind load image-archive`.
#
# Usage: eval "$(hack/kind/up.sh)"; hack/kind/smoke.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${KIND_WORK:-/tmp/kindwork}
cluster=${KIND_CLUSTER:-clipjob-e2e}
: "${KIND:?}" "${KUBECONFIG:?}" "${KUBECTL:?}" "${DOCKER_HOST:?}"
export KUBECONFIG DOCKER_HOST PATH="$work/bin:$PATH"
log() { echo "smoke: $(date +%T) $*" >&2; }
k() { "$KUBECTL" "$@"; }

busybox=/bin/busybox
[ -x "$busybox" ] || { log "needs Debian's busybox-static (/bin/busybox)"; exit 1; }
file "$busybox" 2>/dev/null | grep -q "statically linked" || log "warning: $busybox may not be static"

# a docker-archive of busybox FROM scratch
d=$(mktemp -d "$work/smoke.XXXX")
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/root/bin" "$d/root/www" "$d/img"
cp "$busybox" "$d/root/bin/busybox"
for a in sh cat echo sleep nc printf sed tail nslookup httpd hostname; do ln -s busybox "$d/root/bin/$a"; done
echo "hello from the web pod" >"$d/root/www/index.html"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d/root" -cf "$d/img/layer.tar" .
ls=$(sha256sum "$d/img/layer.tar" | cut -d' ' -f1)
mv "$d/img/layer.tar" "$d/img/$ls.tar"
jq -c -n --arg id "sha256:$ls" '{architecture:"amd64", os:"linux", config:{Env:["PATH=/bin"], Cmd:["/bin/sh"]}, rootfs:{type:"layers", diff_ids:[$id]}}' >"$d/img/c.json"
cs=$(sha256sum "$d/img/c.json" | cut -d' ' -f1)
mv "$d/img/c.json" "$d/img/$cs.json"
jq -c -n --arg c "$cs.json" --arg l "$ls.tar" '[{Config:$c, RepoTags:["docker.io/local/busybox:smoke"], Layers:[$l]}]' >"$d/img/manifest.json"
tar -C "$d/img" -cf "$d/busybox.tar" .
log "kind load image-archive busybox"
"$KIND" load image-archive "$d/busybox.tar" --name "$cluster" >&2

log "nodes"
k wait --for=condition=Ready node --all --timeout=120s >&2
k get nodes -o wide >&2
# CoreDNS can take ~1 min on a new cluster: its first connections to the
# API server's Service leave conntrack entries made before kube-proxy's rules
k -n kube-system rollout status deploy/coredns --timeout=180s >&2

k delete ns smoke --ignore-not-found --wait=true >/dev/null
k create ns smoke >/dev/null
k -n smoke apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: docker.io/local/busybox:smoke
        imagePullPolicy: Never
        command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
EOF
k -n smoke rollout status deploy/web --timeout=120s >&2
k -n smoke apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: client
    image: docker.io/local/busybox:smoke
    imagePullPolicy: Never
    # Debian's busybox-static wget segfaults (on the machine too): HTTP with
    # nc; nslookup (busybox's own resolver) gives the Service's address
    command: ["sh", "-c", "echo hello from $(hostname); nslookup kubernetes.default.svc.cluster.local && ip=$(nslookup web.smoke.svc.cluster.local | sed -n 's/^Address: *//p' | tail -1) && echo web is $ip && [ \"$ip\" = \"$WEB_SERVICE_HOST\" ] && printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $ip 80 && echo CLIENT-OK"]
EOF
for _ in $(seq 60); do
  phase=$(k -n smoke get pod client -o jsonpath='{.status.phase}')
  case "$phase" in Succeeded|Failed) break ;; esac
  sleep 2
done
log "client pod: $phase; kubectl logs:"
out=$(k -n smoke logs client)
echo "$out" >&2
ok=true
grep -q "hello from client" <<<"$out" || { log "FAIL: pod output missing from kubectl logs"; ok=false; }
grep -q "hello from the web pod" <<<"$out" || { log "FAIL: Service did not reach the web pod"; ok=false; }
grep -q "CLIENT-OK" <<<"$out" || { log "FAIL: DNS or Service check failed"; ok=false; }
k -n smoke logs deploy/web >/dev/null || { log "FAIL: kubectl logs of the web pod"; ok=false; }
k delete ns smoke --wait=false >/dev/null
$ok && log "PASS: nodes Ready, pod ran, kubectl logs, Service, DNS"
$ok
