package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ResourceBrokerArgs are the arguments of the ResourceBroker plugin, after
// defaulting (see the v1 package for the documented, versioned form).
// +kubebuilder:object:root=true
type ResourceBrokerArgs struct {
	metav1.TypeMeta

	// Selector picks the pods of the profile that may be offloaded; nil
	// selects every pod.
	Selector *metav1.LabelSelector
	// ReservationDuration is deprecated and ignored (nil when unset): see
	// the v1 type.
	ReservationDuration *metav1.Duration
	// MaxOutstandingReservationsPerNamespace bounds how many pods of one
	// namespace wait for a reservation at once.
	MaxOutstandingReservationsPerNamespace int32
	// ExcludedNamespaces are never offloaded.
	ExcludedNamespaces []string
	// Namespaces, when not empty, are the only namespaces whose pods may be
	// offloaded.
	Namespaces []string
}
