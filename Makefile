# sandbox-controller. `make run` and `make test` are the two commands a new
# user needs; both set up what they use (see hack/).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

CONTROLLER_TOOLS_VERSION ?= v0.23.0
BIN            := $(CURDIR)/bin
CONTROLLER_GEN := $(BIN)/controller-gen
ENVTEST_DIR     = $(shell hack/envtest-assets.sh --print-dir)
AREAS_ROOT     ?= $(BIN)/local/areas
GO_TEST_FLAGS  ?=

.PHONY: all
all: build

##@ Develop

.PHONY: build
build: manifests generate starter ## Build bin/sandbox-controller (and bin/sandbox-holder, its cgroup v1 starter, beside it).
	go build -tags "$(CONTROLLER_TAGS)" -o $(BIN)/sandbox-controller ./cmd/sandbox-controller

.PHONY: starter
starter: ## Build bin/sandbox-holder: static, the starter the bwrap backend of the controller and sandboxctl beside it start commands through on cgroup v1.
	CGO_ENABLED=0 go build -o $(BIN)/sandbox-holder ./cmd/sandbox-holder

.PHONY: run
run: build install-plugin ## Run the controller on a throw-away local control plane with the bwrap backend.
	@hack/install-deps.sh
	@WITH_KUBECTL=1 hack/envtest-assets.sh >/dev/null
	@echo "kubectl for this control plane: $(ENVTEST_DIR)/kubectl (or any kubectl on PATH)"
	$(BIN)/sandbox-controller --local-control-plane --local-assets "$(ENVTEST_DIR)" \
		--areas-root "$(AREAS_ROOT)" --metrics-bind-address 0 --health-probe-bind-address 0 \
		--log-format console --log-level debug --routine-events

.PHONY: install-plugin
install-plugin: starter ## Build bin/sandboxctl (static: a one-shot run starts without the dynamic loader) and link it as bin/kubectl-sandbox and bin/kubectl_complete-sandbox (put bin/ on PATH for `kubectl sandbox` and its completion).
	CGO_ENABLED=0 go build -o $(BIN)/sandboxctl ./cmd/sandboxctl
	ln -sf sandboxctl $(BIN)/kubectl-sandbox
	ln -sf sandboxctl $(BIN)/kubectl_complete-sandbox
	@echo "export PATH=$(BIN):\$$PATH   # then: kubectl sandbox exec CLAIM -- COMMAND"

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC from the API markers.
	$(CONTROLLER_GEN) rbac:roleName=sandbox-controller crd paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: vet
vet: ## go vet and gofmt.
	go vet -tags $(ALL_TAGS) ./...
	go vet -tags $(SLIM_TAGS) ./cmd/sandbox-controller/
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd for envtest into bin/k8s.
	hack/envtest-assets.sh

$(CONTROLLER_GEN):
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; print "Usage: make <target>"} /^##@/ {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Test tiers are build tags (README, "The two commands"): untagged tests are the fast
# loop (unit, envtest, the real bwrap and git); `e2e` marks the tests that
# need a daemon of their own (containerd, incusd) or run the controller as
# a process under faults; `realcluster` and `scale` are opt-in suites of
# their own. The e2e packages are those with a file under the tag.
E2E_TAGS  := e2e
ALL_TAGS  := e2e,realcluster,scale
# The controller built with bwrap's driver alone (cmd/sandbox-controller,
# backend_*.go): make vet compiles it.
SLIM_TAGS := sandbox_no_containerd,sandbox_no_incus
E2E_PKGS   = $(shell grep -rl --include='*_test.go' '^//go:build e2e$$' . | xargs -n1 dirname | sort -u)

##@ Test

