#!/usr/bin/env bash
# make test: every tier of the suite, each timed, and at the end where the
# time went (docs/development.md, "Tiers").
#
#   setup        what the tests need, installed or built once and cached
#                outside the repository (the first run pays for it; the
#                Kubernetes binaries and cert-manager build in the
#                background while the tiers that need neither run)
#   lint         gofmt and go vet
#   unit         every package but the two end-to-end tiers: pure core,
#                golden files, fuzz seeds, the relay's stores
#   integration  e2e/integration: one control plane with kwok, tests in
#                parallel, each with clipjob installed for its own namespace
#   real node    e2e/realnode and e2e/cluster: a real kubelet and
#                containerd, the chart's own pods, cert-manager, Paperclip
#   adapter      the Paperclip adapter's install and build (before the
#                end-to-end tiers, which run the adapter it builds), then
#                its npm tests
#
# TIERS picks some (e.g. TIERS="unit integration"); every failure is
# reported and the summary is printed all the same.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
ALL_TIERS="setup lint unit integration realnode adapter"
TIERS=${TIERS:-$ALL_TIERS}
for tier in $TIERS; do
  if [[ " $ALL_TIERS " != *" $tier "* ]]; then
    echo "make test: no tier $tier in TIERS (the tiers: $ALL_TIERS)" >&2
    exit 2
  fi
done
# Tests of the integration tier at once: they wait on the API server far
# more than they compute.
INTEGRATION_PARALLEL=${INTEGRATION_PARALLEL:-8}
# The real-node tier's parallel tests (after its one serial test):
# each waits on real containers and the Paperclip server, so more than the
# two cores' worth run at once (Go's default is GOMAXPROCS).
REALNODE_PARALLEL=${REALNODE_PARALLEL:-4}
GOTESTFLAGS=${GOTESTFLAGS:-}
# Only `make integration` attaches to a control plane left running
# (CLIPJOB_E2E_CONTROLPLANE, docs/development.md "Fast feedback"): attached,
# a test that restarts kwok skips, which a whole run must not pass with.
[ "$TIERS" = integration ] || unset CLIPJOB_E2E_CONTROLPLANE
# go test vets each package it tests with a subset of go vet's checks;
# when the lint tier runs go vet on every package, that is done already.
VET=""
[[ " ${TIERS} " == *" lint "* ]] && VET="-vet=off"

summary=()
failed=()
start_all=$(date +%s.%N)

# step NAME COMMAND...: runs COMMAND, records its time and outcome.
step() {
  local name=$1; shift
  echo "make test: $name: $*" >&2
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@"
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
  if [ $rc -eq 0 ]; then
    summary+=("$(printf '  %-34s %6s s' "$name" "$secs")")
  else
    summary+=("$(printf '  %-34s %6s s  FAILED (exit %d)' "$name" "$secs" "$rc")")
    failed+=("$name")
  fi
  return 0
}

want() { [[ " $TIERS " == *" $1 "* ]]; }

