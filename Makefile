# resource-broker Makefile. `make help` lists the targets.
SHELL := /usr/bin/env bash

K8S_VERSION  := $(shell go list -m -f '{{.Version}}' k8s.io/kubernetes)
ETCD_VERSION := $(shell go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
K8S_MINOR    := $(word 2,$(subst ., ,$(K8S_VERSION)))
ENVTEST_DIR  := $(CURDIR)/bin/k8s
VERSION_PKG  := k8s.io/component-base/version
K8S_LDFLAGS  := -s -w -X $(VERSION_PKG).gitVersion=$(K8S_VERSION) -X $(VERSION_PKG).gitMajor=1 -X $(VERSION_PKG).gitMinor=$(K8S_MINOR)
GO_TEST_FLAGS ?= -count=1 -timeout 30m
BENCH_FLAGS  ?=
SCALE_FLAGS  ?=
BINARIES     := rb-broker rb-agent rb-scheduler rbctl
GOLANGCI_LINT_VERSION ?= v2.15.0
CONTROLLER_GEN_VERSION ?= v0.20.1

export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)

# The version our binaries report (--version) and the images are tagged with.
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT       ?= $(shell git rev-parse HEAD 2>/dev/null)
RB_VERSION_PKG := github.com/fluidos-project/resource-broker/internal/version
LDFLAGS      := -X $(RB_VERSION_PKG).version=$(VERSION) -X $(RB_VERSION_PKG).commit=$(COMMIT)

.PHONY: help
help: ## Show this help.
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

.PHONY: demo
demo: envtest-bin node-bin metrics-server-bin coredns-bin build ## Run the three-cluster demo on real nodes where the machine allows it (Redis, brokers, rome/paris/berlin, a workload, a live timeline; Ctrl-C tears down; DEMO_FLAGS=--exit-after=30s, --nodes=stand-in).
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		$(MAKE) --no-print-directory node-deps || echo "demo: containerd, runc or the CNI plugins could not be installed: the demo falls back to stand-in nodes"; fi
	go build -o bin/demo ./hack/demo
	bin/demo $(DEMO_FLAGS)

.PHONY: demo-broker
demo-broker: build check-redis ## Run the broker-only demo: Redis, one broker, three clusters played by curl (API, refusals, v1 protocol).
	hack/demo-broker.sh

.PHONY: test
test: envtest-bin node-bin metrics-server-bin coredns-bin liqo-bin kueue-bin cert-manager-crds check-redis check-node-deps ## Run every test (needs root, redis-server, containerd, runc, CNI plugins; builds the test control plane, nodes, metrics-server, Liqo and Kueue on first use).
	go test $(GO_TEST_FLAGS) -skip '^($(ALONE_TESTS))$$' ./...
	go test $(GO_TEST_FLAGS) -run '^($(ALONE_TESTS))$$' $(ALONE_PKGS)

# ALONE_TESTS compare latencies measured in the same run (the honest
# members' p99 beside abusers against alone): `make test` runs them after
# the others, alone on the machine, as a benchmark is run. ALONE_PKGS are
# the packages that hold them.
ALONE_TESTS := TestAbuseChurnAndHeavyRenewals
ALONE_PKGS  := ./broker/server

.PHONY: check-node-deps
check-node-deps:
	@for t in containerd runc ctr unshare nsenter ip iptables-restore sysctl cc; do command -v $$t >/dev/null || { echo "$$t not found: make node-deps (as root) installs containerd, runc and the CNI plugins" >&2; exit 1; }; done
	@test -x /usr/lib/cni/bridge || { echo "/usr/lib/cni/bridge not found: make node-deps (as root)" >&2; exit 1; }

.PHONY: check-redis
check-redis:
	@command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install -y redis-server (or brew install redis)" >&2; exit 1; }
	@command -v redis-sentinel >/dev/null || { echo "redis-sentinel not found: apt-get install -y redis-sentinel (or brew install redis)" >&2; exit 1; }

