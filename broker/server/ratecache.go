package server

import (
	"errors"
	"sync"
	"time"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// rateRefusals remembers, per member and rate, until when its calls are
// refused by that rate. The rate state in Redis (scripts/lib/limits.lua
// gcra_step) moves only on allowed calls, so once a call is refused with
// "retry in X", every call as dear before then would be refused too: this
// replica answers those itself, and a member calling in a tight loop past
// its rate costs Redis one call per refusal period, not one per call.
// (Another replica's calls can only push the time further.) The kind of the
// reserve calls' rate is "".
type rateRefusals struct {
	mu    sync.Mutex
	until map[rateKey]rateRefusal
}

type rateKey struct{ kind, member string }

type rateRefusal struct {
	until time.Time
	cost  int64   // the refused call's cost: a cheaper call may pass sooner
	max   float64 // the rate, for the message
}

func newRateRefusals() *rateRefusals { return &rateRefusals{until: map[rateKey]rateRefusal{}} }

// refused returns the LimitError of a call of member costing cost units of
// the rate kind at now while such a call is still refused, else nil.
func (r *rateRefusals) refused(kind, member string, cost int64, now time.Time) *store.LimitError {
	k := rateKey{kind, member}
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, ok := r.until[k]
	if !ok {
		return nil
	}
	if !now.Before(ref.until) {
		delete(r.until, k)
		return nil
	}
	if cost < ref.cost {
		return nil
	}
	return &store.LimitError{Requester: member, Limit: "rate", Calls: kind, Max: ref.max, RetryAfter: ref.until.Sub(now).Round(time.Millisecond)}
}

// record notes err, the answer to a call of member made at now, if it is a
// refusal by one of its rates; cost is what the call cost of that rate
// (costs by kind; absent: 1).
func (r *rateRefusals) record(member string, now time.Time, err error, costs map[string]int64) {
	var le *store.LimitError
	if !errors.As(err, &le) || le.Limit != "rate" || le.RetryAfter <= 0 {
		return
	}
	cost, ok := costs[le.Calls]
	if !ok {
		cost = 1
	}
	r.mu.Lock()
	r.until[rateKey{le.Calls, member}] = rateRefusal{until: now.Add(le.RetryAfter), cost: cost, max: le.Max}
	r.mu.Unlock()
}
