package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReservationPhase is where a reservation stands.
// +kubebuilder:validation:Enum=Pending;Reserved;Active;Released;Failed;Expired
type ReservationPhase string

// Reservation phases.
const (
	// ReservationPending: not yet decided by the broker, or waiting for
	// capacity (condition Reserved=False, reason NoCapacity, with the
	// broker's message): the agent keeps asking.
	ReservationPending ReservationPhase = "Pending"
	// ReservationReserved: capacity locked on a provider.
	ReservationReserved ReservationPhase = "Reserved"
	// ReservationActive: the provider set the capacity aside and granted
	// access (condition Ready=True).
	ReservationActive ReservationPhase = "Active"
	// ReservationReleased: given back (final).
	ReservationReleased ReservationPhase = "Released"
	// ReservationFailed: refused for good (invalid, forbidden, conflict);
	// Reason says why. Final: nothing will happen any more.
	ReservationFailed ReservationPhase = "Failed"
	// ReservationExpired: its duration (or, for a lease, its hold time or
	// last renewal) passed at the broker (final).
	ReservationExpired ReservationPhase = "Expired"
)

// ReservationSpec is what is asked of the broker.
type ReservationSpec struct {
	// Resources to reserve on one provider cluster: cpu and memory are required;
	// nvidia.com/gpu and ephemeral-storage are optional.
	// +kubebuilder:validation:Type=object
	// +kubebuilder:validation:MaxProperties=4
	// +kubebuilder:validation:XValidation:rule="'cpu' in self && 'memory' in self",message="cpu and memory are required"
	// +kubebuilder:validation:XValidation:rule="self.all(k, k in ['cpu', 'memory', 'nvidia.com/gpu', 'ephemeral-storage'])",message="only cpu, memory, nvidia.com/gpu and ephemeral-storage can be reserved"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !quantity(string(self[k])).isLessThan(quantity('0')))",message="quantities must not be negative"
	// +kubebuilder:validation:XValidation:rule="!('cpu' in self) || !('memory' in self) || (quantity(string(self['cpu'])).isGreaterThan(quantity('0')) && quantity(string(self['memory'])).isGreaterThan(quantity('0')))",message="cpu and memory must be positive"
	Resources corev1.ResourceList `json:"resources"`

	// Duration of the reservation at the broker; the broker's default when
	// unset. For a reservation opened for a pod (podName set), a lease, it
	// is the hold time instead: how long the granted capacity waits for the
	// pod to be bound (the agent's --hold-time when unset); from then on
	// the agent renews the lease while the pod runs.
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`

	// ProviderSelector lists labels the provider cluster must advertise.
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	ProviderSelector map[string]string `json:"providerSelector,omitempty"`

	// ProviderPreferences order the providers (ordered spillover: "region
	// eu-south first, then paris, then anything"): tried by weight, highest
	// first, the first term with a fitting provider decides among its
	// providers by the usual score; none fitting, any provider. Set by the
	// scheduler plugin from the pod's preferred node affinity over the
	// provider labels and broker.fluidos.eu/provider. Empty: the broker
	// policy's defaults for this cluster, if any.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	ProviderPreferences []ProviderPreference `json:"providerPreferences,omitempty"`

	// Priority orders waiting reservations: higher first.
	// +optional
	Priority int32 `json:"priority,omitempty"`

	// PodName is the pod this reservation was opened for, in the same namespace
	// (set by the scheduler plugin; empty for a reservation made by hand).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PodName string `json:"podName,omitempty"`

	// Group makes the reservation one member of a gang (the pods of a
	// scheduler-plugins PodGroup, set by the scheduler plugin): the agent
	// asks the broker for the group's members together, all or nothing,
	// once MinMember of them exist in the namespace.
	// +optional
	Group *ReservationGroup `json:"group,omitempty"`

	// Spread places the reservation among the earlier replicas of its
	// spread group at the broker (set by the scheduler plugin from the pod's
	// topologySpreadConstraints over the labels providers advertise).
	// +optional
	Spread *ReservationSpread `json:"spread,omitempty"`

	// PreemptionPolicy is its pod's: PreemptLowerPriority lets the broker,
	// when the reservation fits nowhere, take the capacity of reservations
	// of lower priority; Never (the default) waits.
	// +optional
	// +kubebuilder:validation:Enum=PreemptLowerPriority;Never
	PreemptionPolicy *corev1.PreemptionPolicy `json:"preemptionPolicy,omitempty"`
}

// ProviderPreference is one term of a reservation's provider preferences:
// the providers that advertise MatchLabels and, when Clusters is set, are
// among them.
// +kubebuilder:validation:XValidation:rule="has(self.matchLabels) || has(self.clusters)",message="a preference names matchLabels, clusters or both"
type ProviderPreference struct {
	// Weight orders the terms: higher first.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Weight int32 `json:"weight"`
	// MatchLabels the provider advertises.
	// +optional
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=16
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	// Clusters are provider cluster ids.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Clusters []string `json:"clusters,omitempty"`
}

// ReservationSpread is a topology spread constraint over provider labels.
type ReservationSpread struct {
	// Group names the replicas counted together: <namespace>/<the
	// constraint's label selector>/<topology key>.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Group string `json:"group"`
	// TopologyKey is the provider label whose values are the domains.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	TopologyKey string `json:"topologyKey,omitempty"`
	// MaxSkew is the most a domain may hold beyond the least-used one.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxSkew int32 `json:"maxSkew,omitempty"`
	// WhenUnsatisfiable: DoNotSchedule (a hard rule) or ScheduleAnyway.
	// +optional
	// +kubebuilder:validation:Enum=DoNotSchedule;ScheduleAnyway
	WhenUnsatisfiable string `json:"whenUnsatisfiable,omitempty"`
}

// ReservationGroup names the gang a reservation belongs to.
type ReservationGroup struct {
	// Name of the PodGroup, in the reservation's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// MinMember is how many members must be reserved together.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	MinMember int32 `json:"minMember"`
}

// ReservationStatus mirrors the broker's decision.
type ReservationStatus struct {
	// Phase of the reservation.
	// +optional
	Phase ReservationPhase `json:"phase,omitempty"`

	// ReservationID is the id at the broker (the object's UID).
	// +optional
	ReservationID string `json:"reservationID,omitempty"`

	// Provider is the cluster id of the provider that holds the capacity.
	// +optional
	Provider string `json:"provider,omitempty"`

	// VirtualNode is the node that stands for the provider in this cluster.
	// +optional
	VirtualNode string `json:"virtualNode,omitempty"`

	// Score of the provider in the broker's decision, 0 to 100, as a decimal string.
	// +optional
	Score string `json:"score,omitempty"`

	// PricePerHour is what the reserved resources cost per hour at the
	// provider, at its advertised rates, in its currency, as a decimal
	// string (the broker's pricePerHourMicros over 10^6). It ranks the
	// borrowed pods for scale-in: the dearer the provider, the sooner its
	// pod goes (agent/home).
	// +optional
	PricePerHour string `json:"pricePerHour,omitempty"`

	// Reason is a CamelCase word for the last failure (e.g. NoCapacity, BrokerUnavailable).
	// +optional
	Reason string `json:"reason,omitempty"`

	// Message explains the phase in words (the broker's reason for a refusal).
	// +optional
	Message string `json:"message,omitempty"`

	// ReservedAt is when the broker decided.
	// +optional
	ReservedAt *metav1.Time `json:"reservedAt,omitempty"`

	// ExpiresAt is when the broker releases the capacity unless renewed, in
	// this cluster's clock (the broker's remaining time added to the time it
	// was read). Not updated on each renewal of a lease.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// Lease is the lease length of a reservation renewed while its pod
	// runs; empty for a fixed-duration reservation.
	// +optional
	Lease *metav1.Duration `json:"lease,omitempty"`

	// Placement is how the provider holds the capacity (its grant): the
	// pod's copy is pinned to Node and runs at PriorityClassName there.
	// +optional
	Placement *ReservationPlacement `json:"placement,omitempty"`

	// Attempts counts the requests made to the broker for this reservation.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// ObservedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Reserved (the broker holds capacity; False with the
	// broker's reason while waiting), Ready (True exactly while Active),
	// Synced (False while the broker cannot be reached).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ReservationPlacement is where a provider holds a reservation's capacity.
type ReservationPlacement struct {
	// Node of the provider cluster whose placeholder pod holds the capacity.
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// PriorityClassName the copy runs at, one step above the placeholder.
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName"`
}

// Reservation asks the broker for capacity on another cluster. The scheduler
// plugin creates one, owned by the pod, when the pod fits no local node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rsv;rsvs,categories=broker
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.status.provider`
// +kubebuilder:printcolumn:name="CPU",type=string,JSONPath=`.spec.resources.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.resources.memory`
// +kubebuilder:printcolumn:name="Lease",type=string,JSONPath=`.status.lease`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Reservation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: delete the reservation and create another"
	Spec   ReservationSpec   `json:"spec"`
	Status ReservationStatus `json:"status,omitempty"`
}

// ReservationList is a list of Reservations.
// +kubebuilder:object:root=true
type ReservationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Reservation `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Reservation{}, &ReservationList{})
}