.PHONY: test
test: manifests generate vet ## Everything (the README's command; CI runs it): unit, envtest and e2e suites against real dependencies, the two race tests alone at full strength (hack/run-tests.sh; starts incusd, and a private containerd it stops after), then the real-cluster suite (hack/test-cluster.sh, as make test-cluster). Output in bin/test-output.log, a summary at the end.
	@hack/install-deps.sh
	@hack/install-deps.sh python3-kubernetes python3-websocket python3-pytest
	@WITH_KUBECTL=1 WITH_SCHEDULER=1 hack/envtest-assets.sh >/dev/null
	@hack/incus.sh start >/dev/null
	@hack/containerd.sh start >/dev/null
	@mkdir -p $(BIN)
	eval "$$(hack/containerd.sh env)"; set +e; KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" hack/run-tests.sh $(BIN)/test-output.log $(GO_TEST_FLAGS); \
		rc=$$?; hack/containerd.sh stop; \
		echo "== hack/test-cluster.sh" | tee -a $(BIN)/test-output.log; \
		hack/test-cluster.sh -timeout $(TEST_CLUSTER_TIMEOUT) $(GO_TEST_FLAGS) 2>&1 | tee -a $(BIN)/test-output.log; \
		r=$${PIPESTATUS[0]}; [ $$r -eq 0 ] || rc=$$r; \
		hack/test-summary.sh $(BIN)/test-output.log; exit $$rc

.PHONY: test-unit
test-unit: manifests generate vet ## The fast loop: unit tests and envtest suites with the real bwrap and git; no daemons.
	@hack/install-deps.sh
	@WITH_KUBECTL=1 WITH_SCHEDULER=1 hack/envtest-assets.sh >/dev/null
	KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test $(GO_TEST_FLAGS) ./...

.PHONY: test-e2e
test-e2e: manifests generate ## The suites that need containerd, incusd or a controller process under faults (starts them; stops containerd after).
	@hack/install-deps.sh
	@hack/envtest-assets.sh >/dev/null
	@hack/incus.sh start >/dev/null
	@hack/containerd.sh start >/dev/null
	eval "$$(hack/containerd.sh env)"; set +e; KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -tags $(E2E_TAGS) $(GO_TEST_FLAGS) $(E2E_PKGS); rc=$$?; hack/containerd.sh stop; exit $$rc

TEST_CLUSTER_TIMEOUT ?= 40m

.PHONY: test-cluster
test-cluster: ## On a real cluster (hack/test-cluster.sh: hack/cluster.sh start, stopped after): build and import the image, make deploy, apply the samples, kubectl sandbox exec through the API server and on the node, spreading over a second node and moving off it when it is lost, the README's worktree example, delete everything, make undeploy, check nothing is left (test/e2e/realcluster). The last pass of make test.
	@hack/install-deps.sh
	@WITH_KUBECTL=1 hack/envtest-assets.sh >/dev/null
	hack/test-cluster.sh -count=1 -timeout $(TEST_CLUSTER_TIMEOUT) $(GO_TEST_FLAGS)

CHAOS_DURATION ?= 7m
CHAOS_OUTAGES  ?= 5s,30s,90s
CHAOS_BACKENDS ?= bwrap,containerd

.PHONY: test-chaos
test-chaos: build ## Long chaos run (CHAOS_DURATION, default 7m): claims churn while the controller, kube-apiserver and containerd are killed; appends its figures to bin/chaos-report.md (docs/reliability.md).
	@hack/install-deps.sh
	@hack/envtest-assets.sh >/dev/null
	@hack/containerd.sh start >/dev/null
	eval "$$(hack/containerd.sh env)"; set +e; SANDBOX_CONTROLLER_BIN="$(BIN)/sandbox-controller" CHAOS_DURATION="$(CHAOS_DURATION)" CHAOS_OUTAGES="$(CHAOS_OUTAGES)" CHAOS_BACKENDS="$(CHAOS_BACKENDS)" CHAOS_REPORT="$(BIN)/chaos-report.md" KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -tags $(E2E_TAGS) -count=1 -timeout 90m -v -run '^TestChaos$$' ./test/chaos/; rc=$$?; hack/containerd.sh stop; exit $$rc

.PHONY: cluster-up
cluster-up: ## A real single-node cluster built from source (hack/cluster.sh start: control plane, kubelet, kube-proxy, a CRI containerd of its own); hack/cluster.sh env prints KUBECONFIG and the rest a caller needs.
	hack/cluster.sh start

