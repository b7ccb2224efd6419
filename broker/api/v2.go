package api

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Error is the body of every error answer.
type Error struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
	// Rejected counts, for a NoCapacity answer, the clusters excluded by reason
	// (stale, requester, selector, insufficient_cpu, insufficient_mem, ...).
	Rejected map[string]int64 `json:"rejected,omitempty"`
}

// Error reasons.
const (
	ReasonBadRequest  = "BadRequest"
	ReasonTooLarge    = "RequestTooLarge"
	ReasonForbidden   = "Forbidden"
	ReasonNotFound    = "NotFound"
	ReasonNoCapacity  = "NoCapacity"
	ReasonConflict    = "Conflict"
	ReasonUnavailable = "Unavailable"
	ReasonInternal    = "Internal"
	// ReasonBusy (503, with Retry-After): the broker replica has more
	// advertisements waiting than it can store in time; nothing was stored.
	ReasonBusy = "Busy"
	// ReasonTooManyRequests (429, with Retry-After): the caller is over a
	// limit of the broker's, such as its open event streams.
	ReasonTooManyRequests = "TooManyRequests"
)

// ClusterResources are the amounts a cluster advertises. Reserved and
// Available are computed by the broker; values sent by a client are ignored.
type ClusterResources struct {
	Capacity    Quantities  `json:"capacity"`
	Allocatable Quantities  `json:"allocatable"`
	Allocated   Quantities  `json:"allocated"`
	Reserved    *Quantities `json:"reserved,omitempty"`
	Available   *Quantities `json:"available,omitempty"`
	// Nodes are the nodes a reservation may be placed on, at most MaxNodes
	// (an agent sends a bounded summary: the largest nodes by each
	// resource); a reservation then fits only if one of them holds it whole.
	// None: the cluster is judged on its totals alone (v1, older agents).
	Nodes []NodeResources `json:"nodes,omitempty"`
	// ReservationsOnNodes are the reservations whose pods are bound to
	// this cluster's nodes, each as "<requester>/<id>" (ids are scoped per
	// requester; tenant pods carry the id in the annotation
	// broker.fluidos.eu/reservation-id, their namespace tells the
	// requester): the nodes' allocated include them, so the broker stops
	// debiting those reservations' nodes itself. At most
	// MaxReservationsOnNodes.
	ReservationsOnNodes []string `json:"reservationsOnNodes,omitempty"`
}

// NodeResources is one advertised node. Allocated counts every pod bound
// to it, the pods of reservations included. Reserved (the broker's debit:
// reservations placed on the node and not yet listed in
// ReservationsOnNodes) and Available are the broker's; ignored on input.
type NodeResources struct {
	Name        string      `json:"name"`
	Allocatable Quantities  `json:"allocatable"`
	Allocated   Quantities  `json:"allocated"`
	Reserved    *Quantities `json:"reserved,omitempty"`
	Available   *Quantities `json:"available,omitempty"`
}

// Bounds of an advertisement's node summary.
const (
	MaxNodes               = 100
	MaxReservationsOnNodes = 1000
)

// Prices are hourly rates, as decimal quantities ("0.031") in Currency.
type Prices struct {
	Currency string             `json:"currency,omitempty"`
	CPU      *resource.Quantity `json:"cpu,omitempty"`    // per core-hour
	Memory   *resource.Quantity `json:"memory,omitempty"` // per GiB-hour
	GPU      *resource.Quantity `json:"gpu,omitempty"`    // per GPU-hour
}

// Advertisement is the body of PUT /api/v2/clusters/{id}/advertisement.
type Advertisement struct {
	ClusterName string            `json:"clusterName,omitempty"`
	Endpoint    string            `json:"endpoint,omitempty"` // the API server URL providers publish
	Labels      map[string]string `json:"labels,omitempty"`
	Resources   ClusterResources  `json:"resources"`
	Prices      *Prices           `json:"prices,omitempty"`
}

