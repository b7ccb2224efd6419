package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestThrottle: a member's calls against several rates at once, on a real
// redis-server: within the burst every call passes, the next is refused
// with the wait until one more would pass, a refused call counts against
// none of its rates (all or nothing), a call dearer than the burst costs
// the burst, and members do not share rates.
func TestThrottle(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	calls := model.Charge{Kind: store.RateRenewals, Rate: model.Rate{PerSecond: 10, Burst: 3}, Cost: 1}
	ids := func(n int64) model.Charge {
		return model.Charge{Kind: store.RateRenewedIDs, Rate: model.Rate{PerSecond: 100, Burst: 1000}, Cost: n}
	}

	for i := range 3 {
		require.NoError(t, s.Throttle(ctx, "mallory", calls, ids(10)), "call %d, within the burst", i)
	}
	err := s.Throttle(ctx, "mallory", calls, ids(10))
	var le *store.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, store.LimitError{Requester: "mallory", Limit: "rate", Calls: store.RateRenewals, Max: 10, RetryAfter: le.RetryAfter}, *le)
	assert.InDelta(t, 100, le.RetryAfter.Milliseconds(), 30, "one interval of 10/s: %s", le)
	assert.Contains(t, le.Error(), "member mallory exceeds its limit of 10 renewal calls per second")

	require.NoError(t, s.Throttle(ctx, "rome", calls, ids(10)), "another member's rate is its own")

	time.Sleep(le.RetryAfter + 10*time.Millisecond)
	// The ids' rate refuses this one (the ids still counted + 1000 > the
	// burst of 1000): the calls' rate, which would allow it, is not counted
	// either.
	err = s.Throttle(ctx, "mallory", calls, ids(1000))
	require.ErrorAs(t, err, &le)
	assert.Equal(t, store.RateRenewedIDs, le.Calls)
	require.NoError(t, s.Throttle(ctx, "mallory", calls), "the refused call did not count against the calls' rate")

	// A call dearer than the burst costs the burst: it waits for a full
	// burst, it is not refused for ever.
	big := model.Charge{Kind: store.RateRenewalBytes, Rate: model.Rate{PerSecond: 1000, Burst: 100}, Cost: 5000}
	require.NoError(t, s.Throttle(ctx, "milan", big))
	err = s.Throttle(ctx, "milan", big)
	require.ErrorAs(t, err, &le)
	assert.InDelta(t, 100, le.RetryAfter.Milliseconds(), 30, "the burst's worth of time: %s", le)

	// No limit: Redis is not asked, nothing is counted.
	for range 100 {
		require.NoError(t, s.Throttle(ctx, "milan", model.Charge{Kind: store.RateWrites, Cost: 1}))
	}
	assertInvariant(t, s)
}