if [ "${CLIPJOB_E2E_NODE:-}" = kwok ] && want realnode; then
  TIERS=${TIERS//realnode/}
  summary+=("$(printf '  %-34s %6s    skipped: CLIPJOB_E2E_NODE=kwok asks for no real node' "real node" "-")")
fi

# The real-node tier waits on real containers far more than it computes:
# it runs beside lint, unit and integration (REALNODE_APART=1 runs it
# after them), its output kept until they are done.
realnode() {
  local how="beside the others" kube_bin
  [ -n "${REALNODE_APART:-}" ] && how="after the others"
  kube_bin=$(bash hack/kube-binaries.sh 2>/dev/null)
  step "real node ($how)" env KUBE_BIN_DIR="$kube_bin" \
    $GO test -count=1 $VET -timeout 40m -p 1 -parallel "$REALNODE_PARALLEL" $GOTESTFLAGS ./e2e/cluster/ ./e2e/realnode/
}
# In the background, from the start: the Kubernetes binaries, which a
# first run builds from the Go module proxy (many minutes of both cores);
# then, once the setup below is done, the real-node tier, beside
# cert-manager's build (the tier's cert-manager test waits for that
# build). Meanwhile the setup and the tiers that need no
# Kubernetes (the adapter's tests, lint, unit) run in front; the
# integration tier waits for the binaries. With warm caches the builds
# take no time and the real-node tier starts once the setup is done.
bg=$(mktemp)
bg_pid=""
if want setup || want integration || want realnode; then
  background() {
    summary=()
    step "setup: Kubernetes binaries" bash hack/kube-binaries.sh >/dev/null
    printf '%s\n' "${summary[-1]}" > "$bg.kube"
    local cm_pid=""
    if want setup && want realnode; then
      ( summary=(); step "setup: cert-manager" bash hack/cert-manager/build.sh >/dev/null
        printf '%s\n' "${summary[@]}" > "$bg.certmanager" ) &
      cm_pid=$!
    fi
    # Until the setup is done, or make test is gone (an interrupt).
    while [ ! -e "$bg.ready" ]; do
      kill -0 $$ 2>/dev/null || exit 1
      sleep 1
    done
    if want realnode && [ -z "${REALNODE_APART:-}" ]; then
      realnode > "$bg.realnode" 2>&1
    fi
    if [ -n "$cm_pid" ]; then
      wait "$cm_pid"
      [ -e "$bg.certmanager" ] && mapfile -t -O "${#summary[@]}" summary < "$bg.certmanager"
    fi
    printf '%s\n' "${summary[@]}" > "$bg.summary"
  }
  background &
  bg_pid=$!
fi
if want setup; then
  step "setup: real node packages" bash hack/node-packages.sh
  step "setup: PostgreSQL server" bash hack/postgres-packages.sh
  step "setup: Chromium" bash hack/chromium-packages.sh >/dev/null
  step "setup: Paperclip and Node.js 24" bash hack/paperclip/install.sh >/dev/null
fi
setup_end=${#summary[@]}
# The adapter's install and build before the end-to-end tiers: its npm ci
# replaces node_modules and its build dist/, which they run. Its tests run
# after it, beside the Kubernetes build on a first run and beside the
# real-node tier on later ones.
if want adapter; then
  node=$(bash hack/paperclip/install.sh --node)
  npm_adapter() { (cd adapters/paperclip && PATH="$node:$PATH" npm "$@"); }
  adapter_build() { npm_adapter ci --no-audit --no-fund && npm_adapter run build; }
  step "adapter: npm ci, build" adapter_build
fi
touch "$bg.ready"
# kube_binaries waits for the background's build, and prints the
# binaries' directory, or fails if the build did.
kube_binaries() {
  while [ ! -e "$bg.kube" ] && kill -0 "$bg_pid" 2>/dev/null; do sleep 1; done
  grep -q FAILED "$bg.kube" 2>/dev/null && return 1
  bash hack/kube-binaries.sh 2>/dev/null
}

# The integration tier, like the real node's, waits on its API server more
# than it computes: it runs from here beside the adapter's tests, lint and
# unit (one after the other they were the critical path), its output and
# summary kept until they are done.
integration() {
  if kube_bin=$(kube_binaries); then
    step "integration (kwok, in parallel)" env KUBE_BIN_DIR="$kube_bin" \
      $GO test -count=1 $VET -timeout 40m -parallel "$INTEGRATION_PARALLEL" $GOTESTFLAGS ./e2e/integration/
  else
    summary+=("$(printf '  %-34s %6s    not run: the Kubernetes binaries did not build' "integration (kwok, in parallel)" "-")")
    failed+=("integration")
  fi
}
int_pid=""
if want integration; then
  ( summary=() failed=()
    integration > "$bg.integration" 2>&1
    [ ${#failed[@]} -eq 0 ] || touch "$bg.integration.failed"
    printf '%s\n' "${summary[@]}" > "$bg.integration.summary" ) &
  int_pid=$!
fi

if want adapter; then
  step "adapter: tests" npm_adapter run test:built
fi
if want lint; then
  step "lint: gofmt" bash -c 'out=$(gofmt -l $(git ls-files "*.go")); if [ -n "$out" ]; then echo "gofmt needed:"; echo "$out"; exit 1; fi'
  step "lint: go vet" bash -c "$GO vet ./... && $GO vet -tags kind ./e2e/kind/"
fi
if want unit; then
  # shellcheck disable=SC2046
  step "unit" $GO test -count=1 $VET $GOTESTFLAGS $($GO list ./... | grep -v -e '/e2e/integration$' -e '/e2e/realnode$' -e '/e2e/cluster$')
  # Without a real node, e2e/cluster's tests that need none still run
  # (a control plane with kwok, the node's requirements, ports, images);
  # its real-node test skips itself, saying why.
  if [ "${CLIPJOB_E2E_NODE:-}" = kwok ] && kube_bin=$(kube_binaries); then
    step "e2e/cluster (kwok)" env KUBE_BIN_DIR="$kube_bin" $GO test -count=1 $VET $GOTESTFLAGS ./e2e/cluster/
  fi
fi
if [ -n "$int_pid" ]; then
  # A subshell killed before it wrote its summary (or that failed) is a
  # failed tier, never a missing line.
  wait "$int_pid"
  int_rc=$?
  cat "$bg.integration" 2>/dev/null
  if [ -s "$bg.integration.summary" ]; then
    mapfile -t -O "${#summary[@]}" summary < "$bg.integration.summary"
  else
    summary+=("$(printf '  %-34s %6s    FAILED (no result)' "integration (kwok, in parallel)" "?")")
  fi
  if [ "$int_rc" -ne 0 ] || [ ! -s "$bg.integration.summary" ] || [ -e "$bg.integration.failed" ]; then
    failed+=("integration")
  fi
fi
if [ -n "$bg_pid" ]; then
  wait "$bg_pid"
  [ -e "$bg.realnode" ] && cat "$bg.realnode"
  # The background's setup lines go with the setup's, the tier's last.
  mapfile -t lines < <(cat "$bg.summary" 2>/dev/null || echo "  setup: Kubernetes binaries             ?      FAILED (no result)")
  setup_lines=() tier_lines=()
  for line in "${lines[@]}"; do
    [[ "$line" == *FAILED* ]] && failed+=("$(sed -E 's/^ +//; s/ {2,}.*//' <<<"$line")")
    if [[ "$line" == "  setup:"* ]]; then setup_lines+=("$line"); else tier_lines+=("$line"); fi
  done
  summary=("${summary[@]:0:setup_end}" "${setup_lines[@]}" "${summary[@]:setup_end}" "${tier_lines[@]}")
fi
if want realnode && [ -n "${REALNODE_APART:-}" ]; then
  realnode
fi
rm -f "$bg" "$bg.kube" "$bg.realnode" "$bg.summary" "$bg.ready" "$bg.certmanager" "$bg.integration" "$bg.integration.summary" "$bg.integration.failed"

total=$(awk -v a="$start_all" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
echo
echo "make test: where the time went"
printf '%s\n' "${summary[@]}"
printf '  %-34s %6s s\n' "total" "$total"
if [ ${#failed[@]} -gt 0 ]; then
  echo "make test: FAILED: ${failed[*]}"
  exit 1
fi
# A run narrowed by TIERS, CLIPJOB_E2E_NODE or GOTESTFLAGS says what it
# left out, never that every tier passed.
not_run=()
for tier in $ALL_TIERS; do
  want "$tier" || not_run+=("$tier")
done
if [ ${#not_run[@]} -gt 0 ] || [ -n "$GOTESTFLAGS" ]; then
  echo "make test: the tiers run passed; not run: ${not_run[*]:-none}${GOTESTFLAGS:+; tests narrowed by GOTESTFLAGS=$GOTESTFLAGS}"
  exit 0
fi
echo "make test: every tier passed"