.PHONY: bench
bench: envtest-bin check-redis ## Every benchmark with its baseline, ratio and target; writes docs/benchmarks/ (BENCH_FLAGS="--only broker,http", see docs/benchmarks.md).
	go run ./hack/benchreport $(BENCH_FLAGS)

.PHONY: scale
scale: check-redis ## Simulate a federation against real brokers and Redis: per-call latency, Redis and broker CPU, memory per lease (SCALE_FLAGS="--clusters 1000 --leases 100000 --out scale.json", see docs/benchmarks.md).
	go run ./hack/scale $(SCALE_FLAGS)

.PHONY: bench-e2e
bench-e2e: envtest-bin check-redis ## End-to-end latency on the whole test bed (100 pods, p50/p90/p99); see docs/benchmarks.md.
	go test -run '^$$' -bench EndToEnd -benchtime 1x -timeout 30m ./test/integration/

.PHONY: fuzz
fuzz: ## Fuzz the request decoders for 30 s each.
	for f in FuzzReservationRequest FuzzV1ReservationRequest FuzzAdvertisement FuzzV1Advertisement FuzzDecodeRenewRequest; do \
		go test -run '^$$' -fuzz "^$$f$$" -fuzztime 30s ./broker/api/ || exit 1; done

.PHONY: vet
vet: ## go vet and gofmt check.
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: lint
lint: bin/golangci-lint ## Run golangci-lint (.golangci.yml), built from the Go module proxy.
	bin/golangci-lint run ./...

bin/golangci-lint:
	GOBIN=$(CURDIR)/bin GOFLAGS=-mod=mod go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

.PHONY: generate
generate: bin/controller-gen ## Generate deepcopy code (api/, plugins/apis/) and the CRDs (manifests/crds) from api/.
	bin/controller-gen object:headerFile="" paths=./api/... crd paths=./api/... output:crd:artifacts:config=manifests/crds
	bin/controller-gen object:headerFile="" paths=./plugins/apis/...

.PHONY: verify-generate
verify-generate: generate ## Fail when generated code or CRDs are out of date.
	@git diff --exit-code -- api manifests/crds plugins/apis || { echo "run make generate and commit the result" >&2; exit 1; }

bin/controller-gen:
	GOBIN=$(CURDIR)/bin GOFLAGS=-mod=mod go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

.PHONY: build
build: $(addprefix bin/,$(BINARIES)) ## Build our binaries into bin/.

bin/%: FORCE
	go build -ldflags "$(LDFLAGS)" -o $@ ./cmd/$*

# rb-scheduler is kube-scheduler: component-base's version is the Kubernetes
# release it is built from (its metrics and feature gates go by it).
bin/rb-scheduler: LDFLAGS += -X $(VERSION_PKG).gitVersion=$(K8S_VERSION) -X $(VERSION_PKG).gitMajor=1 -X $(VERSION_PKG).gitMinor=$(K8S_MINOR)

.PHONY: FORCE
FORCE:

.PHONY: certs
certs: bin/rbctl ## Make a development CA, a broker certificate and client certificates for rome, paris, berlin in .certs/.
	bin/rbctl certs --out .certs --clusters rome,paris,berlin

.PHONY: run-broker
run-broker: bin/rb-broker certs check-redis ## Run Redis (in .demo/) and one broker on :8443 with the development certificates.
	hack/run-broker.sh

# The test control plane, built from the versions in go.mod. A stamp per
# version keeps it cached across go.mod edits that do not change the versions.
ENVTEST_STAMP := $(ENVTEST_DIR)/.built-k8s-$(K8S_VERSION)-etcd-$(ETCD_VERSION)

.PHONY: envtest-bin
envtest-bin: $(ENVTEST_STAMP) ## Build the test control plane (kube-apiserver, etcd, kubectl) from go.mod's versions into bin/k8s.

