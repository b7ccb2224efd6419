// Package manifests holds the manifests the agent also applies itself, built
// into it so that what it applies and what an operator reads (and applies
// with `kubectl apply -k manifests/agent`) are one file.
package manifests

import _ "embed" // the files below

// TenantPolicy is manifests/agent/tenant-policy.yaml: the ClusterRole
// rb-tenant and the admission policies that hold in tenant namespaces.
//
//go:embed agent/tenant-policy.yaml
var TenantPolicy []byte

// TenantNamespace is manifests/agent/tenant-namespace.yaml: the LimitRange
// and object-count ResourceQuota of every tenant namespace.
//
//go:embed agent/tenant-namespace.yaml
var TenantNamespace []byte
