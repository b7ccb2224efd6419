package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ResourceBrokerArgs are the arguments of the ResourceBroker plugin, given in
// the KubeSchedulerConfiguration's pluginConfig:
//
//	pluginConfig:
//	- name: ResourceBroker
//	  args:
//	    selector:
//	      matchExpressions:
//	      - {key: broker.fluidos.eu/offload, operator: NotIn, values: ["false"]}
//	    maxOutstandingReservationsPerNamespace: 20
//	    excludedNamespaces: [kube-system, monitoring]
//	    namespaces: [batch, render]
//
// kube-scheduler decodes them strictly (an unknown field stops it at
// start-up) and fills the defaults; the plugin validates them when it starts.
// +kubebuilder:object:root=true
type ResourceBrokerArgs struct {
	metav1.TypeMeta `json:",inline"`

	// Selector picks, by their labels, the pods of the profile that may be
	// offloaded (get a broker reservation when no local node has room). Nil
	// (the default) or empty selects every pod.
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// ReservationDuration is deprecated and ignored (a warning is logged
	// when it is set; it must still be between 1s and 24h, so that a
	// configuration valid before stays valid and a broken one still fails).
	// The plugin's reservations are leases: the requester's agent
	// asks for them with its --lease-length and --hold-time and renews them
	// while their pod runs, so a fixed duration no longer applies. The hold
	// time lives next to the renewal interval it is validated against.
	ReservationDuration *metav1.Duration `json:"reservationDuration,omitempty"`

	// MaxOutstandingReservationsPerNamespace bounds how many pods of one
	// namespace wait for a reservation at once: reservations that have not
	// ended (no phase yet, Pending, Reserved or Active) and whose pod is not
	// bound yet, counting those being created (default 50, at least 1). A
	// reservation in use by its bound pod does not count, so a workload of
	// any size is served, this many pods at a time.
	MaxOutstandingReservationsPerNamespace *int32 `json:"maxOutstandingReservationsPerNamespace,omitempty"`

	// ExcludedNamespaces are never offloaded (default kube-system,
	// kube-public, kube-node-lease; an explicit empty list excludes none).
	// Not omitted when empty, so that an explicit [] survives a round trip
	// through kube-scheduler's --write-config-to.
	ExcludedNamespaces []string `json:"excludedNamespaces"`

	// Namespaces, when set, are the only namespaces whose pods may be
	// offloaded (default: every namespace not excluded). A namespace may not
	// be in both lists.
	Namespaces []string `json:"namespaces,omitempty"`
}
