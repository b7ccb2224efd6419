package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
