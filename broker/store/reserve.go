package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Reserve decides a request: it returns the decision, or a *NoFitError, or
// ErrConflict when the id belongs to another requester, or a *LimitError
// when its requester's limits refuse it. Concurrent requests are decided in
// batches (Config.ReserveBatch), each exactly as if alone. With a
// Config.Policy, the requester's limits are the policy's.
func (s *Store) Reserve(ctx context.Context, req model.ReserveRequest) (model.Decision, error) {
	if sp := req.Spread; sp != nil && (sp.TopologyKey != "" || s.cfg.MaxOwnerShare > 0) {
		if s.cfg.Policy != nil {
			req.Limits = s.policyLimits(req.Requester, req.HeldElsewhere)
		}
		return s.reserveSpread(ctx, req)
	}
	p, err := newPendingReserve(ctx, s.withLimits(req))
	if err != nil {
		return model.Decision{}, err
	}
	d, err := s.reserve.do(ctx, p)
	var nf *NoFitError
	if req.Preempt && errors.As(err, &nf) && nf.Rejected["waiting_higher_priority"] == 0 {
		return s.preemptFor(ctx, req, nf)
	}
	return d, err
}

// preemptFor runs Preempt for a request reserve.lua refused (nf): the
// decision, or the refusal, saying why nothing was preempted.
func (s *Store) preemptFor(ctx context.Context, req model.ReserveRequest, nf *NoFitError) (model.Decision, error) {
	pd, err := s.Preempt(ctx, req)
	var pnf *NoFitError
	switch {
	case err == nil:
		return model.Decision{Reservation: pd.Reservation, Replayed: pd.Replayed, Victims: pd.Victims}, nil
	case errors.Is(err, ErrFitsWithoutPreemption): // capacity came back meanwhile
		p, err := newPendingReserve(ctx, s.withLimits(req))
		if err != nil {
			return model.Decision{}, err
		}
		return s.reserve.do(ctx, p)
	case errors.Is(err, ErrCapacityComing):
		nf.Rejected["capacity_being_released"] = 1
		return model.Decision{}, nf
	case errors.As(err, &pnf):
		for k, n := range pnf.Rejected {
			nf.Rejected[k] = n
		}
		return model.Decision{}, nf
	}
	return model.Decision{}, err
}

// withLimits sets req's limits from the policy, if any, and its
// preferences from the requester's defaults there when it carries none.
func (s *Store) withLimits(req model.ReserveRequest) model.ReserveRequest {
	if s.cfg.Policy != nil {
		req.Limits = s.policyLimits(req.Requester, req.HeldElsewhere)
		if len(req.Preferences) == 0 {
			req.Preferences = s.cfg.Policy.Preferences(req.Requester)
		}
	}
	return req
}

// policyLimits are requester's limits in the policy less what it holds in
// other cells (none at 0: the script refuses whatever would exceed them).
func (s *Store) policyLimits(requester string, elsewhere model.Usage) model.Limits {
	l := s.cfg.Policy.Limits(requester)
	less := func(limit *int64, held int64) *int64 {
		if limit == nil || held == 0 {
			return limit
		}
		left := max(*limit-held, 0)
		return &left
	}
	l.Reservations = less(l.Reservations, elsewhere.Reservations)
	l.CPU = less(l.CPU, elsewhere.Resources.CPU)
	l.Memory = less(l.Memory, elsewhere.Resources.Memory)
	l.GPU = less(l.GPU, elsewhere.Resources.GPU)
	return l
}

// pendingReserve is one request waiting for its decision.
type pendingReserve = pending[reserveCall, model.Decision]

// reserveCall is a request and its ARGV value in reserve.lua (reserveArg).
type reserveCall struct {
	req model.ReserveRequest
	arg string
}

func newPendingReserve(ctx context.Context, req model.ReserveRequest) (*pendingReserve, error) {
	arg, err := encodeReserveArg(req)
	if err != nil {
		return nil, err
	}
	return newPending[reserveCall, model.Decision](ctx, reserveCall{req: req, arg: arg}), nil
}

// reserveArg is one request as reserve.lua reads it, one JSON object per
// request (its header documents the fields). The amounts, times and the
// priority travel as decimal strings: the script stores and compares them
// as the reservation hash keeps them, with no float formatting between.
type reserveArg struct {
	ID        string        `json:"id"`
	Requester string        `json:"requester"`
	CPU       int64         `json:"cpu,string"`
	Memory    int64         `json:"mem,string"`
	GPU       int64         `json:"gpu,string"`
	Storage   int64         `json:"sto,string"`
	Duration  int64         `json:"duration,string"`
	Lease     int64         `json:"lease,string"`
	Priority  int32         `json:"priority,string"`
	Selector  string        `json:"selector"`
	Owner     string        `json:"owner"`
	Wait      bool          `json:"wait"`
	Limits    reserveLimits `json:"limits"`
	Prefs     []prefArg     `json:"prefs,omitempty"`
}

// prefArg is one preference term as reserve.lua tries it: the terms travel
// in the order tried (prefsArg), each with its index in the request as given.
type prefArg struct {
	Index    int               `json:"i"`
	Weight   int32             `json:"w"`
	Labels   map[string]string `json:"labels,omitempty"`
	Clusters []string          `json:"clusters,omitempty"`
}

