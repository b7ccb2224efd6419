package provider

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/manifests"
)

// The tenant policy and the objects of every tenant namespace are the
// manifests' own files, built in (package manifests): what the agent applies
// is what an operator reads in manifests/agent.

// tenantManifests are tenant-policy.yaml and tenant-namespace.yaml, decoded.
type tenantManifests struct {
	clusterRole *rbacv1.ClusterRole
	admission   []client.Object // ValidatingAdmissionPolicies and their bindings
	limitRange  *corev1.LimitRange
	objectQuota *corev1.ResourceQuota
}

var loadTenantManifests = sync.OnceValues(func() (tenantManifests, error) {
	var m tenantManifests
	policy, err := DecodeManifest(manifests.TenantPolicy)
	if err != nil {
		return m, fmt.Errorf("tenant-policy.yaml: %w", err)
	}
	for _, o := range policy {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			m.clusterRole = o
		default:
			m.admission = append(m.admission, o)
		}
	}
	ns, err := DecodeManifest(manifests.TenantNamespace)
	if err != nil {
		return m, fmt.Errorf("tenant-namespace.yaml: %w", err)
	}
	for _, o := range ns {
		switch o := o.(type) {
		case *corev1.LimitRange:
			m.limitRange = o
		case *corev1.ResourceQuota:
			m.objectQuota = o
		}
	}
	if m.clusterRole == nil || len(m.admission) == 0 || m.limitRange == nil || m.objectQuota == nil {
		return m, errors.New("the built-in tenant manifests lack the ClusterRole, the admission policies, the LimitRange or the ResourceQuota")
	}
	return m, nil
})

// tenant returns the built-in tenant manifests; a test makes sure they decode.
func tenant() tenantManifests {
	m, err := loadTenantManifests()
	if err != nil {
		panic(err)
	}
	return m
}

// DecodeManifest decodes a YAML file of built-in kinds, document by document.
func DecodeManifest(data []byte) ([]client.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []client.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(removeComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		obj.GetObjectKind().SetGroupVersionKind(*gvk)
		co, ok := obj.(client.Object)
		if !ok {
			return nil, fmt.Errorf("%s is not an object", gvk)
		}
		out = append(out, co)
	}
}

// removeComments drops the comment lines of a YAML document.
func removeComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// NewTenantClusterRole is the ClusterRole that tenant RoleBindings grant
// (tenant-policy.yaml).
func NewTenantClusterRole() *rbacv1.ClusterRole { return tenant().clusterRole.DeepCopy() }

// TenantRules are what a requester may do in its tenant namespace: the
// rules of NewTenantClusterRole.
func TenantRules() []rbacv1.PolicyRule { return NewTenantClusterRole().Rules }

// TenantAdmissionPolicy are the admission policies and bindings that hold in
// tenant namespaces (tenant-policy.yaml), which the agent keeps up to date.
func TenantAdmissionPolicy() []client.Object {
	var out []client.Object
	for _, o := range tenant().admission {
		out = append(out, o.DeepCopyObject().(client.Object))
	}
	return out
}

// NewTenantLimitRange is the LimitRange of a tenant namespace
// (tenant-namespace.yaml): the scheduler's defaults for containers that
// request nothing.
func NewTenantLimitRange(ns string) *corev1.LimitRange {
	lr := tenant().limitRange.DeepCopy()
	lr.Namespace = ns
	return lr
}

// NewTenantObjectQuota is the object-count ResourceQuota of a tenant
// namespace (tenant-namespace.yaml).
func NewTenantObjectQuota(ns string) *corev1.ResourceQuota {
	q := tenant().objectQuota.DeepCopy()
	q.Namespace = ns
	return q
}
