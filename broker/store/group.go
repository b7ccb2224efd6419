package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

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
func (s *Store) ReserveGroup(ctx context.Context, req model.GroupRequest) (model.GroupDecision, error) {
	if err := req.Validate(); err != nil {
		return model.GroupDecision{}, err
	}
	if s.cfg.Policy != nil {
		req.Limits = s.policyLimits(req.Requester, req.HeldElsewhere)
	}
	arg, err := s.encodeGroupArg(req)
	if err != nil {
		return model.GroupDecision{}, err
	}
	reply, err := s.run(ctx, scripts.ReserveGroup, s.cfg.StaleThreshold.Milliseconds(), s.cfg.EventsMaxLen,
		s.cfg.AuditMaxLen, s.cfg.EventsTTL.Milliseconds(), arg)
	if err != nil {
		return model.GroupDecision{}, err
	}
	if len(reply) != 4 {
		return model.GroupDecision{}, fmt.Errorf("unexpected reserve_group reply %v", reply)
	}
	outcome, _ := reply[0].(string)
	rejected, _ := reply[2].(string)
	switch outcome {
	case "reserved", "replay":
		flats, _ := reply[1].([]any)
		now, _ := reply[3].(int64)
		if len(flats) != len(req.Members) {
			return model.GroupDecision{}, fmt.Errorf("reserve_group: %d members in the reply for %d", len(flats), len(req.Members))
		}
		d := model.GroupDecision{Replayed: outcome == "replay"}
		for i, f := range flats {
			flat, _ := f.([]any)
			if len(flat) == 0 {
				d.Unplaced = append(d.Unplaced, req.Members[i].ID)
				continue
			}
			r, err := s.readReservation(req.Members[i].ID, flatMap(toStrings(flat)), now)
			if err != nil {
				return model.GroupDecision{}, err
			}
			d.Reservations = append(d.Reservations, r)
		}
		return d, nil
	case "conflict":
		return model.GroupDecision{}, ErrConflict
	case "limited":
		return model.GroupDecision{}, limitError(req.Requester, rejected)
	case "nofit":
		var counts map[string]int64
		if err := json.Unmarshal([]byte(rejected), &counts); err != nil {
			return model.GroupDecision{}, fmt.Errorf("decode rejections: %w", err)
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
		return model.GroupDecision{}, nf
	}
	return model.GroupDecision{}, fmt.Errorf("unexpected reserve_group outcome %q", outcome)
}

// groupArg is a group request as reserve_group.lua reads it, one JSON
// object (its header documents the fields), named and encoded as
// reserveArg where they overlap: the amounts, times and the priority
// travel as decimal strings, as the reservation hash keeps them.
type groupArg struct {
	Group     string        `json:"group"`
	Requester string        `json:"requester"`
	Selector  string        `json:"selector"`
	Owner     string        `json:"owner"`
	Priority  int32         `json:"priority,string"`
	Duration  int64         `json:"duration,string"`
	Lease     int64         `json:"lease,string"`
	MinMember int           `json:"min_member"`
	Limits    reserveLimits `json:"limits"`
	Spread    *spreadArg    `json:"spread,omitempty"`
	Members   []memberArg   `json:"members"`
}

// spreadArg is a group request's spread in groupArg.
type spreadArg struct {
	Group    string  `json:"group"`
	Key      string  `json:"key"`
	MaxSkew  int32   `json:"max_skew"`
	When     string  `json:"when"`
	MaxShare float64 `json:"max_share"`
}

// memberArg is one member in groupArg.
type memberArg struct {
	ID      string `json:"id"`
	CPU     int64  `json:"cpu,string"`
	Memory  int64  `json:"mem,string"`
	GPU     int64  `json:"gpu,string"`
	Storage int64  `json:"sto,string"`
}

func (s *Store) encodeGroupArg(req model.GroupRequest) (string, error) {
	selector, err := selectorArg(req.Selector)
	if err != nil {
		return "", err
	}
	arg := groupArg{
		Group: req.Group, Requester: req.Requester, Selector: selector, Owner: req.Owner, Priority: req.Priority,
		Duration: req.Duration.Milliseconds(), Lease: req.Lease.Milliseconds(), MinMember: req.MinMember,
		Limits: limitsArg(req.Limits), Members: make([]memberArg, len(req.Members)),
	}
	if sp := req.Spread; sp != nil {
		arg.Spread = &spreadArg{Group: sp.Group, Key: sp.TopologyKey, MaxSkew: max(sp.MaxSkew, 1),
			When: sp.WhenUnsatisfiable, MaxShare: s.cfg.MaxOwnerShare}
	}
	for i, m := range req.Members {
		r := m.Resources
		arg.Members[i] = memberArg{ID: m.ID, CPU: r.CPU, Memory: r.Memory, GPU: r.GPU, Storage: r.Storage}
	}
	b, err := json.Marshal(arg)
	return string(b), err
}

// reserveSpread decides a single request with a spread
// (scripts/reserve_group.lua, one member) and answers as Reserve does.
func (s *Store) reserveSpread(ctx context.Context, req model.ReserveRequest) (model.Decision, error) {
	d, err := s.ReserveGroup(ctx, model.GroupRequest{Requester: req.Requester, MinMember: 1,
		Members: []model.GroupMember{{ID: req.ID, Resources: req.Resources}}, Duration: req.Duration, Lease: req.Lease,
		Selector: req.Selector, Owner: req.Owner, Priority: req.Priority, Spread: req.Spread, Limits: req.Limits})
	var nf *GroupNoFitError
	switch {
	case errors.As(err, &nf):
		return model.Decision{}, &NoFitError{Rejected: nf.Rejected}
	case err != nil:
		return model.Decision{}, err
	case len(d.Reservations) != 1:
		return model.Decision{}, fmt.Errorf("reserve %s: no reservation in the answer", req.ID)
	}
	return model.Decision{Reservation: d.Reservations[0], Replayed: d.Replayed}, nil
}

// checkSpread verifies the spread counts (scripts/lib/reservations.lua, Spread): for
// every spread group that live reservations name, the count of each
// provider equals its live reservations of the group.
func (s *Store) checkSpread(ctx context.Context, live []model.Reservation) ([]error, error) {
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