// prefsArg orders the terms by weight, highest first, equal weights in the
// order given, and lists each term's clusters once.
func prefsArg(prefs []model.Preference) []prefArg {
	if len(prefs) == 0 {
		return nil
	}
	out := make([]prefArg, len(prefs))
	for i, p := range prefs {
		out[i] = prefArg{Index: i, Weight: p.Weight, Labels: p.Labels}
		seen := make(map[string]bool, len(p.Clusters))
		for _, c := range p.Clusters {
			if !seen[c] {
				seen[c] = true
				out[i].Clusters = append(out[i].Clusters, c)
			}
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Weight > out[b].Weight })
	return out
}

// reserveLimits are a request's limits in reserveArg and groupArg (absent:
// no limit).
type reserveLimits struct {
	Reservations *int64  `json:"n,omitempty"`
	CPU          *int64  `json:"cpu,omitempty"`
	Memory       *int64  `json:"mem,omitempty"`
	GPU          *int64  `json:"gpu,omitempty"`
	Priority     *int32  `json:"priority,omitempty"`
	Rate         float64 `json:"rate,omitempty"`
	Burst        int     `json:"burst,omitempty"`
}

// limitsArg encodes l for the scripts.
func limitsArg(l model.Limits) reserveLimits {
	lim := reserveLimits{Reservations: l.Reservations, CPU: l.CPU, Memory: l.Memory, GPU: l.GPU, Priority: l.Priority}
	if l.Rate > 0 {
		lim.Rate, lim.Burst = l.Rate, max(l.Burst, 1)
	}
	return lim
}

func encodeReserveArg(req model.ReserveRequest) (string, error) {
	selector, err := selectorArg(req.Selector)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(reserveArg{
		ID: req.ID, Requester: req.Requester,
		CPU: req.Resources.CPU, Memory: req.Resources.Memory, GPU: req.Resources.GPU, Storage: req.Resources.Storage,
		Duration: req.Duration.Milliseconds(), Lease: req.Lease.Milliseconds(), Priority: req.Priority,
		Selector: selector, Owner: req.Owner, Wait: !req.NoWait, Limits: limitsArg(req.Limits),
		Prefs: prefsArg(req.Preferences),
	})
	return string(b), err
}

// sendReserves decides a batch in one reserve.lua call and hands each
// request its result.
func (s *Store) sendReserves(ctx context.Context, batch []*pendingReserve) {
	args := make([]any, 0, 8+len(batch))
	args = append(args, s.cfg.StaleThreshold.Milliseconds(), s.cfg.WeightResources, s.cfg.WeightCost,
		s.cfg.TopCandidates, s.cfg.EventsMaxLen, s.cfg.AuditMaxLen,
		max(s.cfg.WaitTTL.Milliseconds(), 0), s.cfg.EventsTTL.Milliseconds())
	for _, p := range batch {
		args = append(args, p.call.arg)
	}
	if s.view != nil {
		s.hintBatch(ctx, batch, args[len(args)-len(batch):])
	}
	replies, err := s.run(ctx, s.decide, args...)
	if err == nil && len(replies) != len(batch) {
		err = fmt.Errorf("reserve: %d replies for %d requests", len(replies), len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.answer(model.Decision{}, err)
			continue
		}
		reply, ok := replies[i].([]any)
		if !ok || len(reply) != 5 {
			p.answer(model.Decision{}, fmt.Errorf("unexpected reserve reply %v", replies[i]))
			continue
		}
		p.answer(s.parseReserveReply(p.call.req, reply))
	}
}

// hintBatch adds to each request of batch (its ARGV value in args) the
// candidates the view proposes, once caught up; the others walk the index.
func (s *Store) hintBatch(ctx context.Context, batch []*pendingReserve, args []any) {
	v := s.view
	if err := s.catchUpView(ctx); err != nil {
		v.failed.Add(1)
		v.walked.Add(uint64(len(batch)))
		return
	}
	for i, p := range batch {
		if len(p.call.req.Preferences) == 0 {
			if h, ok := v.hint(p.call.req, s.cfg.WeightResources, s.cfg.WeightCost, s.cfg.TopCandidates+2); ok {
				args[i] = withHint(p.call.arg, h)
				v.hinted.Add(1)
				continue
			}
		}
		v.walked.Add(1)
	}
}

// parseReserveReply reads one request's {outcome, reservation, candidates, rejections, now_ms}.
func (s *Store) parseReserveReply(req model.ReserveRequest, reply []any) (model.Decision, error) {
	id := req.ID
	outcome, _ := reply[0].(string)
	switch outcome {
	case "reserved", "replay":
		flat, _ := reply[1].([]any)
		now, _ := reply[4].(int64)
		r, err := s.readReservation(id, flatMap(toStrings(flat)), now)
		return model.Decision{Reservation: r, Replayed: outcome == "replay"}, err
	case "conflict":
		return model.Decision{}, ErrConflict
	case "limited":
		msg, _ := reply[3].(string)
		return model.Decision{}, limitError(req.Requester, msg)
	case "error":
		msg, _ := reply[3].(string)
		return model.Decision{}, fmt.Errorf("reserve %s: %s", id, msg)
	case "nofit":
		nf := &NoFitError{}
		rejected, _ := reply[3].(string)
		if err := json.Unmarshal([]byte(rejected), &nf.Rejected); err != nil {
			return model.Decision{}, fmt.Errorf("decode rejections: %w", err)
		}
		return model.Decision{}, nf
	}
	return model.Decision{}, fmt.Errorf("unexpected reserve outcome %q", outcome)
}
