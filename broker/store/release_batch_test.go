package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// releaseFixture advertises three providers on s and places rome's
// reservations r0..r5 on them (the same decisions on every store: the same
// calls on the same state), and a request of rome nothing fits, left
// waiting (w0).
func releaseFixture(t *testing.T, s *store.Store) {
	ctx := context.Background()
	require.NoError(t, s.LoadScripts(ctx))
	for i, id := range []string{"paris", "berlin", "madrid"} {
		_, err := s.Advertise(ctx, id, model.Advertisement{
			Capacity: model.Resources{CPU: 4000, Memory: 8 * gi}, Allocatable: model.Resources{CPU: 4000, Memory: 8 * gi},
			Prices: model.Prices{CPU: int64(20_000 + 1000*i), Memory: 2_000, Currency: "EUR"},
		})
		require.NoError(t, err)
	}
	for i := range 6 {
		_, err := s.Reserve(ctx, model.ReserveRequest{ID: fmt.Sprintf("r%d", i), Requester: "rome", Duration: time.Hour,
			Resources: model.Resources{CPU: 1000, Memory: gi}})
		require.NoError(t, err)
	}
	_, err := s.Reserve(ctx, model.ReserveRequest{ID: "w0", Requester: "rome", Duration: time.Hour,
		Resources: model.Resources{CPU: 64_000, Memory: gi}})
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
}

// TestReleaseBatchMatchesSequential: releases ended in one release.lua call
// give, release by release, the answers of one call each in the same order,
// and leave the same counters, usage and records: live reservations
// released by their requester and by their provider, one released twice in
// the batch (the second finds it ended), a caller neither side (forbidden),
// an unknown id, and a waiting request its requester withdraws.
func TestReleaseBatchMatchesSequential(t *testing.T) {
	ctx := context.Background()
	cfg := store.Config{StaleThreshold: time.Hour, WaitTTL: time.Hour}
	seq, bat := store.New(startRedis(t), cfg), store.New(startRedis(t), cfg)
	releaseFixture(t, seq)
	releaseFixture(t, bat)
	target := func(id string) string {
		r, err := seq.Reservation(ctx, "rome", id)
		require.NoError(t, err)
		return r.Target
	}
	cases := []store.ReleaseCase{
		{"r0", "rome"}, {"r1", target("r1")}, {"r0", "rome"}, {"r2", "lisbon"}, {"nope", "rome"},
		{"w0", "rome"}, {"r3", "rome"}, {"r3", target("r3")},
	}
	type outcome struct {
		released, clamped bool
		phase, provider   string
		err               error
	}
	outcomes := func(results []store.ReleaseResult, errs []error) []outcome {
		out := make([]outcome, len(results))
		for i, r := range results {
			out[i] = outcome{r.Released, r.Clamped, r.Reservation.Phase, r.Reservation.Target, errs[i]}
		}
		return out
	}
	var seqResults []store.ReleaseResult
	var seqErrs []error
	for _, c := range cases {
		r, err := seq.Release(ctx, "rome", c.ID, c.Caller)
		seqResults, seqErrs = append(seqResults, r), append(seqErrs, err)
	}
	batResults, batErrs := bat.ReleaseBatch(ctx, "rome", cases)
	want := outcomes(seqResults, seqErrs)
	assert.Equal(t, want, outcomes(batResults, batErrs))
	assert.Equal(t, []error{nil, nil, nil, store.ErrForbidden, store.ErrNotFound, store.ErrNotFound, nil, nil}, seqErrs)
	assert.Equal(t, []bool{true, true, false, false, false, false, true, false},
		[]bool{want[0].released, want[1].released, want[2].released, want[3].released, want[4].released, want[5].released, want[6].released, want[7].released})

	for _, s := range []*store.Store{seq, bat} {
		require.NoError(t, s.CheckInvariant(ctx))
		require.NoError(t, s.CheckIndex(ctx))
		waiting, err := admin(t, s).ZCard(ctx, s.Key("waiting")).Result()
		require.NoError(t, err)
		assert.Zero(t, waiting, "w0 withdrawn")
	}
	for _, id := range []string{"paris", "berlin", "madrid"} {
		a, err := seq.Cluster(ctx, id)
		require.NoError(t, err)
		b, err := bat.Cluster(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, a.Reserved, b.Reserved, id)
	}
	ua, err := seq.Usage(ctx)
	require.NoError(t, err)
	ub, err := bat.Usage(ctx)
	require.NoError(t, err)
	assert.Equal(t, ua, ub)
	assert.Equal(t, int64(3), ua["rome"].Reservations, "r2, r4, r5 live")
}

