package model

import (
	"errors"
	"fmt"
	"time"
)

// GroupMember is one member of a group request: a pod's reservation.
type GroupMember struct {
	ID        string // reservation id, scoped per requester as for Reserve
	Resources Resources
}

// GroupRequest asks for capacity for a gang (the pods of one PodGroup): at
// least MinMember of Members are reserved together, or none.
type GroupRequest struct {
	// Group names the gang, unique per requester (e.g. namespace/podgroup);
	// each member's reservation carries it (Reservation.Group).
	Group     string
	Requester string
	MinMember int
	Members   []GroupMember
	Duration  time.Duration // as ReserveRequest.Duration, for every member
	Lease     time.Duration // as ReserveRequest.Lease
	Selector  map[string]string
	Owner     string
	Priority  int32
	// Spread spreads the members with the earlier replicas of their spread
	// group (nil: none).
	Spread *Spread
	// Limits are the requester's; Store.ReserveGroup sets them from
	// Config.Policy when it has one, less HeldElsewhere.
	Limits Limits
	// HeldElsewhere is what the requester holds in the federation's other
	// cells (store.Cells sets it), so that its limits hold federation-wide.
	HeldElsewhere Usage
}

// Spread places a reservation among the live reservations of its spread
// group (the replicas of one owner, scoped per requester): by the domains
// of an advertised label, as a topologySpreadConstraint over provider
// labels, and by the broker's share policy (Config.MaxOwnerShare).
type Spread struct {
	// Group names the replicas counted together (e.g. the pods matching
	// one constraint: namespace and label selector).
	Group string
	// TopologyKey is the provider label whose values are the domains
	// (e.g. topology.kubernetes.io/zone); empty: the share policy only.
	TopologyKey string
	// MaxSkew is the most a domain may hold beyond the least-used domain.
	MaxSkew int32
	// WhenUnsatisfiable: DoNotSchedule (a hard rule) or ScheduleAnyway (a preference).
	WhenUnsatisfiable string
}

// Spread's WhenUnsatisfiable values (corev1.UnsatisfiableConstraintAction's).
const (
	DoNotSchedule  = "DoNotSchedule"
	ScheduleAnyway = "ScheduleAnyway"
)

func (sp *Spread) validate() error {
	if sp == nil {
		return nil
	}
	switch {
	case sp.Group == "":
		return fmt.Errorf("%w: spread group is empty", ErrInvalidRequest)
	case sp.TopologyKey == "":
		return nil
	case sp.MaxSkew < 1:
		return fmt.Errorf("%w: spread maxSkew must be at least 1", ErrInvalidRequest)
	case sp.WhenUnsatisfiable != DoNotSchedule && sp.WhenUnsatisfiable != ScheduleAnyway:
		return fmt.Errorf("%w: spread whenUnsatisfiable must be %s or %s, not %q", ErrInvalidRequest, DoNotSchedule, ScheduleAnyway, sp.WhenUnsatisfiable)
	}
	return nil
}

// MaxGroupMembers bounds a group request (one Lua call decides it).
const MaxGroupMembers = 1000

// Validate refuses a malformed group request (ErrInvalidRequest).
func (g GroupRequest) Validate() error {
	if err := g.Spread.validate(); err != nil {
		return err
	}
	switch {
	case g.Group == "" && (g.Spread == nil || len(g.Members) != 1):
		return fmt.Errorf("%w: group name is empty", ErrInvalidRequest)
	case g.Requester == "":
		return fmt.Errorf("%w: requester is empty", ErrInvalidRequest)
	case len(g.Members) == 0 || len(g.Members) > MaxGroupMembers:
		return fmt.Errorf("%w: a group has 1 to %d members, not %d", ErrInvalidRequest, MaxGroupMembers, len(g.Members))
	case g.MinMember < 1 || g.MinMember > len(g.Members):
		return fmt.Errorf("%w: minMember %d must be between 1 and the %d members", ErrInvalidRequest, g.MinMember, len(g.Members))
	case g.Duration <= 0:
		return fmt.Errorf("%w: duration must be positive", ErrInvalidRequest)
	case g.Lease < 0:
		return fmt.Errorf("%w: lease must not be negative", ErrInvalidRequest)
	}
	seen := make(map[string]bool, len(g.Members))
	for _, m := range g.Members {
		if m.ID == "" {
			return fmt.Errorf("%w: a member has no reservation id", ErrInvalidRequest)
		}
		if seen[m.ID] {
			return fmt.Errorf("%w: member %s appears twice", ErrInvalidRequest, m.ID)
		}
		seen[m.ID] = true
		r := m.Resources
		if r.CPU < 0 || r.Memory < 0 || r.GPU < 0 || r.Storage < 0 {
			return fmt.Errorf("%w: member %s asks for a negative amount", ErrInvalidRequest, m.ID)
		}
	}
	return nil
}

// ErrInvalidRequest means a request is malformed: the caller must fix it.
var ErrInvalidRequest = errors.New("invalid request")

// GroupDecision is the outcome of a successful ReserveGroup.
type GroupDecision struct {
	// Reservations are the members reserved, in the order of the request
	// (at least MinMember of them).
	Reservations []Reservation
	// Unplaced are the members beyond MinMember that did not fit (no reservation).
	Unplaced []string
	Replayed bool // the group was decided before; this is the first answer again
}
