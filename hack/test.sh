#!/usr/bin/env bash
# make test: every tier of the suite, each timed, and at the end where the
# time went (docs/development.md, "Tiers").
#
#   setup        what the tests need, installed or built once and cached
#                outside the repository (the first run pays for it)
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
TIERS=${TIERS:-"setup lint unit integration realnode adapter"}
# Tests of the integration tier at once: they wait on the API server far
# more than they compute.
INTEGRATION_PARALLEL=${INTEGRATION_PARALLEL:-8}
# The real-node tier's parallel tests (after its serial chart installs):
# each waits on real containers and the Paperclip server, so more than the
# two cores' worth run at once (Go's default is GOMAXPROCS).
REALNODE_PARALLEL=${REALNODE_PARALLEL:-6}
GOTESTFLAGS=${GOTESTFLAGS:-}

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

kube_bin=""
if want setup || want integration || want realnode; then
  step "setup: Kubernetes binaries" bash hack/kube-binaries.sh >/dev/null
  kube_bin=$(bash hack/kube-binaries.sh 2>/dev/null)
fi
if want setup; then
  step "setup: real node packages" bash hack/node-packages.sh
  step "setup: PostgreSQL server" bash hack/postgres-packages.sh
  step "setup: Chromium" bash hack/chromium-packages.sh >/dev/null
  step "setup: Paperclip and Node.js 24" bash hack/paperclip/install.sh >/dev/null
fi
# The adapter's install and build first: its npm ci replaces node_modules
# and its build dist/, which the end-to-end tiers run. Its tests run once
# the real-node tier has started.
if want adapter; then
  node=$(bash hack/paperclip/install.sh --node)
  npm_adapter() { (cd adapters/paperclip && PATH="$node:$PATH" npm "$@"); }
  adapter_build() { npm_adapter ci --no-audit --no-fund && npm_adapter run build; }
  step "adapter: npm ci, build" adapter_build
fi
# The real-node tier waits on real containers far more than it computes:
# it runs beside lint, unit and integration (REALNODE_APART=1 runs it
# after them), its output kept until they are done.
realnode_log=$(mktemp)
realnode_pid=""
if want realnode; then
  realnode() {
    local how="beside the others"
    [ -n "${REALNODE_APART:-}" ] && how="after the others"
    step "real node ($how)" env KUBE_BIN_DIR="$kube_bin" \
      $GO test -count=1 -timeout 40m -p 1 -parallel "$REALNODE_PARALLEL" $GOTESTFLAGS ./e2e/cluster/ ./e2e/realnode/
    printf '%s\n' "${summary[-1]}" > "$realnode_log.summary"
  }
  if [ -z "${REALNODE_APART:-}" ]; then
    realnode > "$realnode_log" 2>&1 &
    realnode_pid=$!
  fi
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
  step "unit" $GO test -count=1 $GOTESTFLAGS $($GO list ./... | grep -v -e '/e2e/integration$' -e '/e2e/realnode$' -e '/e2e/cluster$')
fi
if want integration; then
  step "integration (kwok, in parallel)" env KUBE_BIN_DIR="$kube_bin" \
    $GO test -count=1 -timeout 40m -parallel "$INTEGRATION_PARALLEL" $GOTESTFLAGS ./e2e/integration/
fi
if want realnode; then
  if [ -n "$realnode_pid" ]; then
    wait "$realnode_pid"
    cat "$realnode_log"
    line=$(cat "$realnode_log.summary" 2>/dev/null || echo "  real node                          ?      FAILED (no result)")
    summary+=("$line")
    [[ "$line" == *FAILED* ]] && failed+=("real node")
  else
    realnode
  fi
  rm -f "$realnode_log" "$realnode_log.summary"
fi

total=$(awk -v a="$start_all" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
echo
echo "make test: where the time went"
printf '%s\n' "${summary[@]}"
printf '  %-34s %6s s\n' "total" "$total"
if [ ${#failed[@]} -gt 0 ]; then
  echo "make test: FAILED: ${failed[*]}"
  exit 1
fi
echo "make test: every tier passed"