// ToStore validates and converts the advertisement.
func (a Advertisement) ToStore() (model.Advertisement, error) {
	out := model.Advertisement{Name: a.ClusterName, Endpoint: a.Endpoint, Labels: a.Labels}
	if err := validateText("clusterName", a.ClusterName, 253); err != nil {
		return out, err
	}
	if err := validateEndpoint("endpoint", a.Endpoint); err != nil {
		return out, err
	}
	if err := validateLabels("labels", a.Labels); err != nil {
		return out, err
	}
	var err error
	if out.Capacity, err = a.Resources.Capacity.ToResources("resources.capacity"); err != nil {
		return out, invalid("%v", err)
	}
	if out.Allocatable, err = a.Resources.Allocatable.ToResources("resources.allocatable"); err != nil {
		return out, invalid("%v", err)
	}
	if out.Allocated, err = a.Resources.Allocated.ToResources("resources.allocated"); err != nil {
		return out, invalid("%v", err)
	}
	if a.Prices != nil {
		if out.Prices, err = a.Prices.toStore(); err != nil {
			return out, err
		}
	}
	if out.Nodes, err = nodesToStore(a.Resources.Nodes); err != nil {
		return out, err
	}
	if len(a.Resources.ReservationsOnNodes) > MaxReservationsOnNodes {
		return out, invalid("resources.reservationsOnNodes: %d ids, at most %d", len(a.Resources.ReservationsOnNodes), MaxReservationsOnNodes)
	}
	for i, qid := range a.Resources.ReservationsOnNodes {
		if err := ValidateQualifiedReservationID(qid); err != nil {
			return out, invalid("resources.reservationsOnNodes[%d]: %v", i, err)
		}
	}
	out.ReservationsOnNodes = a.Resources.ReservationsOnNodes
	return out, nil
}

func orZero(q *resource.Quantity) *resource.Quantity {
	if q == nil {
		return resource.NewQuantity(0, resource.DecimalSI)
	}
	return q
}

// nodesToStore validates and converts the advertised nodes: a bounded count,
// unique DNS subdomain names, amounts that are not negative, and allocated
// within allocatable (an agent clamps a node its pods overrun: free is zero
// either way).
func nodesToStore(nodes []NodeResources) ([]model.NodeCapacity, error) {
	if len(nodes) > MaxNodes {
		return nil, invalid("resources.nodes: %d nodes, at most %d (send the largest)", len(nodes), MaxNodes)
	}
	out := make([]model.NodeCapacity, 0, len(nodes))
	seen := make(map[string]bool, len(nodes))
	for i, n := range nodes {
		field := fmt.Sprintf("resources.nodes[%d]", i)
		if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
			return nil, invalid("%s.name %q: %s", field, n.Name, strings.Join(errs, "; "))
		}
		if seen[n.Name] {
			return nil, invalid("%s.name %q: listed twice", field, n.Name)
		}
		seen[n.Name] = true
		alloc, err := n.Allocatable.ToResources(field + ".allocatable")
		if err != nil {
			return nil, invalid("%v", err)
		}
		used, err := n.Allocated.ToResources(field + ".allocated")
		if err != nil {
			return nil, invalid("%v", err)
		}
		u, a := FromResources(used), FromResources(alloc)
		for _, r := range []struct {
			name        string
			used, alloc int64
			show        func(Quantities) *resource.Quantity
		}{
			{"cpu", used.CPU, alloc.CPU, func(q Quantities) *resource.Quantity { return q.CPU }},
			{"memory", used.Memory, alloc.Memory, func(q Quantities) *resource.Quantity { return q.Memory }},
			{"gpu", used.GPU, alloc.GPU, func(q Quantities) *resource.Quantity { return q.GPU }},
			{"storage", used.Storage, alloc.Storage, func(q Quantities) *resource.Quantity { return q.Storage }},
		} {
			if r.used > r.alloc {
				return nil, invalid("%s (%s): allocated %s %v exceeds allocatable %v (send allocated capped at allocatable)",
					field, n.Name, r.name, r.show(u), orZero(r.show(a)))
			}
		}
		out = append(out, model.NodeCapacity{Name: n.Name, Allocatable: alloc, Allocated: used})
	}
	return out, nil
}

// MarshalJSON writes prices as plain decimals ("0.03", not the quantity
// canonical form "30m"), which is how people read money.
func (p Prices) MarshalJSON() ([]byte, error) {
	decimal := func(q *resource.Quantity) string {
		if q == nil {
			return ""
		}
		return strconv.FormatFloat(float64(q.ScaledValue(resource.Micro))/1e6, 'f', -1, 64)
	}
	return json.Marshal(struct {
		Currency string `json:"currency,omitempty"`
		CPU      string `json:"cpu,omitempty"`
		Memory   string `json:"memory,omitempty"`
		GPU      string `json:"gpu,omitempty"`
	}{p.Currency, decimal(p.CPU), decimal(p.Memory), decimal(p.GPU)})
}