.PHONY: cluster-smoke
cluster-smoke: ## Check that cluster: a pod on the pod network and a hostNetwork pod reach the API server through the kubernetes service (hack/cluster.sh smoke).
	hack/cluster.sh smoke

.PHONY: cluster-down
cluster-down: ## Stop that cluster: processes, pods, mounts, iptables chains, cgroups, and the kernel settings the kubelet changed put back (its state is kept; hack/cluster.sh clean removes it).
	hack/cluster.sh stop

GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## golangci-lint with .golangci.yml (built from the Go module proxy on first use; CI runs it).
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)/.lint
	GOBIN=$(BIN)/.lint go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.lint/golangci-lint $@

##@ Benchmarks

# Every benchmark writes into one page, docs/benchmarks-<name>.md, between
# its `<!-- make bench-<name>: begin/end -->` markers; SANDBOX_BENCH_OUT
# names the page and is what makes an opt-in benchmark run at all.
# docs/benchmarks.md lists the pages.
BENCH_PAGE = SANDBOX_BENCH_OUT="$(CURDIR)/docs/benchmarks-$(patsubst bench-%,%,$@).md"

.PHONY: bench
bench: bench-bwrap bench-claims bench-containerd bench-incus bench-execapi bench-scale ## Run every benchmark (pages listed in docs/benchmarks.md).

.PHONY: bench-bwrap
bench-bwrap: ## Per-command latency of the bwrap backend against raw bwrap and fork/exec; writes docs/benchmarks-bwrap.md.
	@hack/install-deps.sh
	$(BENCH_PAGE) go test -count=1 -run '^$$' -bench '^BenchmarkLatencyTable$$' -benchtime 1x -v ./runtimes/bwrap/

.PHONY: bench-claims
bench-claims: ## Claim latency of the default backend, one at a time and in bursts, beside API server round trips; writes docs/benchmarks-claims.md.
	@hack/install-deps.sh
	@hack/envtest-assets.sh >/dev/null
	$(BENCH_PAGE) KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -count=1 -timeout 30m ./controllers/ -ginkgo.label-filter=bench -ginkgo.v

.PHONY: bench-containerd
bench-containerd: ## Claim and exec latency of the containerd backend beside raw-client baselines; writes docs/benchmarks-containerd.md.
	@hack/envtest-assets.sh >/dev/null
	@hack/containerd.sh start >/dev/null
	eval "$$(hack/containerd.sh env)"; set +e; $(BENCH_PAGE) KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -tags $(E2E_TAGS) -count=1 -timeout 20m ./test/e2e/containerd/ -ginkgo.label-filter=bench -ginkgo.v; rc=$$?; hack/containerd.sh stop; exit $$rc

.PHONY: bench-incus
bench-incus: ## Claim and exec latency of the incus backend beside raw REST baselines; writes docs/benchmarks-incus.md.
	@hack/envtest-assets.sh >/dev/null
	@hack/incus.sh start >/dev/null
	$(BENCH_PAGE) KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -tags $(E2E_TAGS) -count=1 -timeout 30m ./test/e2e/incus/ -ginkgo.label-filter=bench

.PHONY: bench-execapi
bench-execapi: ## Exec of true through the exec API (the node's endpoint), through the API server (aggregated API) and the runtime called directly; writes docs/benchmarks-execapi.md.
	@hack/install-deps.sh
	@hack/envtest-assets.sh >/dev/null
	$(BENCH_PAGE) KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -count=1 -timeout 20m ./test/e2e/execapi/ -ginkgo.label-filter=bench -ginkgo.v

.PHONY: bench-scale
bench-scale: image-binary ## 1,000 and 10,000 Sandboxes (SCALE_SANDBOXES, comma-separated) with a claim each: time to all Ready against the API server's own time to create them, the controller's CPU and memory; writes docs/benchmarks-scale.md (SCALE_BASELINE_BIN adds a row for another build, SCALE_PPROF=1 saves a CPU profile and a heap profile of each run in bin/, SCALE_PPROF=exact a heap profile of every allocation and no page).
	@hack/install-deps.sh
	@hack/envtest-assets.sh >/dev/null
	$(BENCH_PAGE) SCALE_SANDBOXES=$(SCALE_SANDBOXES) SCALE_CONTROLLER_BIN="$(IMAGE_BIN)" SCALE_PPROF="$(SCALE_PPROF)" \
		KUBEBUILDER_ASSETS="$(ENVTEST_DIR)" go test -tags scale -count=1 -timeout 90m -v -run '^TestScale$$' ./test/e2e/scale/

