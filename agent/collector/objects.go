package collector

import (
	liqoconsts "github.com/liqotech/liqo/pkg/consts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	resourcehelper "k8s.io/component-helpers/resource"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// The collector's cache does not keep Nodes, Pods and Namespaces: its
// transforms reduce each object, as it enters the cache, to the few numbers
// and flags the accounting needs (a pod to its effective requests, a node to
// its capacity and whether it counts). A full Pod is several KiB and even an
// empty corev1.Pod is over 1 KiB; a podUsage is about 300 bytes, which keeps
// 30,000 pods in a few MiB. The reduced objects keep name, namespace, UID and
// resource version, so the informer's keys, indexes and resource-version
// bookkeeping work as usual. Nothing reads them through the cache's Get or
// List (which expect the original type); only the collector's event handlers
// see them.

// slimMeta keeps what informers and the accounting need of an object's metadata.
func slimMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

// podUsage is a pod reduced to what it takes from its node.
type podUsage struct {
	metav1.ObjectMeta
	// NodeName is the node the pod is bound to ("" while pending).
	NodeName string
	// Active: bound to a node and not terminal (Succeeded or Failed).
	Active bool
	// Requests are the pod's effective requests (init containers, sidecars,
	// overhead, pod-level resources, resized resources).
	Requests amounts
	// Reservation is the broker reservation the pod consumes, as its
	// reservation-id annotation (or the reservation label the bridge puts on
	// its copies) says; it counts in a tenant namespace only.
	Reservation string
	// Placeholder: the provider's placeholder pod of Reservation, which its
	// tenant pod replaces: the two count once.
	Placeholder bool
}

// nodeCapacity is a node reduced to what it offers.
type nodeCapacity struct {
	metav1.ObjectMeta
	// Counted: Ready, schedulable and not a virtual node.
	Counted bool
	// Virtual: a node that stands for another cluster (ours or Liqo's).
	Virtual               bool
	Capacity, Allocatable amounts
}

// namespaceTenancy is a namespace reduced to whether it is a tenant namespace.
type namespaceTenancy struct {
	metav1.ObjectMeta
	Tenant bool
	// Requester is the cluster the tenant namespace is for ("" unknown): the
	// reservations of its pods are listed as "<requester>/<id>" (ids are
	// scoped per requester).
	Requester string
}

func (p *podUsage) GetObjectKind() schema.ObjectKind         { return schema.EmptyObjectKind }
func (n *nodeCapacity) GetObjectKind() schema.ObjectKind     { return schema.EmptyObjectKind }
func (n *namespaceTenancy) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *podUsage) DeepCopyObject() runtime.Object {
	out := *p
	p.DeepCopyInto(&out.ObjectMeta)
	return &out
}

func (n *nodeCapacity) DeepCopyObject() runtime.Object {
	out := *n
	n.DeepCopyInto(&out.ObjectMeta)
	return &out
}

func (n *namespaceTenancy) DeepCopyObject() runtime.Object {
	out := *n
	n.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// podRequestOptions mirrors how the 1.35 scheduler calls PodRequests.
func (c *Collector) podRequestOptions() resourcehelper.PodResourcesOptions {
	return resourcehelper.PodResourcesOptions{
		// InPlacePodVerticalScaling (GA in 1.35): a resized pod takes the
		// larger of its spec, allocated and actuated resources.
		UseStatusResources: !c.opts.IgnoreStatusResources,
		// PodLevelResources (beta, on by default since 1.34): spec.resources
		// requests replace the sum of the containers' for cpu and memory.
		SkipPodLevelResources: c.opts.IgnorePodLevelResources,
	}
}

// usageOf reduces a pod.
func (c *Collector) usageOf(p *corev1.Pod) *podUsage {
	u := &podUsage{ObjectMeta: slimMeta(&p.ObjectMeta), NodeName: p.Spec.NodeName, Reservation: reservationOf(p),
		Placeholder: p.Labels[rbv1.RoleLabel] == rbv1.RolePlaceholder}
	u.Active = p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
	if u.Active {
		u.Requests = amountsOf(resourcehelper.PodRequests(p, c.podRequestOptions()))
	}
	return u
}

// reservationOf is the reservation id a pod carries: the annotation, or the
// label the requester's bridge puts on the copies it mirrors.
func reservationOf(p *corev1.Pod) string {
	if id := p.Annotations[rbv1.ReservationIDAnnotation]; id != "" {
		return id
	}
	return p.Labels[rbv1.ReservationLabel]
}

// capacityOf reduces a node.
func capacityOf(n *corev1.Node) *nodeCapacity {
	out := &nodeCapacity{
		ObjectMeta:  slimMeta(&n.ObjectMeta),
		Virtual:     IsVirtualNode(n),
		Capacity:    amountsOf(n.Status.Capacity),
		Allocatable: amountsOf(n.Status.Allocatable),
	}
	out.Counted = !out.Virtual && !n.Spec.Unschedulable && isReady(n)
	return out
}

// IsVirtualNode reports whether n stands for another cluster: a virtual node
// of ours (label broker.fluidos.eu/provider) or of Liqo (liqo.io/type=virtual-node).
// Its capacity is not local, and pods bound to it are not local usage.
func IsVirtualNode(n *corev1.Node) bool {
	if _, ok := n.Labels[rbv1.ProviderLabel]; ok {
		return true
	}
	return n.Labels[liqoconsts.TypeLabel] == liqoconsts.TypeNode
}

func isReady(n *corev1.Node) bool {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return n.Status.Conditions[i].Status == corev1.ConditionTrue
		}
	}
	return false
}

// tenancyOf reduces a namespace. Tenant namespaces are ours (label
// broker.fluidos.eu/tenant) and the namespaces Liqo makes for the pods
// other clusters offload here (annotation liqo.io/managed-by-namespace-map):
// in a federation run by the broker those pods run on a reservation (the
// requester's ResourceSlice was made for one), which holds their capacity.
func tenancyOf(ns *corev1.Namespace) *namespaceTenancy {
	requester, tenant := ns.Labels[rbv1.TenantLabel]
	if _, liqo := ns.Annotations[liqoconsts.RemoteNamespaceManagedByAnnotationKey]; liqo {
		// Liqo's cluster ids are the broker's (the liqo bridge peers by them).
		tenant, requester = true, ns.Labels[liqoconsts.RemoteClusterID]
	}
	return &namespaceTenancy{ObjectMeta: slimMeta(&ns.ObjectMeta), Tenant: tenant, Requester: requester}
}

// The transforms leave anything else (tombstones, reduced objects) as it is.

func (c *Collector) transformPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return c.usageOf(p), nil
	}
	return obj, nil
}

func transformNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		return capacityOf(n), nil
	}
	return obj, nil
}

func transformNamespace(obj any) (any, error) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		return tenancyOf(ns), nil
	}
	return obj, nil
}