// maxPrice is the highest hourly rate an advertisement may set.
var maxPrice = resource.NewQuantity(1<<32, resource.DecimalSI)

func (p Prices) toStore() (model.Prices, error) {
	out := model.Prices{Currency: p.Currency}
	if p.Currency != "" && !model.IsCurrencyCode(p.Currency) {
		return out, invalid("prices.currency: %q is not an ISO 4217 code such as EUR", p.Currency)
	}
	for _, f := range []struct {
		name string
		q    *resource.Quantity
		dst  *int64
	}{{"cpu", p.CPU, &out.CPU}, {"memory", p.Memory, &out.Memory}, {"gpu", p.GPU, &out.GPU}} {
		if f.q == nil {
			continue
		}
		if f.q.Sign() < 0 {
			return out, invalid("prices.%s: must not be negative, got %s", f.name, f.q)
		}
		// 2^32 units are 2^32 * 10^6 micro-units, below model.MaxAmount:
		// the scripts hold every price exactly.
		if f.q.Cmp(*maxPrice) > 0 {
			return out, invalid("prices.%s: %s is above the highest price the broker takes (%s)", f.name, f.q, maxPrice)
		}
		*f.dst = f.q.ScaledValue(resource.Micro)
	}
	return out, nil
}

// Cluster is a stored advertisement as the broker sees it.
type Cluster struct {
	ClusterID   string            `json:"clusterID"`
	ClusterName string            `json:"clusterName,omitempty"`
	Endpoint    string            `json:"endpoint,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Resources   ClusterResources  `json:"resources"`
	Prices      *Prices           `json:"prices,omitempty"`
	SeenAt      time.Time         `json:"seenAt"`
	Live        bool              `json:"live"`
	// Digest names the advertisement stored: heartbeats (PUT
	// .../heartbeat) repeat it by this name while the cluster's figures stay
	// as advertised.
	Digest string `json:"digest,omitempty"`
}

// ClusterFromStore renders a stored cluster; live is judged by the caller.
func ClusterFromStore(c model.Cluster, live bool) Cluster {
	reserved, available := FromResources(c.Reserved), FromResources(c.Free())
	out := Cluster{
		ClusterID: c.ID, ClusterName: c.Name, Endpoint: c.Endpoint, Labels: c.Labels,
		Resources: ClusterResources{
			Capacity:            FromResources(c.Capacity),
			Allocatable:         FromResources(c.Allocatable),
			Allocated:           FromResources(c.Allocated),
			Reserved:            &reserved,
			Available:           &available,
			ReservationsOnNodes: c.ReservationsOnNodes,
		},
		SeenAt: c.SeenAt,
		Live:   live,
		Digest: c.Digest,
	}
	for _, n := range c.StoredNodes() {
		reserved, available := FromResources(n.Reserved), FromResources(n.Free())
		out.Resources.Nodes = append(out.Resources.Nodes, NodeResources{
			Name: n.Name, Allocatable: FromResources(n.Allocatable), Allocated: FromResources(n.Allocated),
			Reserved: &reserved, Available: &available,
		})
	}
	if c.Prices != (model.Prices{}) {
		out.Prices = &Prices{
			Currency: c.Prices.Currency,
			CPU:      resource.NewScaledQuantity(c.Prices.CPU, resource.Micro),
			Memory:   resource.NewScaledQuantity(c.Prices.Memory, resource.Micro),
			GPU:      resource.NewScaledQuantity(c.Prices.GPU, resource.Micro),
		}
	}
	return out
}

// LabelSelector selects providers by their advertised labels.
type LabelSelector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// ReservationRequest is the body of POST /api/v2/reservations.
type ReservationRequest struct {
	ID        string         `json:"id"`
	Resources Quantities     `json:"resources"`
	Duration  string         `json:"duration,omitempty"` // Go duration; the server's default when empty
	Selector  *LabelSelector `json:"selector,omitempty"`
	Owner     string         `json:"owner,omitempty"` // namespace/name of the pod or Reservation object
	Priority  int32          `json:"priority,omitempty"`
	// Lease (a Go duration) makes the reservation a lease: it ends Duration
	// after the decision (the hold time: how long it may wait for its pod)
	// unless its requester renews it (POST /api/v2/renewals), and each
	// renewal makes it end Lease after the renewal, on the broker's clock.
	// Empty: a fixed Duration, never renewed (manual reservations, v1).
	Lease string `json:"lease,omitempty"`
	// Spread places it among the earlier replicas of its spread group
	// (see Spread); nil: none.
	Spread *Spread `json:"spread,omitempty"`
	// Preempt lets it, when it fits nowhere, take the capacity of
	// reservations of lower priority (its pod's preemptionPolicy is
	// PreemptLowerPriority): the fewest, lowest priority first, unless
	// capacity being released would hold it.
	Preempt bool `json:"preempt,omitempty"`
	// Preferences order the providers it is placed on (ordered spillover:
	// "eu-south first, then eu-west, then anything"): at most
	// MaxPreferences terms, tried by weight, highest first; the first with
	// a fitting provider decides among its providers; none fitting, the
	// decision ignores them. None: the requester's defaults of the broker's
	// policy, if any.
	Preferences []Preference `json:"preferences,omitempty"`
	// Cells, on a broker split into cells, is where it is decided: empty,
	// in the requester's cell; CellsAll, in the cell of the best provider of
	// all of them. A broker of one cell decides in it either way.
	Cells string `json:"cells,omitempty"`
}

// CellsAll asks every cell for a reservation (ReservationRequest.Cells).
const CellsAll = "all"

// Preference is one term of a request's preferences: the providers that
// carry MatchLabels (besides the selector's) and, when Clusters is set, are
// listed there. A term has matchLabels, clusters or both.
type Preference struct {
	Weight      int32             `json:"weight"` // 1-100
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	Clusters    []string          `json:"clusters,omitempty"`
}

// Bounds of a request's preferences.
const (
	MaxPreferences        = 8
	MaxPreferenceClusters = 64
)

// PreferencesToStore validates preferences (field names the list in
// errors: "preferences") and converts them.
func PreferencesToStore(field string, prefs []Preference) ([]model.Preference, error) {
	if len(prefs) > MaxPreferences {
		return nil, invalid("%s: %d terms, at most %d", field, len(prefs), MaxPreferences)
	}
	var out []model.Preference
	for i, p := range prefs {
		at := fmt.Sprintf("%s[%d]", field, i)
		if p.Weight < 1 || p.Weight > 100 {
			return nil, invalid("%s.weight: %d, must be 1 to 100", at, p.Weight)
		}
		if len(p.MatchLabels) == 0 && len(p.Clusters) == 0 {
			return nil, invalid("%s: an empty term (give matchLabels, clusters or both)", at)
		}
		if err := validateLabels(at+".matchLabels", p.MatchLabels); err != nil {
			return nil, err
		}
		if len(p.Clusters) > MaxPreferenceClusters {
			return nil, invalid("%s.clusters: %d clusters, at most %d", at, len(p.Clusters), MaxPreferenceClusters)
		}
		for j, id := range p.Clusters {
			if err := model.ValidateClusterID(id); err != nil {
				return nil, invalid("%s.clusters[%d]: %v", at, j, err)
			}
		}
		out = append(out, model.Preference{Weight: p.Weight, Labels: p.MatchLabels, Clusters: p.Clusters})
	}
	return out, nil
}

// ToStore validates the request of requester and converts it.
func (r ReservationRequest) ToStore(requester string, lim Limits) (model.ReserveRequest, error) {
	out := model.ReserveRequest{ID: r.ID, Requester: requester, Owner: r.Owner, Priority: r.Priority}
	if err := ValidateReservationID(r.ID); err != nil {
		return out, err
	}
	if r.Cells != "" && r.Cells != CellsAll {
		return out, invalid("cells: %q: must be empty (the requester's cell) or %q", r.Cells, CellsAll)
	}
	var err error
	if out.Resources, err = requestedResources(r.Resources, "resources"); err != nil {
		return out, err
	}
	if r.Lease != "" {
		if out.Lease, err = lim.lease(r.Lease); err != nil {
			return out, err
		}
	}
	if r.Duration == "" && out.Lease > 0 {
		out.Duration = out.Lease // the hold time is the lease
	} else if out.Duration, err = lim.duration(r.Duration); err != nil {
		return out, err
	}
	if r.Selector != nil {
		if err := validateLabels("selector.matchLabels", r.Selector.MatchLabels); err != nil {
			return out, err
		}
		out.Selector = r.Selector.MatchLabels
	}
	if out.Spread, err = r.Spread.toStore(); err != nil {
		return out, err
	}
	out.Preempt = r.Preempt
	if out.Preferences, err = PreferencesToStore("preferences", r.Preferences); err != nil {
		return out, err
	}
	return out, validateText("owner", r.Owner, 253)
}

// requestedResources converts a request's amounts: cpu and memory are required and positive.
func requestedResources(q Quantities, field string) (model.Resources, error) {
	res, err := q.ToResources(field)
	if err != nil {
		return res, invalid("%v", err)
	}
	if res.CPU <= 0 {
		return res, invalid("%s.cpu: required and must be positive", field)
	}
	if res.Memory <= 0 {
		return res, invalid("%s.memory: required and must be positive", field)
	}
	return res, nil
}

// Candidate is one cluster's score in a decision.
type Candidate struct {
	Cluster       string  `json:"cluster"`
	Score         float64 `json:"score"`
	ResourceScore float64 `json:"resourceScore"`
	CostScore     float64 `json:"costScore"`
	// Price of the whole request per hour, in micro-units of the cluster's
	// currency, saturated at 10^14-1 (what the scripts write exactly).
	Price int64 `json:"pricePerHourMicros"`
}

// Reservation is a reservation as the v2 API shows it.
type Reservation struct {
	ID         string         `json:"id"`
	Requester  string         `json:"requester"`
	Provider   string         `json:"provider"`
	Phase      string         `json:"phase"`
	Resources  Quantities     `json:"resources"`
	Score      float64        `json:"score"`
	Price      int64          `json:"pricePerHourMicros"`
	Owner      string         `json:"owner,omitempty"`
	Priority   int32          `json:"priority,omitempty"`
	Selector   *LabelSelector `json:"selector,omitempty"`
	CreatedAt  time.Time      `json:"createdAt"`
	ExpiresAt  time.Time      `json:"expiresAt"`
	EndedAt    *time.Time     `json:"endedAt,omitempty"`
	Candidates []Candidate    `json:"candidates,omitempty"`
	Grant      *Grant         `json:"grant,omitempty"` // shown to the requester only
	// Node is the provider's node the broker debited for it (empty: the
	// provider advertises no nodes). The provider's scheduler may still
	// place the pod elsewhere; see docs/architecture.md, per-node fit.
	Node string `json:"node,omitempty"`
	// Lease is the lease length (a Go duration) of a renewable reservation;
	// empty for a fixed-duration one.
	Lease string `json:"lease,omitempty"`
	// Group names the gang it was reserved with (POST /api/v2/groups).
	Group string `json:"group,omitempty"`
	// SpreadGroup names the spread group it counts in (ReservationRequest.Spread).
	SpreadGroup string `json:"spreadGroup,omitempty"`
	// PreemptedBy names, once a reservation of higher priority took its
	// capacity (it is Released), that reservation (<requester>/<id>).
	PreemptedBy string `json:"preemptedBy,omitempty"`
	// Preference says how the request's preferences placed it (absent: it
	// had none).
	Preference *PreferenceOutcome `json:"preference,omitempty"`
	// RemainingMs is how long the reservation still lives unless renewed,
	// measured on the broker's clock when the answer was made (0 once
	// ended). Agents act on it, never on ExpiresAt, which is for people:
	// their clocks need not agree with the broker's.
	RemainingMs int64 `json:"remainingMs"`
}

// PreferenceOutcome says which preference term placed a reservation: Term
// (its index in the request as given, 0-based) and its Weight; or
// NoneFitting, when no term had a fitting provider and the decision ignored
// them. Tried lists the terms tried, by index, in the order tried.
type PreferenceOutcome struct {
	Term        *int  `json:"term,omitempty"`
	Weight      int32 `json:"weight,omitempty"`
	NoneFitting bool  `json:"noneFitting,omitempty"`
	Tried       []int `json:"tried"`
}

// ReservationFromStore renders a stored reservation; withGrant shows the
// provider's grant (only its requester may see it).
func ReservationFromStore(r model.Reservation, withGrant bool) Reservation {
	out := Reservation{
		ID: r.ID, Requester: r.Requester, Provider: r.Target, Phase: r.Phase,
		Resources: FromResources(r.Resources), Score: r.Score, Price: r.Price,
		Owner: r.Owner, Priority: r.Priority, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Node: r.Node,
		Group: r.Group, SpreadGroup: r.Spread, PreemptedBy: r.PreemptedBy, RemainingMs: r.Remaining.Milliseconds(),
	}
	if r.Lease > 0 {
		out.Lease = r.Lease.String()
	}
	if len(r.Selector) > 0 {
		out.Selector = &LabelSelector{MatchLabels: r.Selector}
	}
	if !r.EndedAt.IsZero() {
		t := r.EndedAt
		out.EndedAt = &t
	}
	if p := r.Preference; p != nil {
		out.Preference = &PreferenceOutcome{Weight: p.Weight, Tried: p.Tried, NoneFitting: p.Term < 0}
		if p.Term >= 0 {
			term := p.Term
			out.Preference.Term = &term
		}
	}
	for _, c := range r.Candidates {
		out.Candidates = append(out.Candidates, Candidate(c))
	}
	if withGrant && len(r.Grant) > 0 {
		var g Grant
		if json.Unmarshal(r.Grant, &g) == nil {
			out.Grant = &g
		}
	}
	return out
}

// Grant is what a provider hands its requester: access to the tenant namespace
// set aside for it. Body of POST /api/v2/reservations/{id}/grant.
type Grant struct {
	Endpoint  string    `json:"endpoint"`  // provider API server, https://
	CABundle  []byte    `json:"caBundle"`  // PEM, base64 in JSON
	Token     string    `json:"token"`     // bearer token of the tenant ServiceAccount
	Namespace string    `json:"namespace"` // tenant namespace, rb-<requester>
	ExpiresAt time.Time `json:"expiresAt"` // when the token stops working
	// Placement tells the requester how to place the reservation's pod so
	// that it takes the capacity the provider holds for it (nil: the
	// provider holds nothing; place the pod as any other).
	Placement *Placement `json:"placement,omitempty"`
}

// Placement is where and how a provider holds a reservation's capacity: a
// placeholder pod on Node, which a pod of PriorityClassName pinned to Node
// preempts (docs/architecture.md, provider-side hold).
type Placement struct {
	Node              string `json:"node"`
	PriorityClassName string `json:"priorityClassName"`
}

// Validate checks a grant.
func (g Grant) Validate() error {
	if g.Endpoint == "" {
		return invalid("endpoint: required")
	}
	if err := validateEndpoint("endpoint", g.Endpoint); err != nil {
		return err
	}
	if g.Token == "" {
		return invalid("token: required")
	}
	if err := validateText("token", g.Token, 16<<10); err != nil {
		return err
	}
	if err := ValidateClusterID(g.Namespace); err != nil {
		return invalid("namespace: %v", err)
	}
	if g.ExpiresAt.IsZero() {
		return invalid("expiresAt: required")
	}
	return nil
}

// Event is one notification on GET /api/v2/events (the SSE data field).
type Event struct {
	Type        string     `json:"type"` // Reserved, Granted, Released, Expired, CapacityAvailable
	Reservation string     `json:"reservation"`
	Requester   string     `json:"requester"`
	Provider    string     `json:"provider"`
	Phase       string     `json:"phase"`
	Resources   Quantities `json:"resources"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	Node        string     `json:"node,omitempty"` // the provider's node it debits, if any
	// RemainingMs: how long the reservation still lives unless renewed, on
	// the broker's clock when the event was made (see Reservation).
	RemainingMs int64 `json:"remainingMs,omitempty"`
	// PreemptedBy names, in a Preempted event, the reservation of higher
	// priority that took its capacity (<requester>/<id>).
	PreemptedBy string `json:"preemptedBy,omitempty"`
}

