// Package v1alpha1 holds the CRD types of resource-broker, shared by the
// scheduler plugin (which creates Reservations) and the agent (which
// reconciles all three kinds).
// +kubebuilder:object:generate=true
// +groupName=broker.fluidos.eu
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "broker.fluidos.eu", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
