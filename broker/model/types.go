package model

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Resources is an amount of each resource the broker accounts for, in the
// integer units kept in Redis.
type Resources struct {
	CPU     int64 // millicores
	Memory  int64 // bytes
	GPU     int64 // devices (nvidia.com/gpu)
	Storage int64 // bytes of ephemeral storage
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{CPU: r.CPU + o.CPU, Memory: r.Memory + o.Memory, GPU: r.GPU + o.GPU, Storage: r.Storage + o.Storage}
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	return Resources{CPU: r.CPU - o.CPU, Memory: r.Memory - o.Memory, GPU: r.GPU - o.GPU, Storage: r.Storage - o.Storage}
}

// Prices are a cluster's hourly rates in micro-units of its currency.
type Prices struct {
	CPU      int64 // per core-hour
	Memory   int64 // per GiB-hour
	GPU      int64 // per GPU-hour
	Currency string
}

// Advertisement is what a cluster publishes about itself.
type Advertisement struct {
	Name        string
	Endpoint    string
	Labels      map[string]string
	Capacity    Resources
	Allocatable Resources
	Allocated   Resources // requests of local pods, excluding what runs on reservations
	Prices      Prices
	// Nodes are the nodes a reservation may be placed on (docs/architecture.md,
	// per-node fit); none: the cluster is judged on its totals alone.
	Nodes []NodeCapacity
	// ReservationsOnNodes lists the reservations whose pods run on the
	// cluster's nodes: the nodes' Allocated include them, so the broker
	// stops debiting their nodes itself. Read from the store: those of them
	// the broker acts on (live, placed on one of the cluster's nodes).
	ReservationsOnNodes []string
}

// NodeCapacity is one advertised node.
type NodeCapacity struct {
	Name        string
	Allocatable Resources
	Allocated   Resources // requests of every pod bound to the node, reservations' pods included
}

// Node is a stored node with the broker's debit.
type Node struct {
	NodeCapacity
	// Reserved is the broker's debit: the live reservations placed on this
	// node that the cluster's last advertisement did not list.
	Reserved Resources
}

// Free is what a reservation may still take on the node.
func (n Node) Free() Resources {
	return n.Allocatable.Sub(n.Allocated).Sub(n.Reserved)
}

// Cluster is a stored advertisement with the broker-owned fields.
type Cluster struct {
	ID string
	Advertisement
	Reserved  Resources // capacity locked by live reservations
	SeenAt    time.Time // broker (Redis) clock
	FirstSeen time.Time
	// Live: seen within the stale threshold when read (Redis clock), as
	// reserve.lua judges candidates.
	Live bool
	// NodesReserved are the broker's debits by node (Node.Reserved), for
	// the advertised nodes and any node a live reservation still debits.
	NodesReserved map[string]Resources
	// Digest names the advertisement stored (Ack.Digest).
	Digest string
	// Short holds, for each resource whose reserved amount the cluster's
	// advertisements left above its offer (a node gone NotReady, local pods
	// started), the reserved amount when that was seen (0: not short).
	Short Resources
}

// StoredNodes are the advertised nodes with the broker's debits, by name.
func (c Cluster) StoredNodes() []Node {
	out := make([]Node, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = Node{NodeCapacity: n, Reserved: c.NodesReserved[n.Name]}
	}
	return out
}

// Validate refuses an advertisement that contradicts itself: more allocated
// than allocatable in total, which would show negative free capacity. (A node
// whose own pods overrun it is the provider's business: its node figures are
// taken as they are.)
func (a Advertisement) Validate() error {
	for _, r := range []struct {
		name             string
		allocated, alloc int64
	}{
		{"cpu", a.Allocated.CPU, a.Allocatable.CPU}, {"memory", a.Allocated.Memory, a.Allocatable.Memory},
		{"gpu", a.Allocated.GPU, a.Allocatable.GPU}, {"storage", a.Allocated.Storage, a.Allocatable.Storage},
	} {
		if r.allocated > r.alloc {
			return fmt.Errorf("%w: allocated %s %s exceeds allocatable %s: free capacity cannot be negative",
				ErrInvalid, r.name, Quantity(r.name, r.allocated), Quantity(r.name, r.alloc))
		}
	}
	return nil
}

// Free is what a new reservation may still take: allocatable - allocated - reserved.
func (c Cluster) Free() Resources {
	return Resources{
		CPU:     c.Allocatable.CPU - c.Allocated.CPU - c.Reserved.CPU,
		Memory:  c.Allocatable.Memory - c.Allocated.Memory - c.Reserved.Memory,
		GPU:     c.Allocatable.GPU - c.Allocated.GPU - c.Reserved.GPU,
		Storage: c.Allocatable.Storage - c.Allocated.Storage - c.Reserved.Storage,
	}
}