// EventPreempted tells a reservation's requester and provider that a
// reservation of higher priority took its capacity (it is Released).
const EventPreempted = "Preempted"

// MaxRenewBatch is the most ids one renewal request may carry.
const MaxRenewBatch = 5000

// RenewRequest is the body of POST /api/v2/renewals: the caller's leases to
// extend, by the ids it chose (ids are scoped per requester).
type RenewRequest struct {
	IDs []string `json:"ids"`
}

// MaxRenewBodyBytes bounds the body of POST /api/v2/renewals: MaxRenewBatch
// ids of the longest kind (a DNS subdomain, 253 characters), quoted and
// separated, and the object around them.
const MaxRenewBodyBytes = MaxRenewBatch*(253+3) + 1024

// Validate checks a renewal: at most MaxRenewBatch ids, each a valid id.
func (r RenewRequest) Validate() error {
	if len(r.IDs) > MaxRenewBatch {
		return invalid("ids: %d ids, at most %d per renewal (split the batch)", len(r.IDs), MaxRenewBatch)
	}
	for i, id := range r.IDs {
		if err := ValidateReservationID(id); err != nil {
			return invalid("ids[%d]: %v", i, err)
		}
	}
	return nil
}

// RenewResponse answers a renewal: every id is either renewed or refused.
// A refused id changed nothing.
type RenewResponse struct {
	Renewed []RenewedLease   `json:"renewed"`
	Refused []RefusedRenewal `json:"refused,omitempty"`
}