// TestReleaseBatchIsolatesABadRelease: a release that makes the script
// raise (a record whose amount is not a number, which the broker never
// writes) gets the error as its reply; the releases around it in the batch
// end and are accounted.
func TestReleaseBatchIsolatesABadRelease(t *testing.T) {
	ctx := context.Background()
	s := store.New(startRedis(t), store.Config{StaleThreshold: time.Hour, WaitTTL: time.Hour})
	releaseFixture(t, s)
	require.NoError(t, admin(t, s).HSet(ctx, s.Key("resv:rome/r1"), "cpu", "lots").Err())
	cfg := s.Config()
	replies, err := scripts.Release.Run(ctx, s.Client(), []string{cfg.Prefix}, cfg.EventsMaxLen, cfg.EventsTTL.Milliseconds(),
		cfg.Retention.Milliseconds(), cfg.MaxEndedPerMember, "rome", "r0", "rome", "rome", "r1", "rome", "rome", "r2", "rome").Slice()
	require.NoError(t, err)
	require.Len(t, replies, 3)
	statuses := make([]string, len(replies))
	for i, r := range replies {
		statuses[i] = r.([]any)[0].(string)
	}
	require.Equal(t, []string{"released", "error", "released"}, statuses)
	assert.Contains(t, replies[1].([]any)[4], "not an integer")
	for _, id := range []string{"r0", "r2"} {
		r, err := s.Reservation(ctx, "rome", id)
		require.NoError(t, err)
		assert.Equal(t, model.PhaseReleased, r.Phase, id)
	}
}

// TestConcurrentReleases: many callers release at once (so the batcher forms
// batches): each reservation is released exactly once, whoever asks first,
// its requester or its provider; the counters and usage end at zero.
func TestConcurrentReleases(t *testing.T) {
	ctx := context.Background()
	s := store.New(startRedis(t), store.Config{StaleThreshold: time.Hour, ReserveBatch: 8})
	require.NoError(t, s.LoadScripts(ctx))
	for i := range 10 {
		_, err := s.Advertise(ctx, fmt.Sprintf("p%02d", i), model.Advertisement{
			Capacity: model.Resources{CPU: 16_000, Memory: 32 * gi}, Allocatable: model.Resources{CPU: 16_000, Memory: 32 * gi},
			Prices: model.Prices{CPU: int64(10_000 + 1000*i), Memory: 1000, Currency: "EUR"},
		})
		require.NoError(t, err)
	}
	const n = 120
	providers := make([]string, n)
	for i := range n {
		d, err := s.Reserve(ctx, model.ReserveRequest{ID: fmt.Sprintf("q%d", i), Requester: "home", Duration: time.Hour,
			Resources: model.Resources{CPU: 1000, Memory: gi}})
		require.NoError(t, err)
		providers[i] = d.Reservation.Target
	}
	require.NoError(t, admin(t, s).ConfigResetStat(ctx).Err())
	var (
		mu       sync.Mutex
		released = map[string]int{}
		wg       sync.WaitGroup
	)
	for i := range n {
		for _, caller := range []string{"home", providers[i]} { // both sides at once
			wg.Go(func() {
				id := fmt.Sprintf("q%d", i)
				r, err := s.Release(ctx, "home", id, caller)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Clamped || r.Reservation.Phase != model.PhaseReleased {
					t.Errorf("%s: clamped %v, phase %s", id, r.Clamped, r.Reservation.Phase)
				}
				if r.Released {
					mu.Lock()
					released[id]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	scriptCalls := readStats(t, s.Client().(*redis.Client))["evalsha"].calls
	require.Less(t, scriptCalls, int64(2*n), "the releases share release.lua calls")
	require.Len(t, released, n)
	for id, times := range released {
		require.Equal(t, 1, times, id)
	}
	require.NoError(t, s.CheckInvariant(ctx))
	require.NoError(t, s.CheckIndex(ctx))
	usage, err := s.Usage(ctx)
	require.NoError(t, err)
	require.Zero(t, usage["home"].Reservations)
	for i := range 10 {
		c, err := s.Cluster(ctx, fmt.Sprintf("p%02d", i))
		require.NoError(t, err)
		require.Zero(t, c.Reserved, c.ID)
	}
}
