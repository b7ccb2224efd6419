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

	// ExpiresAt is no longer set: it was the broker's end time, which the
	// agent must not compare with its own clock (a lease moves it anyway).
	// The provider learns that a reservation ended from the broker's events
	// and lists (status.conditions Ended).
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// Node is the provider's node the broker debited for the reservation
	// (empty: none); the placeholder pod prefers it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node,omitempty"`
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

	// Held is true while the reservation's placeholder pod is bound to a
	// node (HeldNode): the capacity is held by the provider's scheduler.
	// +optional
	Held bool `json:"held,omitempty"`

	// HeldNode is the node of the placeholder pod (or, once it gave way, of
	// the placement last granted).
	// +optional
	HeldNode string `json:"heldNode,omitempty"`

	// PlacementNode is the node last sent to the requester in the grant's
	// placement (empty: granted without placement).
	// +optional
	PlacementNode string `json:"placementNode,omitempty"`

	// Superseded is true once a tenant pod of the reservation appeared: its
	// placeholder gave way to it (or is not needed) and is never recreated.
	// +optional
	Superseded bool `json:"superseded,omitempty"`

	// EndedAt is when this agent learnt that the reservation ended (its own
	// clock); the tenant pods of the reservation are evicted a grace period
	// later, then the instruction is deleted. Microseconds: the grace may be
	// short.
	// +optional
	EndedAt *metav1.MicroTime `json:"endedAt,omitempty"`

	// Conditions: Enforced, Held, Ended, EvictionHeld.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProviderInstruction is the provider side of a reservation: this cluster
// keeps capacity aside for a requester cluster. One per (requester,
// reservation id), named by provider.InstructionName: ids are scoped per
// requester.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pi,categories=broker
// +kubebuilder:printcolumn:name="Requester",type=string,JSONPath=`.spec.requester`
// +kubebuilder:printcolumn:name="CPU",type=string,JSONPath=`.spec.resources.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.resources.memory`
// +kubebuilder:printcolumn:name="Enforced",type=boolean,JSONPath=`.status.enforced`
// +kubebuilder:printcolumn:name="Held",type=boolean,JSONPath=`.status.held`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.heldNode`
// +kubebuilder:printcolumn:name="Ended",type=string,JSONPath=`.status.conditions[?(@.type=="Ended")].reason`
// +kubebuilder:printcolumn:name="Tenant-Namespace",type=string,JSONPath=`.status.tenantNamespace`
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
