package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fluidos-project/resource-broker/broker/scripts"
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
	// Config.Policy when it has one.
	Limits Limits
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

// GroupNoFitError says that fewer than MinMember members fit together:
// nothing was reserved.
type GroupNoFitError struct {
	Members, MinMember int
	// Placeable is how many members the providers could hold together.
	Placeable int
	// Rejected counts the live providers excluded, by reason.
	Rejected map[string]int64
}

func (e *GroupNoFitError) Error() string {
	return fmt.Sprintf("group does not fit: room for %d of the %d members together, %d needed (%s)",
		e.Placeable, e.Members, e.MinMember, (&NoFitError{Rejected: e.Rejected}).Error())
}

// ReserveGroup reserves at least MinMember of a group's members, in one
// atomic step (scripts/reserve_group.lua), or nothing: it returns the
// decision, a *GroupNoFitError, ErrConflict (a member id is taken by another
// group or for other amounts), a *LimitError or ErrInvalidRequest.
func (s *Store) ReserveGroup(ctx context.Context, req GroupRequest) (GroupDecision, error) {
	if err := req.Validate(); err != nil {
		return GroupDecision{}, err
	}
	if s.cfg.Policy != nil {
		req.Limits = s.cfg.Policy.Limits(req.Requester)
	}
	selector, err := selectorArg(req.Selector)
	if err != nil {
		return GroupDecision{}, err
	}
	lim := req.Limits.args()
	args := make([]any, 0, 24+5*len(req.Members))
	args = append(args, s.cfg.StaleThreshold.Milliseconds(), s.cfg.EventsMaxLen, s.cfg.AuditMaxLen,
		s.cfg.EventsTTL.Milliseconds(), req.Group, req.Requester, selector, req.Owner, req.Priority,
		req.Duration.Milliseconds(), req.Lease.Milliseconds(), req.MinMember)
	args = append(args, lim[:5]...) // live reservations, cpu, memory, gpu, priority ceiling
	if sp := req.Spread; sp != nil {
		args = append(args, sp.Group, sp.TopologyKey, max(sp.MaxSkew, 1), sp.WhenUnsatisfiable, s.cfg.MaxOwnerShare)
	} else {
		args = append(args, "", "", 1, "", 0)
	}
	args = append(args, lim[5], lim[6]) // reserve calls per second, burst
	for _, m := range req.Members {
		r := m.Resources
		args = append(args, m.ID, r.CPU, r.Memory, r.GPU, r.Storage)
	}
	reply, err := s.run(ctx, scripts.ReserveGroup, args...)
	if err != nil {
		return GroupDecision{}, err
	}
	if len(reply) != 4 {
		return GroupDecision{}, fmt.Errorf("unexpected reserve_group reply %v", reply)
	}
	outcome, _ := reply[0].(string)
	rejected, _ := reply[2].(string)
	switch outcome {
	case "reserved", "replay":
		flats, _ := reply[1].([]any)
		now, _ := reply[3].(int64)
		if len(flats) != len(req.Members) {
			return GroupDecision{}, fmt.Errorf("reserve_group: %d members in the reply for %d", len(flats), len(req.Members))
		}
		d := GroupDecision{Replayed: outcome == "replay"}
		for i, f := range flats {
			flat, _ := f.([]any)
			if len(flat) == 0 {
				d.Unplaced = append(d.Unplaced, req.Members[i].ID)
				continue
			}
			r, err := s.readReservation(req.Members[i].ID, flatMap(toStrings(flat)), now)
			if err != nil {
				return GroupDecision{}, err
			}
			d.Reservations = append(d.Reservations, r)
		}
		return d, nil
	case "conflict":
		return GroupDecision{}, ErrConflict
	case "limited":
		return GroupDecision{}, limitError(req.Requester, rejected)
	case "nofit":
		var counts map[string]int64
		if err := json.Unmarshal([]byte(rejected), &counts); err != nil {
			return GroupDecision{}, fmt.Errorf("decode rejections: %w", err)
		}
		nf := &GroupNoFitError{Members: int(counts["members"]), MinMember: int(counts["min_member"]),
			Placeable: int(counts["placeable"]), Rejected: map[string]int64{}}
		for k, n := range counts {
			switch k {
			case "members", "min_member", "placeable":
			default:
				nf.Rejected[k] = n
			}
		}
		return GroupDecision{}, nf
	}
	return GroupDecision{}, fmt.Errorf("unexpected reserve_group outcome %q", outcome)
}

// reserveSpread decides a single request with a spread
// (scripts/reserve_group.lua, one member) and answers as Reserve does.
func (s *Store) reserveSpread(ctx context.Context, req ReserveRequest) (Decision, error) {
	d, err := s.ReserveGroup(ctx, GroupRequest{Requester: req.Requester, MinMember: 1,
		Members: []GroupMember{{ID: req.ID, Resources: req.Resources}}, Duration: req.Duration, Lease: req.Lease,
		Selector: req.Selector, Owner: req.Owner, Priority: req.Priority, Spread: req.Spread, Limits: req.Limits})
	var nf *GroupNoFitError
	switch {
	case errors.As(err, &nf):
		return Decision{}, &NoFitError{Rejected: nf.Rejected}
	case err != nil:
		return Decision{}, err
	case len(d.Reservations) != 1:
		return Decision{}, fmt.Errorf("reserve %s: no reservation in the answer", req.ID)
	}
	return Decision{Reservation: d.Reservations[0], Replayed: d.Replayed}, nil
}

// checkSpread verifies the spread counts (scripts/lib/reservations.lua, Spread): for
// every spread group that live reservations name, the count of each
// provider equals its live reservations of the group.
func (s *Store) checkSpread(ctx context.Context, live []Reservation) ([]error, error) {
	want := map[string]map[string]int64{} // requester/group -> provider -> count
	for _, r := range live {
		if r.Spread == "" {
			continue
		}
		k := r.Requester + "/" + r.Spread
		if want[k] == nil {
			want[k] = map[string]int64{}
		}
		want[k][r.Target]++
	}
	var errs []error
	for k, per := range want {
		got, err := s.rdb.HGetAll(ctx, s.Key("spread:", k)).Result()
		if err != nil {
			return nil, err
		}
		for provider, n := range per {
			if atoi(got[provider]) != n {
				errs = append(errs, fmt.Errorf("spread %s: provider %s counts %s, holds %d live reservations of it", k, provider, got[provider], n))
			}
		}
		for provider, v := range got {
			if per[provider] == 0 {
				errs = append(errs, fmt.Errorf("spread %s: provider %s counts %s, holds none of it", k, provider, v))
			}
		}
	}
	return errs, nil
}
