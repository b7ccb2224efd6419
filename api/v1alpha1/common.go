package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Labels and annotations shared by the parts of the system.
const (
	// ProviderLabel marks a virtual node that stands for a provider cluster; its value is the provider's cluster id.
	ProviderLabel = "broker.fluidos.eu/provider"
	// VirtualNodeTaint is the taint key of our virtual nodes (effect NoSchedule); the scheduler plugin admits reserved pods past it.
	VirtualNodeTaint = "broker.fluidos.eu/virtual-node"
	// PodLabel, on a Reservation, names the pod it was opened for.
	PodLabel = "broker.fluidos.eu/pod"
	// RequesterLabel, on provider-side objects, names the requester cluster.
	RequesterLabel = "broker.fluidos.eu/requester"
	// ReservationLabel, on provider-side objects, names the broker reservation id.
	ReservationLabel = "broker.fluidos.eu/reservation"
	// BridgeLabel, advertised by a requester whose bridge cannot pin its pods
	// to a provider's held node (value "liqo": Liqo places offloaded pods
	// itself), tells providers not to hold its reservations with placeholders.
	BridgeLabel = "broker.fluidos.eu/bridge"
	// ManagedByLabel marks objects the agent manages.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedByValue is ManagedByLabel's value on our objects.
	ManagedByValue = "rb-agent"
	// TenantLabel marks a namespace a provider set aside for a requester; its value is the requester's cluster id.
	// Pods there run on reservations: the collector does not count them as local usage.
	TenantLabel = "broker.fluidos.eu/tenant"
	// TenantNamespacePrefix prefixes the namespace a provider sets aside for a requester: rb-<requester>.
	TenantNamespacePrefix = "rb-"
	// RequesterHeartbeatLease is the coordination.k8s.io Lease the
	// requester's bridge renews in its tenant namespace at each provider:
	// while the provider sees it renewed, the requester is alive whatever
	// the broker says, and the provider renews its leases for it.
	RequesterHeartbeatLease = "rb-requester"
	// RoleLabel, on pods in a tenant namespace that the provider's agent
	// creates, tells what they are for (RolePlaceholder).
	RoleLabel = "broker.fluidos.eu/role"
	// RolePlaceholder is RoleLabel's value on the pod that holds a
	// reservation's capacity until its tenant pod comes.
	RolePlaceholder = "placeholder"
	// PlaceholderPriorityClass is the PriorityClass of placeholder pods:
	// above ordinary workloads, preemptionPolicy Never (it takes free
	// capacity only; see agent/README.md, provider-side hold).
	PlaceholderPriorityClass = "rb-placeholder"
	// TenantPriorityClass is the PriorityClass of tenant pods pinned to
	// their placeholder's node: one above PlaceholderPriorityClass, so that
	// they preempt their placeholder; usable in tenant namespaces only.
	TenantPriorityClass = "rb-tenant"
	// ReleaseFinalizer holds a Reservation until the agent has released it at the broker.
	ReleaseFinalizer = "broker.fluidos.eu/release"
)

// Condition types.
const (
	// ConditionReserved is True while the broker holds capacity for the reservation.
	ConditionReserved = "Reserved"
	// ConditionSynced is False while the agent cannot reach the broker about this object.
	ConditionSynced = "Synced"
	// ConditionEnforced is True when a provider has set aside namespace, quota and credentials.
	ConditionEnforced = "Enforced"
	// ConditionReady is True while the reservation can be used: reserved at
	// the broker and granted by its provider (phase Active), so that
	// kubectl wait --for=condition=Ready works.
	ConditionReady = "Ready"
	// ConditionHeld is True while a ProviderInstruction's placeholder pod is
	// bound to a node.
	ConditionHeld = "Held"
	// ConditionEnded is True once the broker says a provided reservation
	// ended (reason LeaseLapsed for an expiry, Released for a release).
	ConditionEnded = "Ended"
	// ConditionEvictionHeld is True while the eviction of an ended
	// ProviderInstruction's pods waits: its requester is still heard, or
	// many leases lapsed at once (reason RequesterHeard or MassExpiry).
	ConditionEvictionHeld = "EvictionHeld"
	// ConditionPublished is True when the broker acknowledged the last advertisement.
	ConditionPublished = "Published"
)

// ResourceGPU is the extended resource by which the broker accounts GPUs:
// requests of it are reserved, advertised and quota'd like cpu and memory.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"