// DigestLength is the length of an advertisement's digest (Ack.Digest), in
// lowercase hex digits.
const DigestLength = 16

// Ack is the broker's answer to an advertisement.
type Ack struct {
	SeenAt        time.Time
	Reserved      Resources
	NodesReserved map[string]Resources // the broker's debits by node (not on a heartbeat)
	// Digest names the advertisement stored, for the heartbeats that repeat it.
	Digest string
	// Allocatable and Allocated are the stored figures, on a heartbeat only
	// (an advertisement's are those it sent).
	Allocatable, Allocated Resources
}

// ReserveRequest asks for capacity on the best cluster other than the requester.
type ReserveRequest struct {
	ID        string // client-chosen, makes the request idempotent; scoped per requester
	Requester string
	Resources Resources
	// Duration is how long the reservation lives from the decision: a
	// fixed duration, or for a lease its hold time (how long it may wait
	// for its pod before its requester renews it).
	Duration time.Duration
	// Lease, when positive, makes the reservation a lease: each renewal
	// (Store.Renew) makes it end Lease after the renewal. Zero: a fixed
	// Duration, never renewed.
	Lease    time.Duration
	Selector map[string]string // labels the provider must carry
	Owner    string
	Priority int32
	// NoWait keeps a refused request off the priority waiting list (it is
	// still deferred behind waiting requests of higher priority). For v1:
	// seed agents never retry the same id, so its place would only hold
	// others back until it expired.
	NoWait bool
	// Limits are the requester's; Store.Reserve sets them from
	// Config.Policy when it has one, less HeldElsewhere.
	Limits Limits
	// HeldElsewhere is what the requester holds in the federation's other
	// cells (store.Cells sets it), so that its limits hold federation-wide.
	HeldElsewhere Usage
	// Spread, with a topology key or under the broker's share policy, has
	// the request decided among its spread group's replicas
	// (scripts/reserve_group.lua): its provider is chosen by the spread
	// rules and the most free cpu, not by reserve.lua's score, and it does
	// not wait on the priority list (its requester retries it).
	Spread *Spread
	// Preempt lets a request that fits nowhere take the capacity of
	// reservations of lower priority (Store.Preempt; its pod's
	// preemptionPolicy is PreemptLowerPriority).
	Preempt bool
	// Preferences order where the request is placed: the terms are tried
	// by weight, highest first (equal weights in the order given), and the
	// first with a fitting cluster decides among its clusters; none fitting,
	// the decision is the one without preferences (docs/architecture.md,
	// preferences). Store.Reserve sets them from Config.Policy when the
	// request carries none.
	Preferences []Preference
}

// Preference is one term of a request's preferences: the clusters that
// carry Labels (besides the request's selector) and, when Clusters is set,
// are among them. A term has labels, clusters or both.
type Preference struct {
	Weight   int32 // 1-100
	Labels   map[string]string
	Clusters []string
}

// PreferenceOutcome says how a reservation's preferences were used: the
// term whose clusters it was placed among (Term, its index in the request
// as given, and its Weight), or, Term -1, that no term had a fitting
// cluster and the decision ignored them. Tried lists the terms tried, by
// index, in the order tried.
type PreferenceOutcome struct {
	Term   int   `json:"term"`
	Weight int32 `json:"weight,omitempty"`
	Tried  []int `json:"tried"`
}

// Limits are the operator's fair-share limits of one requester
// (broker/policy), enforced by reserve.lua in the same atomic step as the
// decision. A nil limit (and a zero Rate) is no limit.
type Limits struct {
	Reservations *int64 // live reservations
	CPU          *int64 // millicores held by its live reservations
	Memory       *int64 // bytes held by its live reservations
	GPU          *int64 // devices held by its live reservations
	// Priority is the priority ceiling: a request above it is decided,
	// waits and is stored at the ceiling (clamped, not refused).
	Priority *int32
	Rate     float64 // reserve calls per second, replays included; 0: no limit
	Burst    int     // calls allowed at once on top of the rate (at least 1)
}

// Rate bounds how fast a member may call: PerSecond units a second with
// Burst units at once (at least 1). A zero PerSecond is no limit.
type Rate struct {
	PerSecond float64
	Burst     int64
}

// MemberRates are the rates of one member's calls other than reserve
// (broker/policy members), counted by the throttle script before the call
// reaches its own: what keeps one member's loop from slowing the others.
type MemberRates struct {
	Advertisements Rate // PUT advertisement (v1 and v2)
	Renewals       Rate // renewal calls
	RenewedIDs     Rate // ids in those calls
	RenewalBytes   Rate // bytes of their bodies
	Writes         Rate // release, grant and leave (DELETE cluster)
	Protections    Rate // PUT protections
}