$(ENVTEST_STAMP):
	@mkdir -p $(ENVTEST_DIR)
	@echo ">> building kube-apiserver $(K8S_VERSION) (first time: several minutes)"
	go build -ldflags "$(K8S_LDFLAGS)" -o $(ENVTEST_DIR)/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
	@echo ">> building etcd $(ETCD_VERSION)"
	go build -ldflags "-s -w" -o $(ENVTEST_DIR)/etcd go.etcd.io/etcd/server/v3
	@echo ">> building kubectl $(K8S_VERSION)"
	go build -ldflags "$(K8S_LDFLAGS)" -o $(ENVTEST_DIR)/kubectl k8s.io/kubernetes/cmd/kubectl
	@rm -f $(ENVTEST_DIR)/.built-*
	@touch $@

# The real nodes of the test bed (internal/realnode): kubelet, kube-proxy and
# kube-controller-manager at go.mod's Kubernetes version, beside the control
# plane. containerd, runc and the CNI plugins come from Debian packages
# (`make node-deps`).
NODE_STAMP := $(ENVTEST_DIR)/.node-k8s-$(K8S_VERSION)-kcm-scheduler-proxy

.PHONY: node-bin
node-bin: $(NODE_STAMP) ## Build kubelet, kube-proxy, kube-controller-manager and kube-scheduler from go.mod's version into bin/k8s (real nodes of the test bed).

$(NODE_STAMP):
	@mkdir -p $(ENVTEST_DIR)
	@echo ">> building kubelet, kube-proxy, kube-controller-manager and kube-scheduler $(K8S_VERSION)"
	go build -ldflags "$(K8S_LDFLAGS)" -o $(ENVTEST_DIR)/kubelet k8s.io/kubernetes/cmd/kubelet
	go build -ldflags "$(K8S_LDFLAGS)" -o $(ENVTEST_DIR)/kube-proxy k8s.io/kubernetes/cmd/kube-proxy
	go build -ldflags "$(K8S_LDFLAGS)" -o $(ENVTEST_DIR)/kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
	go build -ldflags "$(K8S_LDFLAGS)" -o $(ENVTEST_DIR)/kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
	@rm -f $(ENVTEST_DIR)/.node-*
	@touch $@

# metrics-server for the real-node clusters of the test bed and of the demo
# (kubectl top, HorizontalPodAutoscalers): a pinned release built with `go
# install` from the Go module proxy, outside this module (it is not one of our
# dependencies). Its RBAC manifest (manifests/base/rbac.yaml of the same
# module) is copied beside it: the bed applies it as upstream wrote it. Into
# bin/metrics-server, cached by a stamp per version.
METRICS_SERVER_VERSION := v0.8.0
METRICS_SERVER_DIR     := $(CURDIR)/bin/metrics-server
METRICS_SERVER_STAMP   := $(METRICS_SERVER_DIR)/.built-metrics-server-$(METRICS_SERVER_VERSION)

.PHONY: metrics-server-bin
metrics-server-bin: $(METRICS_SERVER_STAMP) ## Build metrics-server (METRICS_SERVER_VERSION) from the Go module proxy into bin/metrics-server, with its RBAC manifest (real-node test bed and demo: kubectl top, HPA).

$(METRICS_SERVER_STAMP):
	@echo ">> building metrics-server $(METRICS_SERVER_VERSION) into $(METRICS_SERVER_DIR) (first time: about 2 minutes)"
	@set -euo pipefail; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$(METRICS_SERVER_DIR)"; \
	cd "$$tmp"; \
	export GOWORK=off GOFLAGS=-buildvcs=false; \
	GOBIN="$(METRICS_SERVER_DIR)" go install -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$(METRICS_SERVER_VERSION)" \
		sigs.k8s.io/metrics-server/cmd/metrics-server@$(METRICS_SERVER_VERSION); \
	GOFLAGS=-mod=mod go mod download -json sigs.k8s.io/metrics-server@$(METRICS_SERVER_VERSION) > download.json; \
	dir=$$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p' download.json); \
	if [ -z "$$dir" ] || [ ! -f "$$dir/manifests/base/rbac.yaml" ]; then echo "no manifests/base/rbac.yaml in metrics-server $(METRICS_SERVER_VERSION) ($$dir)" >&2; exit 1; fi; \
	install -m 0644 "$$dir/manifests/base/rbac.yaml" "$(METRICS_SERVER_DIR)/rbac.yaml"; \
	rm -f "$(METRICS_SERVER_DIR)"/.built-metrics-server-*; \
	touch "$@"

