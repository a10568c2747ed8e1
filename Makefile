# clipjob: the two commands a newcomer needs are `make demo` and `make test`.

GO        ?= go
BIN       ?= bin
GOTEST    ?= $(GO) test
# Kubernetes binaries for the local control plane (built once, cached).
KUBE_BIN   = $(shell bash hack/kube-binaries.sh)
# The Node.js the Paperclip server needs (24), from the npm registry (installed once, cached); the machine's own Node stays.
PAPERCLIP_NODE = $(shell bash hack/paperclip/install.sh --node)
DEMO_FLAGS ?=
FUZZTIME  ?= 30s

BENCH_N      ?= 300
BENCH_C      ?= 1,10,50
BENCH_ROUNDS ?= 3
BENCH_RUNS   ?= 200,500
BENCH_FLEET_RUNS ?= 1000
BENCH_PC_RUNS ?= 50
BENCH_COUNT  ?= 3

.PHONY: all build image image-docker paperclip-image test adapter unit integration realnode e2e e2e-kind controlplane demo first-run soak relay-upgrade bench kube-binaries node-packages postgres-packages chromium paperclip fuzz golden dashboard-screenshots chart-docs lint fmt vet clean

# The image the chart runs, tagged with the chart's appVersion.
IMAGE     ?= ghcr.io/paperclipai/clipjob:$(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/clipjob/Chart.yaml)

all: build

build: ## Build the binaries into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

image: ## Build the container image with no registry or engine: $(BIN)/clipjob-image.tar (docker load, ctr images import, kind load image-archive)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/image/ ./cmd/...
	$(GO) run ./hack/image -tag $(IMAGE) -o $(BIN)/clipjob-image.tar $(BIN)/image

image-docker: ## The same image with a Docker engine and registries (the Dockerfile)
	docker build -t $(IMAGE) .

paperclip-image: paperclip ## A Paperclip image with clipjob's adapter registered and the fake agent as the agents' CLIs, no registry or engine: $(BIN)/paperclip-image.tar (docs/paperclip.md)
	bash hack/paperclip/image.sh $(BIN)/paperclip-image.tar

kube-binaries: ## Build (first time only) etcd, kube-apiserver, controller-manager, scheduler, kubelet, kube-proxy, kwok
	@bash hack/kube-binaries.sh >/dev/null

paperclip: ## Install (first time only) the real Paperclip server the e2e suite runs agents through, and the Node.js 24 it needs, from the npm registry
	@bash hack/paperclip/install.sh >/dev/null

node-packages: ## Install (first time only) the real node's Debian packages: containerd, runc, CNI plugins, busybox-static
	@bash hack/node-packages.sh

postgres-packages: ## Install (first time only) PostgreSQL's server from Debian's packages, for the relay's PostgreSQL store tests
	@bash hack/postgres-packages.sh

chromium: ## Install (first time only) headless Chromium from Debian's packages, for the runs page's browser test
	@bash hack/chromium-packages.sh >/dev/null

demo: kube-binaries node-packages paperclip ## Paperclip in a local cluster with a real node, clipjob from its chart, an agent run through both (DEMO_FLAGS=-bare: the bare Job alone; -keep: leave it running)
	KUBE_BIN_DIR=$(KUBE_BIN) $(GO) run ./e2e/demo $(DEMO_FLAGS)

first-run: kube-binaries node-packages paperclip ## Time the documented commands from helm install to an agent's first line in Paperclip's run log, on a cluster with a real node and the images loaded (docs/paperclip.md); builds helm from the module proxy (hack/helm.sh)
	KUBE_BIN_DIR=$(KUBE_BIN) $(GO) run ./e2e/demo -first-run

test: ## Every tier: lint, unit, integration (kwok, in parallel), real node, the adapter's; prints where the time went (hack/test.sh)
	bash hack/test.sh

adapter: paperclip ## The Paperclip adapter (adapters/paperclip): install from its lockfile, build, unit tests, on the Node.js Paperclip runs on
	cd adapters/paperclip && PATH="$(PAPERCLIP_NODE):$$PATH" npm ci --no-audit --no-fund && PATH="$(PAPERCLIP_NODE):$$PATH" npm test

unit: postgres-packages ## Unit, golden and fuzz-seed tests only (no control plane; the relay's PostgreSQL store tests start a throwaway server from Debian's package)
	TIERS="unit" bash hack/test.sh

integration: kube-binaries postgres-packages chromium paperclip ## The integration tier: one control plane with kwok, tests in parallel (attaches to `make controlplane`'s when CLIPJOB_E2E_CONTROLPLANE is set)
	TIERS="integration" bash hack/test.sh

realnode: kube-binaries node-packages postgres-packages paperclip ## The real-node tier: a real kubelet and containerd beside kwok
	TIERS="realnode" bash hack/test.sh

