package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReservationIDAnnotation, on a tenant pod at the provider (the copy the
// requester's bridge mirrors), names the broker reservation the pod consumes.
// The provider's agent lists those ids in its advertisement
// (AdvertisementSpec.ReservationsOnNodes): their pods are in its nodes'
// figures, so the broker stops debiting their nodes itself.
const ReservationIDAnnotation = "broker.fluidos.eu/reservation-id"

// Prices are a cluster's hourly rates.
type Prices struct {
	// Currency as an ISO 4217 code.
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Z]{3}$`
	Currency string `json:"currency,omitempty"`
	// CPU is the price of one core for one hour.
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`
	// Memory is the price of one GiB for one hour.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// GPU is the price of one GPU for one hour.
	// +optional
	GPU *resource.Quantity `json:"gpu,omitempty"`
}

// AdvertisementSpec is what this cluster publishes to the broker.
type AdvertisementSpec struct {
	// ClusterID is this cluster's identity at the broker.
	ClusterID string `json:"clusterID"`
	// Endpoint is the API server URL providers publish.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// Labels advertised (region, zone, GPU model).
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Capacity of the Ready, schedulable nodes.
	Capacity corev1.ResourceList `json:"capacity"`
	// Allocatable of those nodes.
	Allocatable corev1.ResourceList `json:"allocatable"`
	// Allocated: effective requests of local pods (pods on reservations excluded).
	Allocated corev1.ResourceList `json:"allocated"`
	// Prices of this cluster.
	// +optional
	Prices *Prices `json:"prices,omitempty"`
	// Nodes are the nodes published for per-node fit: a bounded summary,
	// exact for the largest nodes (the most free of each resource, and the
	// nodes no other node matches or beats in every resource), in name
	// order. The broker grants a reservation only if one of them holds it.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	Nodes []NodeResources `json:"nodes,omitempty"`
	// ReservationsOnNodes are the broker reservations whose pods are bound to
	// this cluster's nodes (tenant pods with the reservation-id annotation):
	// their requests are in the nodes' allocated.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=253
	ReservationsOnNodes []string `json:"reservationsOnNodes,omitempty"`
}

// NodeResources is one published node: what it offers and what the pods
// bound to it request, the pods of reservations included (capped at
// allocatable).
// +kubebuilder:validation:XValidation:rule="!has(self.allocated.cpu) || quantity(self.allocated.cpu).compareTo(has(self.allocatable.cpu) ? quantity(self.allocatable.cpu) : quantity('0')) <= 0",message="allocated cpu must not exceed allocatable"
// +kubebuilder:validation:XValidation:rule="!has(self.allocated.memory) || quantity(self.allocated.memory).compareTo(has(self.allocatable.memory) ? quantity(self.allocatable.memory) : quantity('0')) <= 0",message="allocated memory must not exceed allocatable"
// +kubebuilder:validation:XValidation:rule="!has(self.allocated.nvidia__dot__com__slash__gpu) || quantity(self.allocated.nvidia__dot__com__slash__gpu).compareTo(has(self.allocatable.nvidia__dot__com__slash__gpu) ? quantity(self.allocatable.nvidia__dot__com__slash__gpu) : quantity('0')) <= 0",message="allocated nvidia.com/gpu must not exceed allocatable"
// +kubebuilder:validation:XValidation:rule="!has(self.allocated.ephemeral__dash__storage) || quantity(self.allocated.ephemeral__dash__storage).compareTo(has(self.allocatable.ephemeral__dash__storage) ? quantity(self.allocatable.ephemeral__dash__storage) : quantity('0')) <= 0",message="allocated ephemeral-storage must not exceed allocatable"
type NodeResources struct {
	// Name of the node.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
	// Allocatable of the node.
	Allocatable NodeAmounts `json:"allocatable"`
	// Allocated: effective requests of the pods bound to the node.
	Allocated NodeAmounts `json:"allocated"`
}

// NodeAmounts are a node's amounts of the resources the broker accounts,
// keyed as in a ResourceList; quantities that are not negative. Not a
// ResourceList: its values cannot be bounded in length, and unbounded
// quantities in a list of 100 nodes exceed the API server's CEL cost budget
// (Type=string lets MaxLength apply; a Quantity is always written as a string).
type NodeAmounts struct {
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`
	CPU *resource.Quantity `json:"cpu,omitempty"`
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`
	Memory *resource.Quantity `json:"memory,omitempty"`
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`
	GPU *resource.Quantity `json:"nvidia.com/gpu,omitempty"`
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`
	EphemeralStorage *resource.Quantity `json:"ephemeral-storage,omitempty"`
}

// AdvertisementStatus is the broker's acknowledgement.
type AdvertisementStatus struct {
	// LastPublished is when the broker last accepted this advertisement.
	// +optional
	LastPublished *metav1.Time `json:"lastPublished,omitempty"`
	// Reserved is what the broker holds on this cluster for others.
	// +optional
	Reserved corev1.ResourceList `json:"reserved,omitempty"`
	// Available is what the broker can still reserve here.
	// +optional
	Available corev1.ResourceList `json:"available,omitempty"`
	// ConsecutiveFailures counts publish attempts failed since the last success.
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`
	// Conditions: Published.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Advertisement shows what this cluster last published to the broker and the
// broker's acknowledgement. The agent keeps one, named after the cluster id.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=adv,categories=broker
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterID`
// +kubebuilder:printcolumn:name="CPU",type=string,JSONPath=`.spec.allocatable.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.allocatable.memory`
// +kubebuilder:printcolumn:name="Published",type=string,JSONPath=`.status.conditions[?(@.type=="Published")].status`
// +kubebuilder:printcolumn:name="Last-Published",type=date,JSONPath=`.status.lastPublished`
type Advertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AdvertisementSpec   `json:"spec"`
	Status AdvertisementStatus `json:"status,omitempty"`
}

// AdvertisementList is a list of Advertisements.
// +kubebuilder:object:root=true
type AdvertisementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Advertisement `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Advertisement{}, &AdvertisementList{})
}