// RenewedLease is a lease extended: it lives RemainingMs more (broker clock).
type RenewedLease struct {
	ID          string `json:"id"`
	RemainingMs int64  `json:"remainingMs"`
}

// RefusedRenewal is an id that was not renewed, and why.
type RefusedRenewal struct {
	ID     string `json:"id"`
	Reason string `json:"reason"` // RenewNotFound, RenewEnded, RenewNotALease, RenewRequesterRenews
	Error  string `json:"error"`
}

// Reasons a renewal is refused.
const (
	RenewNotFound  = "NotFound"  // no reservation of the caller has this id
	RenewEnded     = "Ended"     // it was released or expired: too late
	RenewNotALease = "NotALease" // a fixed-duration reservation (v1, or no lease asked)
	// RenewRequesterRenews: a provider renewing for a requester that renews
	// its leases itself (it renewed within a third of a lease): not needed,
	// nothing changed.
	RenewRequesterRenews = "RequesterRenews"
)

// QuietRequest is the body of POST /api/v2/renewals/quiet: the requesters a
// provider would renew leases for (those it still hears whose pods run on
// it), at most MaxQuietRequesters.
type QuietRequest struct {
	Requesters []string `json:"requesters"`
}

// MaxQuietRequesters bounds the requesters of one QuietRequest; its body
// fits MaxRenewBodyBytes.
const MaxQuietRequesters = MaxRenewBatch

