# resource-broker Makefile. `make help` lists the targets.
SHELL := /usr/bin/env bash

K8S_VERSION  := $(shell go list -m -f '{{.Version}}' k8s.io/kubernetes)
K8S_MINOR    := $(word 2,$(subst ., ,$(K8S_VERSION)))
ENVTEST_DIR  := $(CURDIR)/bin/k8s
VERSION_PKG  := k8s.io/component-base/version
K8S_LDFLAGS  := -s -w -X $(VERSION_PKG).gitVersion=$(K8S_VERSION) -X $(VERSION_PKG).gitMajor=1 -X $(VERSION_PKG).gitMinor=$(K8S_MINOR)
GO_TEST_FLAGS ?= -count=1 -timeout 30m
BINARIES     := rb-broker rbctl

export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)

.PHONY: help
help: ## Show this help.
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: $(addprefix bin/,$(BINARIES)) ## Build every binary of ours into bin/.

bin/%: FORCE
	go build -o $@ ./cmd/$*

.PHONY: FORCE
FORCE:

.PHONY: envtest-bin
envtest-bin: $(ENVTEST_DIR)/kube-apiserver $(ENVTEST_DIR)/etcd $(ENVTEST_DIR)/kubectl ## Build the test control plane (kube-apiserver, etcd, kubectl) from go.mod's versions into bin/k8s.

$(ENVTEST_DIR)/kube-apiserver: go.mod
	@echo ">> building kube-apiserver $(K8S_VERSION) (first time: several minutes)"
	go build -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(ENVTEST_DIR)/kubectl: go.mod
	@echo ">> building kubectl $(K8S_VERSION)"
	go build -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubectl

$(ENVTEST_DIR)/etcd: go.mod
	@echo ">> building etcd $$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
	go build -ldflags "-s -w" -o $@ go.etcd.io/etcd/server/v3

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
