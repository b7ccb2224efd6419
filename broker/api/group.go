package api

import (
	"github.com/fluidos-project/resource-broker/broker/model"
)

// MaxGroupMembers bounds the members of one group request (within
// MaxBodyBytes: a member is about 150 bytes of JSON).
const MaxGroupMembers = 256

// GroupRequest is the body of POST /api/v2/groups: a gang, reserved all
// or nothing (at least MinMember of Members together, or none).
type GroupRequest struct {
	// Group names the gang, unique per requester (the agent sends
	// <namespace>/<PodGroup name>); each member's reservation carries it.
	Group     string        `json:"group"`
	MinMember int           `json:"minMember"`
	Members   []GroupMember `json:"members"`
	// Duration, Lease, Selector, Owner and Priority are as in
	// ReservationRequest, for every member.
	Duration string         `json:"duration,omitempty"`
	Lease    string         `json:"lease,omitempty"`
	Selector *LabelSelector `json:"selector,omitempty"`
	Owner    string         `json:"owner,omitempty"`
	Priority int32          `json:"priority,omitempty"`
	// Spread spreads the members with the earlier replicas of its group.
	Spread *Spread `json:"spread,omitempty"`
	// Preferences are not taken by groups yet: a group request carrying
	// any is refused (400). The field exists so that the refusal says so
	// rather than calling it an unknown field.
	Preferences []Preference `json:"preferences,omitempty"`
}

// GroupMember is one member of a group request: a reservation id
// (client-chosen, as ReservationRequest.ID) and its resources.
type GroupMember struct {
	ID        string     `json:"id"`
	Resources Quantities `json:"resources"`
}

// Group is the answer to a group request.
type Group struct {
	Group string `json:"group"`
	// Reservations are the members reserved, in the order of the request.
	Reservations []Reservation `json:"reservations"`
	// Unplaced are the members beyond minMember that did not fit: they
	// have no reservation (ask for them alone).
	Unplaced []string `json:"unplaced,omitempty"`
}

// ToStore validates the group request of requester and converts it.
func (g GroupRequest) ToStore(requester string, lim Limits) (model.GroupRequest, error) {
	out := model.GroupRequest{Group: g.Group, Requester: requester, MinMember: g.MinMember, Owner: g.Owner, Priority: g.Priority}
	if g.Group == "" {
		return out, invalid("group: required (names the gang, unique per requester)")
	}
	if len(g.Preferences) > 0 {
		return out, invalid("preferences: groups do not take preferences yet (ask without them, or reserve the members one by one)")
	}
	if err := validateText("group", g.Group, 253); err != nil {
		return out, err
	}
	if len(g.Members) == 0 || len(g.Members) > MaxGroupMembers {
		return out, invalid("members: 1 to %d, not %d", MaxGroupMembers, len(g.Members))
	}
	if g.MinMember < 1 || g.MinMember > len(g.Members) {
		return out, invalid("minMember: %d must be between 1 and the %d members", g.MinMember, len(g.Members))
	}
	seen := make(map[string]bool, len(g.Members))
	for i, m := range g.Members {
		if err := ValidateReservationID(m.ID); err != nil {
			return out, invalid("members[%d]: %v", i, err)
		}
		if seen[m.ID] {
			return out, invalid("members[%d]: id %s appears twice", i, m.ID)
		}
		seen[m.ID] = true
		res, err := requestedResources(m.Resources, "members["+m.ID+"].resources")
		if err != nil {
			return out, err
		}
		out.Members = append(out.Members, model.GroupMember{ID: m.ID, Resources: res})
	}
	var err error
	if g.Lease != "" {
		if out.Lease, err = lim.lease(g.Lease); err != nil {
			return out, err
		}
	}
	if g.Duration == "" && out.Lease > 0 {
		out.Duration = out.Lease
	} else if out.Duration, err = lim.duration(g.Duration); err != nil {
		return out, err
	}
	if g.Selector != nil {
		if err := validateLabels("selector.matchLabels", g.Selector.MatchLabels); err != nil {
			return out, err
		}
		out.Selector = g.Selector.MatchLabels
	}
	if out.Spread, err = g.Spread.toStore(); err != nil {
		return out, err
	}
	return out, validateText("owner", g.Owner, 253)
}

// GroupFromStore renders a group decision; the members' grants are not
// shown (there are none yet at the decision).
func GroupFromStore(group string, d model.GroupDecision) Group {
	out := Group{Group: group, Reservations: make([]Reservation, 0, len(d.Reservations)), Unplaced: d.Unplaced}
	for _, r := range d.Reservations {
		out.Reservations = append(out.Reservations, ReservationFromStore(r, false))
	}
	return out
}

// Spread places a reservation among the live reservations of its spread
// group (the replicas of one owner): a topologySpreadConstraint over the
// labels providers advertise (topologyKey, maxSkew, whenUnsatisfiable), and
// the broker's share policy (rb-broker --max-owner-share). A request with a
// topologyKey, or any when the policy is on, is decided by the spread rules
// (the domain with the fewest replicas first, then the most free cpu), not
// by the score, and does not wait on the priority list.
type Spread struct {
	// Group names the replicas counted together, unique per requester (the
	// plugin sends <namespace>/<the constraint's label selector>).
	Group             string `json:"group"`
	TopologyKey       string `json:"topologyKey,omitempty"`
	MaxSkew           int32  `json:"maxSkew,omitempty"`
	WhenUnsatisfiable string `json:"whenUnsatisfiable,omitempty"` // DoNotSchedule (default) or ScheduleAnyway
}

func (sp *Spread) toStore() (*model.Spread, error) {
	if sp == nil {
		return nil, nil
	}
	if sp.Group == "" {
		return nil, invalid("spread.group: required")
	}
	if err := validateText("spread.group", sp.Group, 512); err != nil {
		return nil, err
	}
	out := &model.Spread{Group: sp.Group, TopologyKey: sp.TopologyKey, MaxSkew: max(sp.MaxSkew, 1), WhenUnsatisfiable: sp.WhenUnsatisfiable}
	if sp.TopologyKey == "" {
		return out, nil
	}
	if err := validateLabels("spread.topologyKey", map[string]string{sp.TopologyKey: ""}); err != nil {
		return nil, err
	}
	switch sp.WhenUnsatisfiable {
	case "":
		out.WhenUnsatisfiable = model.DoNotSchedule
	case model.DoNotSchedule, model.ScheduleAnyway:
	default:
		return nil, invalid("spread.whenUnsatisfiable: %q, not DoNotSchedule or ScheduleAnyway", sp.WhenUnsatisfiable)
	}
	return out, nil
}

// ProtectRequest is the body of PUT /api/v2/protections: the caller's
// reservations (ids as it chose them) whose pods a PodDisruptionBudget
// protects now (no disruption allowed). It replaces the caller's previous
// report, which holds a minute: the broker never preempts those.
type ProtectRequest struct {
	IDs []string `json:"ids"`
}

// Validate checks the ids (at most MaxRenewBatch).
func (p ProtectRequest) Validate() error {
	return RenewRequest(p).Validate()
}

// ProtectResponse answers a protection report.
type ProtectResponse struct {
	Protected int64 `json:"protected"`
}