##@ Deploy

VERSION   ?= $(shell cat VERSION 2>/dev/null || git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_NAME ?= sandbox-controller
IMAGE_TAR  ?= $(BIN)/sandbox-controller-image.tar
SCALE_SANDBOXES ?= 1000,10000

IMAGE_BIN  := $(BIN)/image/sandbox-controller
# Build tags of the controller (make build, make image): empty links every
# backend's driver; $(SLIM_TAGS) links bwrap's alone, for nodes that run
# nothing else (a smaller binary and image, less memory).
CONTROLLER_TAGS ?=
HOLDER_BIN := $(BIN)/image/sandbox-holder

# make deploy and make undeploy (hack/deploy.sh, docs/cluster.md) talk to the
# cluster of KUBECONFIG with KUBECTL (empty: bin/k8s/<version>/kubectl,
# built when missing).
IMG              ?= $(IMAGE_NAME):$(VERSION)
BACKENDS         ?=
SANDBOX_POD_IMAGE ?=
CONTAINER_BUNDLES ?=
UNDEPLOY_TIMEOUT ?= 5m
KUBECTL          ?=

.PHONY: image
image: image-binary ## Build the controller's OCI image without a container engine (static binary; bwrap, git and their libraries from Debian packages) as bin/sandbox-controller-image.tar, tagged with VERSION (default: git describe); `ctr images import` takes it.
	cd hack/image && GOWORK=off go run . -controller "$(IMAGE_BIN)" -holder "$(HOLDER_BIN)" -debs "$(BIN)/image/debs" \
		-name "$(IMAGE_NAME)" -version "$(VERSION)" -out "$(IMAGE_TAR)" -epoch "$$(git log -1 --format=%ct 2>/dev/null || echo 0)"

# The binary the image runs: static (the image has no libraries for it) and
# stripped.
.PHONY: image-binary
image-binary:
	CGO_ENABLED=0 go build -trimpath -tags "$(CONTROLLER_TAGS)" -ldflags "-s -w -X main.version=$(VERSION)" -o $(IMAGE_BIN) ./cmd/sandbox-controller
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(HOLDER_BIN) ./cmd/sandbox-holder

.PHONY: deploy
deploy: ## Install the CRDs, RBAC, admission policy, namespace, the controller's DaemonSet and the aggregated API's Deployment (config/default) in the cluster of KUBECONFIG, with the image IMG (default IMAGE_NAME:VERSION, what make image tags); BACKENDS=containerd,incus adds those backends' components; SANDBOX_POD_IMAGE names the image of the Sandboxes' Pods (default the nodes' pause image, registry.k8s.io/pause:3.10); CONTAINER_BUNDLES the nodes' directory of containerd's bundles for the kubelet's containers (default /run/containerd/io.containerd.runtime.v2.task/k8s.io). Server-side apply; run again to update.
	IMG="$(IMG)" BACKENDS="$(BACKENDS)" SANDBOX_POD_IMAGE="$(SANDBOX_POD_IMAGE)" CONTAINER_BUNDLES="$(CONTAINER_BUNDLES)" KUBECTL="$(KUBECTL)" hack/deploy.sh deploy

.PHONY: undeploy
undeploy: ## Delete every Sandbox and SessionClaim while the controller still runs to release them (fails after UNDEPLOY_TIMEOUT naming those left, having deleted nothing else), then everything deploy installed. The agents' areas stay on the nodes.
	UNDEPLOY_TIMEOUT="$(UNDEPLOY_TIMEOUT)" KUBECTL="$(KUBECTL)" hack/deploy.sh undeploy