# CoreDNS for the real-node test bed with Services (internal/testbed
# services.go: cluster DNS for pods, as a cluster's CoreDNS Deployment
# would serve it), built from the Go module proxy.
COREDNS_VERSION := v1.15.0
COREDNS_DIR     := $(CURDIR)/bin/coredns
COREDNS_STAMP   := $(COREDNS_DIR)/.built-coredns-$(COREDNS_VERSION)

.PHONY: coredns-bin
coredns-bin: $(COREDNS_STAMP) ## Build CoreDNS (COREDNS_VERSION) from the Go module proxy into bin/coredns (cluster DNS of real-node beds and the demo).

$(COREDNS_STAMP):
	@echo ">> building CoreDNS $(COREDNS_VERSION) into $(COREDNS_DIR) (first time: about 2 minutes)"
	@set -euo pipefail; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$(COREDNS_DIR)"; \
	cd "$$tmp"; \
	export GOWORK=off GOFLAGS=-buildvcs=false; \
	GOBIN="$(COREDNS_DIR)" go install -ldflags "-s -w" github.com/coredns/coredns@$(COREDNS_VERSION); \
	rm -f "$(COREDNS_DIR)"/.built-coredns-*; \
	touch "$@"

# Kueue (sigs.k8s.io/kueue) for the test bed's batch queueing
# (Options.Kueue, internal/testbed kueue.go): its controller-manager, built
# static (CGO_ENABLED=0, as upstream's image) with `go install` from the Go
# module proxy, outside this module (not one of our dependencies), and the
# kustomize bases it is deployed from (config/ of the same module: CRDs,
# RBAC, webhook configurations), which the bed renders and applies as
# upstream wrote them. Into bin/kueue, cached by a stamp per version.
KUEUE_VERSION := v0.17.0
KUEUE_DIR     := $(CURDIR)/bin/kueue
KUEUE_STAMP   := $(KUEUE_DIR)/.built-kueue-$(KUEUE_VERSION)

.PHONY: kueue-bin
kueue-bin: $(KUEUE_STAMP) ## Build Kueue's controller-manager (KUEUE_VERSION) from the Go module proxy into bin/kueue, with its config/ (CRDs, RBAC, webhooks).

$(KUEUE_STAMP):
	@echo ">> building Kueue $(KUEUE_VERSION) into $(KUEUE_DIR) (first time: about 8 minutes)"
	@set -euo pipefail; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$(KUEUE_DIR)"; \
	cd "$$tmp"; \
	export GOWORK=off GOFLAGS=-buildvcs=false; \
	CGO_ENABLED=0 GOBIN="$(KUEUE_DIR)" go install -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$(KUEUE_VERSION)" \
		sigs.k8s.io/kueue/cmd/kueue@$(KUEUE_VERSION); \
	GOFLAGS=-mod=mod go mod download -json sigs.k8s.io/kueue@$(KUEUE_VERSION) > download.json; \
	dir=$$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p' download.json); \
	if [ -z "$$dir" ] || [ ! -f "$$dir/config/default/kustomization.yaml" ]; then echo "no config/default in Kueue $(KUEUE_VERSION) ($$dir)" >&2; exit 1; fi; \
	rm -rf "$(KUEUE_DIR)/config"; cp -r "$$dir/config" "$(KUEUE_DIR)/config"; chmod -R u+w "$(KUEUE_DIR)/config"; \
	rm -f "$(KUEUE_DIR)"/.built-kueue-*; \
	touch "$@"

