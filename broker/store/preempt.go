package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// PreemptDecision is the outcome of a successful Preempt.
type PreemptDecision struct {
	Reservation model.Reservation
	Victims     []model.Victim // none for a replay
	Replayed    bool
	Reason      string // why, as the audit says it
}

// Preempt outcomes that reserve nothing.
var (
	// ErrFitsWithoutPreemption: the request fits somewhere as it is; reserve it.
	ErrFitsWithoutPreemption = errors.New("the request fits without preemption")
	// ErrCapacityComing: capacity expiring within the grace period would
	// hold it: it waits for that instead of preempting.
	ErrCapacityComing = errors.New("capacity being released would hold the request: nothing preempted")
)

// DefaultPreemptGrace is how soon capacity must be on its way back for a
// request to wait for it rather than preempt.
const DefaultPreemptGrace = 30 * time.Second

// Preempt reserves for req, which fits nowhere, the capacity of live
// reservations of lower priority (scripts/preempt.lua): the fewest victims,
// lowest priority first, on one node, ended and their capacity moved in one
// atomic step. It returns ErrFitsWithoutPreemption, ErrCapacityComing, a
// *NoFitError (no set of lower-priority reservations makes room) or
// ErrConflict.
func (s *Store) Preempt(ctx context.Context, req model.ReserveRequest) (PreemptDecision, error) {
	selector, err := selectorArg(req.Selector)
	if err != nil {
		return PreemptDecision{}, err
	}
	r := req.Resources
	reply, err := s.run(ctx, scripts.Preempt, s.cfg.StaleThreshold.Milliseconds(), s.cfg.EventsMaxLen, s.cfg.AuditMaxLen,
		s.cfg.EventsTTL.Milliseconds(), s.cfg.Retention.Milliseconds(), DefaultPreemptGrace.Milliseconds(),
		req.ID, req.Requester, r.CPU, r.Memory, r.GPU, r.Storage, req.Duration.Milliseconds(), req.Lease.Milliseconds(),
		selector, req.Owner, req.Priority, s.cfg.MaxEndedPerMember)
	if err != nil {
		return PreemptDecision{}, err
	}
	if len(reply) != 5 {
		return PreemptDecision{}, fmt.Errorf("unexpected preempt reply %v", reply)
	}
	outcome, _ := reply[0].(string)
	detail, _ := reply[3].(string)
	switch outcome {
	case "preempted", "replay":
		flat, _ := reply[1].([]any)
		now, _ := reply[4].(int64)
		res, err := s.readReservation(req.ID, flatMap(toStrings(flat)), now)
		if err != nil {
			return PreemptDecision{}, err
		}
		d := PreemptDecision{Reservation: res, Replayed: outcome == "replay"}
		victims, _ := reply[2].(string)
		if err := json.Unmarshal([]byte(victims), &d.Victims); err != nil && victims != "{}" {
			return PreemptDecision{}, fmt.Errorf("decode victims: %w", err)
		}
		for i := range d.Victims {
			v := &d.Victims[i]
			v.Resources = model.Resources{CPU: v.CPU, Memory: v.Memory, GPU: v.GPU, Storage: v.Storage}
		}
		var why struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal([]byte(detail), &why)
		d.Reason = why.Reason
		return d, nil
	case "conflict":
		return PreemptDecision{}, ErrConflict
	case "fits":
		return PreemptDecision{}, ErrFitsWithoutPreemption
	case "wait":
		return PreemptDecision{}, fmt.Errorf("%w (%s)", ErrCapacityComing, detail)
	case "nofit":
		var d struct {
			Candidates    int64 `json:"candidates"`
			LowerPriority int64 `json:"lower_priority"`
			Protected     int64 `json:"protected"`
		}
		_ = json.Unmarshal([]byte(detail), &d)
		return PreemptDecision{}, &NoFitError{Rejected: map[string]int64{"preemption_candidates": d.Candidates,
			"lower_priority_reservations": d.LowerPriority, "protected_by_disruption_budget": d.Protected}}
	}
	return PreemptDecision{}, fmt.Errorf("unexpected preempt outcome %q", outcome)
}

// ProtectTTL is how long a requester's report of protected reservations
// holds (Protect); its agent reports more often.
const ProtectTTL = time.Minute

// Protect replaces the set of requester's reservations (ids as it chose
// them) that PodDisruptionBudgets protect now: Preempt never takes them.
// The report holds ProtectTTL.
func (s *Store) Protect(ctx context.Context, requester string, ids []string) (int64, error) {
	args := make([]any, 0, 2+len(ids))
	args = append(args, requester, ProtectTTL.Milliseconds())
	for _, id := range ids {
		args = append(args, id)
	}
	v, err := s.eval(ctx, scripts.Protect, args...)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("unexpected protect reply %T", v)
	}
	return n, nil
}
