package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// DefaultMaxListsPerCluster is Config.MaxListsPerCluster's default. A page
// of a list is the broker's most expensive answer for Redis (one SSCAN and
// up to api.MaxPageSize hash reads, pipelined): without a bound, a member
// listing in many parallel loops takes Redis from the others' decisions (8
// parallel listings of 60,000 reservations made another member's reserve
// p99 ~100x slower; docs/benchmarks.md). An agent lists one page at a time.
const DefaultMaxListsPerCluster = 2

// listWait is how long a list request waits for one of its cluster's turns
// before it is answered 429; listRetryAfter is the Retry-After it gets.
const (
	listWait       = time.Second
	listRetryAfter = time.Second
)

// listGate bounds the list requests (pages) that one cluster has in
// progress on this replica. The turns of a cluster are a semaphore made
// when it first lists and dropped when it has none in progress.
type listGate struct {
	max   int // 0: no bound
	mu    sync.Mutex
	turns map[string]*clusterTurns
}

type clusterTurns struct {
	sem   chan struct{}
	users int // holders and waiters
}

func newListGate(max int) *listGate {
	return &listGate{max: max, turns: map[string]*clusterTurns{}}
}

// acquire waits up to wait for one of cluster's turns; it returns the
// release, or false when none came in time (or ctx ended).
func (g *listGate) acquire(ctx context.Context, cluster string, wait time.Duration) (func(), bool) {
	if g.max <= 0 {
		return func() {}, true
	}
	g.mu.Lock()
	t := g.turns[cluster]
	if t == nil {
		t = &clusterTurns{sem: make(chan struct{}, g.max)}
		g.turns[cluster] = t
	}
	t.users++
	g.mu.Unlock()
	leave := func() {
		g.mu.Lock()
		if t.users--; t.users == 0 {
			delete(g.turns, cluster)
		}
		g.mu.Unlock()
	}
	release := func() { <-t.sem; leave() }
	select {
	case t.sem <- struct{}{}: // a free turn: no timer
		return release, true
	default:
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case t.sem <- struct{}{}:
		return release, true
	case <-timer.C:
	case <-ctx.Done():
	}
	leave()
	return nil, false
}

// gated serves h only within one of the caller's list turns; past
// Config.MaxListsPerCluster pages in progress (after listWait), 429.
func (s *Server) gated(h func(http.ResponseWriter, *http.Request, string)) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, caller string) {
		release, ok := s.lists.acquire(r.Context(), caller, listWait)
		if !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(listRetryAfter.Seconds())))
			writeError(w, http.StatusTooManyRequests, api.ReasonTooManyRequests, fmt.Sprintf(
				"cluster %s has %d list requests in progress on this broker replica, the most it may: list one page at a time", caller, s.lists.max))
			return
		}
		defer release()
		h(w, r, caller)
	}
}
