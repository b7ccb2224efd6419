package server

import (
	"context"
	"net/http"
	"sync"
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
func (s *Server) throttle(w http.ResponseWriter, r *http.Request, member string, charges ...model.Charge) bool {
	ctx, now := r.Context(), time.Now()
	if s.refusedByRate(w, r, member, now, charges...) {
		return false
	}
	err := s.storeOf(ctx, member).Throttle(ctx, member, charges...)
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
		s.refusals.hold(ctx, member, le)
	}
	s.writeStoreError(w, "throttle", err)
	return false
}

// refusedByRate answers 429 without Redis and returns true when this
// replica already knows that one of the charges' rates refuses the call.
func (s *Server) refusedByRate(w http.ResponseWriter, r *http.Request, member string, now time.Time, charges ...model.Charge) bool {
	for _, c := range charges {
		if c.Rate.PerSecond <= 0 {
			continue
		}
		if le := s.rateRefused.refused(c.Kind, member, c.Cost, now); le != nil {
			s.metrics.rateLimited.WithLabelValues(c.Kind).Inc()
			s.refusals.hold(r.Context(), member, le)
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

// Holding refusals. A member looping past its rate would otherwise get its
// 429 in microseconds and call again at once: its loop would cost the
// broker's CPU (TLS, HTTP) what its rate saves Redis. So a refused call is
// answered once its wait is over (at most maxRefusalHold), as a rate
// limiter that delays excess requests does (nginx's limit_req), and its
// Retry-After is what is left. Each member has at most maxHeldRefusals calls
// held on a replica; past that, a refusal is answered at once (a goroutine
// per held call is all a hold costs, but they must stay bounded).
const (
	maxRefusalHold  = time.Second
	maxHeldRefusals = 8
)

// heldRefusals counts the refused calls held, per member.
type heldRefusals struct {
	mu   sync.Mutex
	held map[string]int
}

func newHeldRefusals() *heldRefusals { return &heldRefusals{held: map[string]int{}} }

// hold waits until le's wait is over (at most maxRefusalHold, and not past
// ctx) when member has fewer than maxHeldRefusals calls held, then takes
// the time waited off le.RetryAfter.
func (h *heldRefusals) hold(ctx context.Context, member string, le *store.LimitError) {
	d := min(le.RetryAfter, maxRefusalHold)
	if d <= 0 {
		return
	}
	h.mu.Lock()
	if h.held[member] >= maxHeldRefusals {
		h.mu.Unlock()
		return
	}
	h.held[member]++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.held[member]--; h.held[member] == 0 {
			delete(h.held, member)
		}
		h.mu.Unlock()
	}()
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	le.RetryAfter = max(0, le.RetryAfter-time.Since(start))
}