// Validate checks a QuietRequest: at most MaxQuietRequesters, each a
// cluster id.
func (q QuietRequest) Validate() error {
	if len(q.Requesters) > MaxQuietRequesters {
		return invalid("requesters: %d requesters, at most %d per call (split them)", len(q.Requesters), MaxQuietRequesters)
	}
	for i, r := range q.Requesters {
		if err := ValidateClusterID(r); err != nil {
			return invalid("requesters[%d]: %v", i, err)
		}
	}
	return nil
}

// QuietResponse answers a QuietRequest: the requesters named that have not
// renewed their own leases within a third of their shortest lease. A
// provider's renewal (POST /api/v2/renewals?requester=) is needed for them
// alone: the others' would be refused RenewRequesterRenews.
type QuietResponse struct {
	Quiet []string `json:"quiet"`
}

// EventCapacityAvailable tells a requester that capacity was freed while one
// of its requests waits (Phase "Waiting", no Provider): retry it now. The
// broker sends it to the first waiting requests, highest priority first.
const EventCapacityAvailable = "CapacityAvailable"

// EventFromStore renders a stored event.
func EventFromStore(e model.Event) Event {
	return Event{Type: e.Type, Reservation: e.Reservation, Requester: e.Requester, Provider: e.Provider,
		Phase: e.Phase, Resources: FromResources(e.Resources), ExpiresAt: e.ExpiresAt, Node: e.Node,
		RemainingMs: e.Remaining.Milliseconds(), PreemptedBy: e.PreemptedBy}
}
