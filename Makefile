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
