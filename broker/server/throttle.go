package server

import (
	"context"
	"net/http"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// rates returns member's rates other than its reserve calls' (the policy's;
// none without a policy).
func (s *Server) rates(member string) model.MemberRates {
	if p := s.store.Config().Policy; p != nil {
		return p.Rates(member)
	}
	return model.MemberRates{}
}

// throttle counts a call of member against the rates charged (store.Throttle):
// over one, it answers 429 RateLimited with Retry-After and returns false.
// It runs before the body is decoded where the costs allow, so that a
// member looping past its rate costs the broker little more than the TLS
// and HTTP of its calls, and Redis one call per refusal period.
func (s *Server) throttle(w http.ResponseWriter, ctx context.Context, member string, charges ...model.Charge) bool {
	now := time.Now()
	if s.refusedByRate(w, member, now, charges...) {
		return false
	}
	err := s.store.Throttle(ctx, member, charges...)
	if err == nil {
		return true
	}
	costs := make(map[string]int64, len(charges))
	for _, c := range charges {
		costs[c.Kind] = c.Cost
	}
	s.rateRefused.record(member, now, err, costs)
	if le, ok := err.(*store.LimitError); ok {
		s.metrics.rateLimited.WithLabelValues(le.Calls).Inc()
	}
	s.writeStoreError(w, "throttle", err)
	return false
}

// refusedByRate answers 429 without Redis and returns true when this
// replica already knows that one of the charges' rates refuses the call.
func (s *Server) refusedByRate(w http.ResponseWriter, member string, now time.Time, charges ...model.Charge) bool {
	for _, c := range charges {
		if c.Rate.PerSecond <= 0 {
			continue
		}
		if le := s.rateRefused.refused(c.Kind, member, c.Cost, now); le != nil {
			s.metrics.rateLimited.WithLabelValues(c.Kind).Inc()
			writeFairShareError(w, le)
			return true
		}
	}
	return false
}

// bodyCost is what a request's body costs a rate of bytes: its length, or
// the route's bound when it is not known in advance (a chunked body).
func bodyCost(r *http.Request, bound int64) int64 {
	if r.ContentLength >= 0 {
		return r.ContentLength
	}
	return bound
}

// write is the charge of one release, grant or leave of member.
func (s *Server) write(member string) model.Charge {
	return model.Charge{Kind: store.RateWrites, Rate: s.rates(member).Writes, Cost: 1}
}