# Liqo's own components for the Liqo test bed (internal/liqobed), at go.mod's
# Liqo version: liqo-controller-manager, virtual-kubelet, crd-replicator,
# webhook and liqoctl, built inside a writable copy of Liqo's module (its
# go.mod has a replace directive, so it is not built as a dependency of ours),
# downloaded with `go mod download` outside this module; helm at the version
# Liqo's go.mod requires (renders Liqo's chart, as `helm template`); and the
# chart itself (deployments/liqo). Into bin/liqo, cached by a stamp per version.
LIQO_VERSION := $(shell go list -m -f '{{.Version}}' github.com/liqotech/liqo)
LIQO_DIR     := $(CURDIR)/bin/liqo
LIQO_STAMP   := $(LIQO_DIR)/.built-liqo-$(LIQO_VERSION)
LIQO_CMDS    := liqo-controller-manager virtual-kubelet crd-replicator webhook liqoctl

.PHONY: liqo-bin
liqo-bin: $(LIQO_STAMP) ## Build Liqo's controller-manager, virtual-kubelet, crd-replicator, webhook, liqoctl (go.mod's version) and helm into bin/liqo (Liqo test bed).

$(LIQO_STAMP):
	@echo ">> building Liqo $(LIQO_VERSION) ($(LIQO_CMDS)) and helm into $(LIQO_DIR) (first time: several minutes)"
	@set -euo pipefail; \
	tmp=$$(mktemp -d); trap 'chmod -R u+w "$$tmp"; rm -rf "$$tmp"' EXIT; \
	(cd "$$tmp" && GOWORK=off GOFLAGS=-mod=mod go mod download -json github.com/liqotech/liqo@$(LIQO_VERSION)) > "$$tmp/download.json"; \
	dir=$$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p' "$$tmp/download.json"); \
	if [ -z "$$dir" ] || [ ! -d "$$dir/cmd/liqo-controller-manager" ]; then echo "no Liqo module at $$dir" >&2; exit 1; fi; \
	cp -r "$$dir" "$$tmp/liqo"; chmod -R u+w "$$tmp/liqo"; \
	mkdir -p "$(LIQO_DIR)"; \
	cd "$$tmp/liqo"; \
	export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"; \
	go build -ldflags "-s -w -X github.com/liqotech/liqo/pkg/liqoctl/version.LiqoctlVersion=$(LIQO_VERSION)" \
		-o "$(LIQO_DIR)/" $(addprefix ./cmd/,$(LIQO_CMDS)); \
	helm=$$(go list -m -f '{{.Version}}' helm.sh/helm/v3); \
	echo ">> building helm $$helm (the version Liqo $(LIQO_VERSION) requires)"; \
	(cd "$$tmp" && GOFLAGS=-buildvcs=false GOBIN="$(LIQO_DIR)" go install -ldflags "-s -w" helm.sh/helm/v3/cmd/helm@$$helm); \
	rm -rf "$(LIQO_DIR)/chart"; cp -r deployments/liqo "$(LIQO_DIR)/chart"; chmod -R u+w "$(LIQO_DIR)/chart"; \
	rm -f "$(LIQO_DIR)"/.built-liqo-*; \
	touch "$@"

# gcc and libc6-dev build internal/clockskew's LD_PRELOAD library (the
# lifetime tests run redis-server with its clock an hour off the agents').
NODE_PACKAGES := containerd runc containernetworking-plugins iproute2 iptables procps util-linux gcc libc6-dev

.PHONY: node-deps
node-deps: ## Install containerd, runc, the CNI plugins, iptables (kube-proxy) and a C compiler (Debian packages; needs root).
	@missing=""; for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo ">> apt-get install$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The test bed's images (internal/testimages): pause (containerd's
