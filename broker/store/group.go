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
		req.Limits = s.cfg.Policy.Limits(req.Requester)
	}
	selector, err := selectorArg(req.Selector)
	if err != nil {
		return model.GroupDecision{}, err
	}
	lim := limitArgs(req.Limits)
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
