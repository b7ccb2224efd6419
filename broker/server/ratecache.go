package server

import (
	"errors"
	"sync"
	"time"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// rateRefusals remembers, per requester, until when its reserve calls are
// refused by its rate limit. The rate state in Redis (scripts/lib/limits.lua gcra_step)
// moves only on allowed calls, so once a call is refused with "retry in X",
// every call before then would be refused too: this replica answers those
// itself, and a member calling in a tight loop past its rate costs Redis
// one call per refusal period, not one per call. (Another replica's calls
// can only push the time further.)
type rateRefusals struct {
	mu    sync.Mutex
	until map[string]rateRefusal
}

type rateRefusal struct {
	until time.Time
	max   float64 // the rate, for the message
}

func newRateRefusals() *rateRefusals { return &rateRefusals{until: map[string]rateRefusal{}} }

// refused returns the LimitError of a call of requester at now while it is
// still refused, else nil.
func (r *rateRefusals) refused(requester string, now time.Time) *store.LimitError {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, ok := r.until[requester]
	if !ok {
		return nil
	}
	if !now.Before(ref.until) {
		delete(r.until, requester)
		return nil
	}
	return &store.LimitError{Requester: requester, Limit: "rate", Max: ref.max, RetryAfter: ref.until.Sub(now).Round(time.Millisecond)}
}

// record notes err, the answer to a call of requester made at now, if it is
// a refusal by the rate.
func (r *rateRefusals) record(requester string, now time.Time, err error) {
	var le *store.LimitError
	if !errors.As(err, &le) || le.Limit != "rate" || le.RetryAfter <= 0 {
		return
	}
	r.mu.Lock()
	r.until[requester] = rateRefusal{until: now.Add(le.RetryAfter), max: le.Max}
	r.mu.Unlock()
}