// Charge is what one call costs against one rate: Cost units of the rate
// named Kind (the rate key's, e.g. "renewal-ids").
type Charge struct {
	Kind string
	Rate Rate
	Cost int64
}

// Usage is what one requester holds: its live reservations and their sum.
type Usage struct {
	Reservations int64
	Resources    Resources
}

// Candidate is one cluster's score for a decision.
type Candidate struct {
	Cluster       string  `json:"cluster"`
	Score         float64 `json:"score"`
	ResourceScore float64 `json:"resource_score"`
	CostScore     float64 `json:"cost_score"`
	Price         int64   `json:"price"` // micro-units per hour for the whole request
}

// Reservation phases.
const (
	PhaseReserved = "Reserved"
	PhaseActive   = "Active"
	PhaseReleased = "Released"
	PhaseExpired  = "Expired"
)

// QualifiedID is the key of reservation id of requester in Redis: ids are
// scoped per requester (scripts/lib/core.lua).
func QualifiedID(requester, id string) string { return requester + "/" + id }

// SplitQualifiedID splits a qualified id into its requester and id.
func SplitQualifiedID(qid string) (requester, id string, ok bool) {
	return strings.Cut(qid, "/")
}

// Reservation is a stored reservation.
type Reservation struct {
	ID        string // as its requester chose it: unique per requester only
	Requester string
	Target    string
	Phase     string
	Resources Resources
	CreatedAt time.Time
	ExpiresAt time.Time
	EndedAt   time.Time     // zero while live
	Duration  time.Duration // fixed duration, or for a lease its hold time
	Lease     time.Duration // zero: not a lease (never renewed)
	// Remaining is how long it still lives unless renewed, on the Redis
	// clock when it was read (zero once ended): what answers carry instead
	// of comparing ExpiresAt with another clock.
	Remaining  time.Duration
	Score      float64
	Price      int64
	Owner      string
	Priority   int32
	Selector   map[string]string
	Candidates []Candidate
	Grant      json.RawMessage // set by the provider; nil until granted
	// Node is the node of Target the reservation debits; empty when Target
	// advertises no nodes.
	Node string
	// Group names the gang the reservation was decided with (ReserveGroup);
	// empty for a single reservation.
	Group string
	// Spread names the spread group it counts in (ReserveRequest.Spread).
	Spread string
	// PreemptedBy names the reservation that took its capacity
	// (<requester>/<id>, Preempt); empty unless it was preempted.
	PreemptedBy string
	// Preference is how the request's preferences placed it; nil: it had none.
	Preference *PreferenceOutcome
}

// QID is the reservation's qualified id (QualifiedID).
func (r Reservation) QID() string { return QualifiedID(r.Requester, r.ID) }

// Live reports whether the reservation still holds capacity.
func (r Reservation) Live() bool { return r.Phase == PhaseReserved || r.Phase == PhaseActive }

// Decision is the outcome of a successful Reserve.
type Decision struct {
	Reservation Reservation
	Replayed    bool // the id was decided before; this is the first answer again
	// Victims are the reservations it preempted (Preempt).
	Victims []Victim
}

// Event is one notification on a cluster's stream.
type Event struct {
	ID          string // stream id, resumable cursor
	Type        string // Reserved, Granted, Released, Expired
	Reservation string
	Requester   string
	Provider    string
	Phase       string
	Resources   Resources
	ExpiresAt   time.Time
	Remaining   time.Duration // left when the event was made (Redis clock); 0 once ended
	Node        string        // the node the reservation debits, if any
	// PreemptedBy names, in a Preempted event, the reservation that took
	// its capacity (<requester>/<id>).
	PreemptedBy string
}

// RenewOutcome is what a renewal did to one id.
type RenewOutcome string

// Renewal outcomes (scripts/renew.lua).
const (
	Renewed        RenewOutcome = "renewed"
	RenewNotFound  RenewOutcome = "notfound"
	RenewEnded     RenewOutcome = "ended"
	RenewNotALease RenewOutcome = "notalease"
	// RenewByRequester: a provider's renewal not needed, its requester
	// renews its leases itself (store.RenewFor).
	RenewByRequester RenewOutcome = "byrequester"
)

// Renewal is the outcome of renewing one id.
type Renewal struct {
	ID        string
	Outcome   RenewOutcome
	Remaining time.Duration // after the call, when Renewed
}

// Victim is a reservation a preemption ended.
type Victim struct {
	Reservation string    `json:"reservation"`
	Requester   string    `json:"requester"`
	Provider    string    `json:"provider"`
	Node        string    `json:"node"`
	Priority    int32     `json:"priority"`
	CPU         int64     `json:"cpu"`
	Memory      int64     `json:"mem"`
	GPU         int64     `json:"gpu"`
	Storage     int64     `json:"sto"`
	Resources   Resources `json:"-"`
}
