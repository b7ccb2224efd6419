//go:build tools

// Package tools pins the modules whose main packages we build ourselves: the
// test control plane (kube-apiserver, etcd, kubectl), the real nodes (kubelet,
// kube-controller-manager) and libraries that later
// parts of the system import, so that the module graph is settled once.
package tools

import (
	_ "github.com/google/go-containerregistry/pkg/v1/mutate"
	_ "github.com/google/go-containerregistry/pkg/v1/tarball"
	_ "github.com/liqotech/liqo/apis/authentication/v1beta1"
	_ "github.com/liqotech/liqo/apis/core/v1beta1"
	_ "github.com/liqotech/liqo/apis/offloading/v1beta1"
	_ "github.com/virtual-kubelet/virtual-kubelet/node"
	_ "github.com/virtual-kubelet/virtual-kubelet/node/api"
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)
