package server

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// advertWait bounds an advertisement's wait for its turn (advertGate)
// before it is answered 503 Busy. An advertisement holds its turn for its
// round trip to Redis: a millisecond or two at rest, a second or more when
// Redis' queue is long (docs/benchmarks.md, "Advertisements under
// overload"): 3 s is a thousand turns at rest, a few at saturation. It is
// well under the server's WriteTimeout (15 s): an advertisement served at
// the end of its wait still has over 10 s to reach Redis and be answered,
// where an unbounded wait let the backlog grow until every answer came
// after the deadline and was cut mid-write.
const advertWait = 3 * time.Second

// Bounds of a shed advertisement's Retry-After.
const (
	minAdvertRetryAfter = time.Second
	// An agent advertises every 30 s anyway (agent/publisher).
	maxAdvertRetryAfter = 30 * time.Second
)

// advertGate lets max advertisements of this replica reach Redis at once
// (maxConcurrentAdvertisements). The others wait, at most advertWait, and
// the newest waiter gets the next turn: under a backlog, first come first
// served gives each turn to the request that waited longest, the one
// whose client is closest to giving up, until none is answered in time;
// newest first serves the ones that still have time, and the oldest are
// shed when their wait is over.
type advertGate struct {
	turns   int
	mu      sync.Mutex
	free    int
	waiters []chan struct{} // the newest last; closed when given a turn
	// meanHold is a moving average of how long a turn is held: the
	// Retry-After of a shed advertisement is the backlog's time to drain.
	meanHold time.Duration
}

func newAdvertGate(max int) *advertGate {
	return &advertGate{turns: max, free: max}
}

// acquire waits up to wait for a turn. It returns the release, or false
// with the number of advertisements then waiting when no turn came in time
// or ctx ended.
func (g *advertGate) acquire(ctx context.Context, wait time.Duration) (release func(), backlog int, ok bool) {
	g.mu.Lock()
	if g.free > 0 {
		g.free--
		g.mu.Unlock()
		return g.releaser(), 0, true
	}
	turn := make(chan struct{})
	g.waiters = append(g.waiters, turn)
	g.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-turn:
		return g.releaser(), 0, true
	case <-timer.C:
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.waiters, turn); i >= 0 {
		g.waiters = slices.Delete(g.waiters, i, i+1)
		return nil, len(g.waiters), false
	}
	// Given a turn as the wait ended: pass it on.
	g.handOn()
	return nil, len(g.waiters), false
}

// releaser returns the release of a turn taken now.
func (g *advertGate) releaser() func() {
	start := time.Now()
	return func() {
		held := time.Since(start)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.meanHold += (held - g.meanHold) / 8
		g.handOn()
	}
}

// handOn gives a turn that ends to the newest waiter, or frees it. g.mu held.
func (g *advertGate) handOn() {
	n := len(g.waiters)
	if n == 0 {
		g.free++
		return
	}
	close(g.waiters[n-1])
	g.waiters[n-1] = nil
	g.waiters = g.waiters[:n-1]
}

// waiting is how many advertisements wait for a turn.
func (g *advertGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiters)
}

// retryAfter is when a shed advertisement should come back: the time the
// backlog takes to drain, times 1 to 2 at random so that the shed do not
// all come back together, within [minAdvertRetryAfter, maxAdvertRetryAfter].
func (g *advertGate) retryAfter(backlog int) time.Duration {
	g.mu.Lock()
	drain := time.Duration(backlog) * g.meanHold / time.Duration(g.turns)
	g.mu.Unlock()
	d := time.Duration(float64(drain) * (1 + rand.Float64()))
	return min(max(d, minAdvertRetryAfter), maxAdvertRetryAfter)
}