e2e: kube-binaries node-packages postgres-packages chromium paperclip ## Both end-to-end tiers
	TIERS="integration realnode" bash hack/test.sh

controlplane: kube-binaries ## Start a control plane and keep it running, for `CLIPJOB_E2E_CONTROLPLANE=<dir> go test -run X ./e2e/integration/`
	KUBE_BIN_DIR=$(KUBE_BIN) $(GO) run ./e2e/controlplane

e2e-kind: ## The in-cluster e2e tests on a kind cluster built here (Docker engine, kind and node image from Debian's packages and the module proxy; not with make test at once)
	bash hack/e2e-kind.sh

soak: kube-binaries node-packages paperclip ## Chaos, measured: many agent runs through Paperclip in the cluster while clipjob's and Paperclip's pods are killed at random (SOAK_FLAGS; docs/benchmarks.md); outside make test
	KUBE_BIN_DIR=$(KUBE_BIN) $(GO) run ./e2e/soak $(SOAK_FLAGS)

relay-upgrade: kube-binaries postgres-packages ## A rolling upgrade from the Lease-based relay (built from this repository's history, cached) to this checkout's under a flood, on the integration tier's control plane: 0 lines lost or stored twice (UPGRADE_FLAGS; docs/relay.md); outside make test
	KUBE_BIN_DIR=$(KUBE_BIN) $(GO) run ./e2e/upgrade $(UPGRADE_FLAGS)

bench: kube-binaries chromium ## Go benchmarks of the hot paths, the runs page with a 100k-line log in Chromium, a real Paperclip server's runs through clipjob beside the seed adapter's (real node), then admission and the relay at fleet scale (docs/benchmarks.md)
	$(GOTEST) -run XXX -bench . -benchmem -count $(BENCH_COUNT) ./templates/ ./compile/ ./policy/ ./webhook/ ./relay/...
	$(GOTEST) -run XXX -bench . -benchtime 3x -count $(BENCH_COUNT) ./dashboard/pagebench/
	KUBE_BIN_DIR=$(KUBE_BIN) $(GO) run ./e2e/bench -n $(BENCH_N) -c $(BENCH_C) -rounds $(BENCH_ROUNDS) -runs $(BENCH_RUNS) -fleet-runs $(BENCH_FLEET_RUNS) -pc-runs $(BENCH_PC_RUNS)

dashboard-screenshots: kube-binaries chromium ## Regenerate the runs page's screenshots in docs/images/dashboard from its browser test
	CLIPJOB_DASHBOARD_SCREENSHOTS=$(CURDIR)/docs/images/dashboard KUBE_BIN_DIR=$(KUBE_BIN) $(GOTEST) -count=1 -run '^TestRunsPageInABrowser$$' ./e2e/integration/

fuzz: ## Fuzz every decoder for FUZZTIME each
	$(GOTEST) -run XXX -fuzz '^FuzzAdmissionReview$$' -fuzztime $(FUZZTIME) ./webhook/
	$(GOTEST) -run XXX -fuzz '^FuzzMutateObject$$' -fuzztime $(FUZZTIME) ./webhook/
	$(GOTEST) -run XXX -fuzz '^FuzzValidateObject$$' -fuzztime $(FUZZTIME) ./webhook/
	$(GOTEST) -run XXX -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./config/
	$(GOTEST) -run XXX -fuzz '^FuzzMatchGlob$$' -fuzztime $(FUZZTIME) ./config/
	$(GOTEST) -run XXX -fuzz '^FuzzRead$$' -fuzztime $(FUZZTIME) ./internal/manifest/
	$(GOTEST) -run XXX -fuzz '^FuzzLineDecoding$$' -fuzztime $(FUZZTIME) ./relay/collect/
	$(GOTEST) -run XXX -fuzz '^FuzzRedactKeepsJSONValid$$' -fuzztime $(FUZZTIME) ./relay/redact/
	$(GOTEST) -run XXX -fuzz '^FuzzRedactGuardsMissNothing$$' -fuzztime $(FUZZTIME) ./relay/redact/

golden: ## Rewrite golden files and the manual's generated reference blocks after an intended change (review the diff!)
	REFRESH_GOLDEN=true $(GOTEST) ./templates/ ./config/ ./cmd/clipjob/app/ ./cmd/clipjob-webhook/app/ ./cmd/clipjob-relay/app/

chart-docs: ## Regenerate charts/clipjob/README.md from the `# --` comments in charts/clipjob/values.yaml
	$(GOTEST) ./charts/ -run '^TestChartREADME$$' -update

lint: fmt vet

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags kind ./e2e/kind/

clean:
	rm -rf $(BIN)
