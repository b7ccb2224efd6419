package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProviderInstructionSpec records capacity this cluster keeps aside for a requester.
type ProviderInstructionSpec struct {
	// ReservationID is the broker's id of the reservation.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ReservationID string `json:"reservationID"`

	// Requester is the cluster id of the requester.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=60
	Requester string `json:"requester"`

	// Resources set aside.
	Resources corev1.ResourceList `json:"resources"`

	// ExpiresAt is when the broker ends the reservation.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`
}

// ProviderInstructionStatus tells whether the capacity is set aside.
type ProviderInstructionStatus struct {
	// Enforced is true once namespace, quota and credentials exist.
	// +optional
	Enforced bool `json:"enforced,omitempty"`

	// TenantNamespace is the namespace set aside for the requester (rb-<requester>).
	// +optional
	TenantNamespace string `json:"tenantNamespace,omitempty"`

	// GrantedAt is when the requester's access was last sent to the broker.
	// +optional
	GrantedAt *metav1.Time `json:"grantedAt,omitempty"`

	// Conditions: Enforced.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProviderInstruction is the provider side of a reservation: this cluster
// keeps capacity aside for a requester cluster.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pi,categories=broker
// +kubebuilder:printcolumn:name="Requester",type=string,JSONPath=`.spec.requester`
// +kubebuilder:printcolumn:name="CPU",type=string,JSONPath=`.spec.resources.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.resources.memory`
// +kubebuilder:printcolumn:name="Enforced",type=boolean,JSONPath=`.status.enforced`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.status.tenantNamespace`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProviderInstruction struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProviderInstructionSpec   `json:"spec"`
	Status ProviderInstructionStatus `json:"status,omitempty"`
}

// ProviderInstructionList is a list of ProviderInstructions.
// +kubebuilder:object:root=true
type ProviderInstructionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderInstruction `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ProviderInstruction{}, &ProviderInstructionList{})
}