# sandbox_image) and testapp, built from test/images/ as tarballs for
# `ctr -n k8s.io images import`. Up-to-date tarballs are not built again.
.PHONY: test-images
test-images: ## Build the test images (pause, testapp) as OCI tarballs into bin/images.
	go run ./hack/testimages --out $(CURDIR)/bin/images

# The release images (hack/images): rb-broker, rb-agent and rb-scheduler, each
# an OCI image index for IMAGE_PLATFORMS, static binaries run as 65532:65532
# with no shell, tagged $(VERSION), written as OCI archives into IMAGES_OUT
# and, with REGISTRY=<registry>/<path>, pushed there (credentials from docker
# or podman login). It prints the `kustomize edit set image` lines that point
# the manifests at them. No Docker, no registry needed to build.
IMAGES_OUT      ?= $(CURDIR)/bin/images
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_REPO      := $(if $(REGISTRY),$(REGISTRY),ghcr.io/fluidos-project)

.PHONY: images
images: ## Build the images of rb-broker, rb-agent, rb-scheduler (linux/amd64, linux/arm64) as OCI archives into bin/images; REGISTRY=ghcr.io/me pushes them, VERSION= sets the tag.
	go run ./hack/images --out $(IMAGES_OUT) --version $(VERSION) --commit $(COMMIT) \
		--repository $(IMAGE_REPO) --platforms $(IMAGE_PLATFORMS) $(if $(REGISTRY),--push)

# cert-manager's real CRDs, for the envtest control plane of the manifests
# test (manifests/manifests_test.go). Taken from deploy/crds/ of cert-manager's
# Go module, fetched (checksum-verified) with `go mod download` outside this
# module, so cert-manager is not a dependency in go.mod.
CERT_MANAGER_VERSION ?= v1.21.2
CERT_MANAGER_CRDS    := $(CURDIR)/bin/crds/cert-manager

.PHONY: cert-manager-crds
cert-manager-crds: $(CERT_MANAGER_CRDS)/cert-manager-$(CERT_MANAGER_VERSION).stamp ## Copy cert-manager's CRDs (CERT_MANAGER_VERSION) from its Go module into bin/crds/cert-manager.

$(CERT_MANAGER_CRDS)/cert-manager-$(CERT_MANAGER_VERSION).stamp:
	@echo ">> cert-manager $(CERT_MANAGER_VERSION) CRDs from its Go module into $(CERT_MANAGER_CRDS)"
	@set -euo pipefail; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	(cd "$$tmp" && GOWORK=off go mod download -json github.com/cert-manager/cert-manager@$(CERT_MANAGER_VERSION)) > "$$tmp/download.json"; \
	dir=$$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p' "$$tmp/download.json"); \
	if [ -z "$$dir" ] || ! ls "$$dir"/deploy/crds/*.yaml >/dev/null 2>&1; then \
		echo "no deploy/crds/*.yaml in cert-manager $(CERT_MANAGER_VERSION) ($$dir)" >&2; exit 1; \
	fi; \
	rm -rf "$(CERT_MANAGER_CRDS)"; \
	mkdir -p "$(CERT_MANAGER_CRDS)"; \
	install -m 0644 "$$dir"/deploy/crds/*.yaml "$(CERT_MANAGER_CRDS)/"; \
	touch "$@"

# The web dashboard (broker/dashboard): rb-dashboard is built with the other
# binaries, and its browser tests (TestDashboard*, part of `make test`) need
# Debian's Chromium: without it they fail, they are not skipped.
build: bin/rb-dashboard
test: check-chromium

.PHONY: check-chromium
check-chromium:
	@command -v chromium >/dev/null || [ -n "$$RB_CHROMIUM" ] || { echo "chromium not found: apt-get install -y chromium (the dashboard's browser tests, TestDashboard*, drive it; or set RB_CHROMIUM)" >&2; exit 1; }
