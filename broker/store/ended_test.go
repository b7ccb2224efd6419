package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestAbuseEndedReservationsPerMember: every ended reservation stayed for
// the retention whatever its requester had ended before, so one member
// reserving and releasing at its rate kept tens of thousands of records in
// Redis, toward maxmemory, for every member. Now each member's ended
// reservations kept are capped: beyond the cap its oldest go (records and
// all), the other members' are untouched, and what is kept still goes at
// the retention, leaving nothing behind.
func TestAbuseEndedReservationsPerMember(t *testing.T) {
	ctx := context.Background()
	const limit = 50
	s := newStore(t, store.Config{MaxEndedPerMember: limit})
	_, err := s.Advertise(ctx, "paris", cluster(64, 256, 0, 30_000, nil))
	require.NoError(t, err)
	id := func(i int) string { return fmt.Sprintf("r-%03d", i) } // in the order they end

	// milan ends a few; rome ends 200, the first 20 by expiry, then by release.
	for i := range 10 {
		_, err := s.Reserve(ctx, request(id(i), "milan", 100, 0, 0))
		require.NoError(t, err)
		_, err = s.Release(ctx, "milan", id(i), "milan")
		require.NoError(t, err)
	}
	for i := range 20 {
		short := request(id(i), "rome", 100, 0, 0)
		short.Duration = time.Millisecond
		_, err := s.Reserve(ctx, short)
		require.NoError(t, err)
	}
	time.Sleep(5 * time.Millisecond)
	expired, _, err := s.Expire(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(20), expired)
	for i := 20; i < 200; i++ {
		_, err := s.Reserve(ctx, request(id(i), "rome", 100, 0, 0))
		require.NoError(t, err)
		_, err = s.Release(ctx, "rome", id(i), "rome")
		require.NoError(t, err)
	}

	kept := keysLike(t, s, "resv:rome/")
	require.Len(t, kept, limit, "rome keeps its cap of ended reservations")
	for i := 150; i < 200; i++ {
		assert.Contains(t, kept, s.Key("resv:rome/", id(i)), "the newest are kept")
	}
	_, err = s.Reservation(ctx, "rome", id(149))
	assert.ErrorIs(t, err, store.ErrNotFound, "the oldest went before the retention")
	r, err := s.Reservation(ctx, "rome", id(199))
	require.NoError(t, err)
	assert.Equal(t, model.PhaseReleased, r.Phase)
	assert.Len(t, keysLike(t, s, "resv:milan/"), 10, "milan's are untouched")
	ended, err := s.EndedReservations(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"rome": limit, "milan": 10}, ended)
	assertInvariant(t, s)
	assert.Empty(t, keysWithoutLifetime(t, s), "every key is the federation's, live or goes by itself")

	// A dropped id may be used again, as after the retention: a new
	// reservation, which the cap leaves alone.
	_, err = s.Reserve(ctx, request(id(0), "rome", 100, 0, 0))
	require.NoError(t, err)
	for i := 200; i < 260; i++ {
		_, err := s.Reserve(ctx, request(id(i), "rome", 100, 0, 0))
		require.NoError(t, err)
		_, err = s.Release(ctx, "rome", id(i), "rome")
		require.NoError(t, err)
	}
	r, err = s.Reservation(ctx, "rome", id(0))
	require.NoError(t, err)
	assert.True(t, r.Live(), "live: not an ended reservation of the cap")
	assert.Len(t, keysLike(t, s, "resv:rome/"), limit+1)
	assertInvariant(t, s)
}

// TestEndedReservationsGoAtRetention: the ended reservations a member keeps,
// and their count, go with the retention; nothing is left of them.
func TestEndedReservationsGoAtRetention(t *testing.T) {
	ctx := context.Background()
	const retention = 300 * time.Millisecond
	s := newStore(t, store.Config{MaxEndedPerMember: 5, Retention: retention})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 30_000, nil))
	require.NoError(t, err)
	for i := range 8 {
		_, err := s.Reserve(ctx, request(fmt.Sprintf("r%d", i), "rome", 100, 0, 0))
		require.NoError(t, err)
		_, err = s.Release(ctx, "rome", fmt.Sprintf("r%d", i), "rome")
		require.NoError(t, err)
	}
	ended, err := s.EndedReservations(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"rome": 5}, ended)
	assert.NotEmpty(t, keysLike(t, s, "ended"))

	time.Sleep(retention + 100*time.Millisecond)
	ended, err = s.EndedReservations(ctx)
	require.NoError(t, err)
	assert.Empty(t, ended, "past the retention: none kept, before any expiry run")
	_, _, err = s.Expire(ctx)
	require.NoError(t, err)
	assert.Empty(t, keysLike(t, s, "resv:"))
	assert.Empty(t, keysLike(t, s, "ended"), "the requester's set expired, the expiry run dropped it from ended-requesters")
	assertInvariant(t, s)
}

// keysWithoutLifetime lists the keys of s's Redis that would stay for ever
// though nothing owns them: every key is either the federation's (its
// clusters, the candidate index, the structures every operation keeps), a
// live reservation's (in the expiry index) or has a lifetime of its own
// (PTTL: an ended reservation, a requester's ended set, a waiting request,
// an event stream, a rate state).
func keysWithoutLifetime(t *testing.T, s *store.Store) []string {
	t.Helper()
	ctx := context.Background()
	a := admin(t, s)
	var out []string
	for _, k := range allKeys(t, s) {
		name := strings.TrimPrefix(k, s.Key())
		family, _, _ := strings.Cut(name, ":")
		switch family {
		case "cluster", "clusters", "nodes", "node-resv", "node-listed", "idx", "expiry", "usage",
			"waiting", "wait-due", "audit", "by-target", "by-requester", "clock", "ended-requesters":
			continue
		case "resv":
			if _, err := a.ZScore(ctx, s.Key("expiry"), strings.TrimPrefix(name, "resv:")).Result(); err == nil {
				continue
			}
		}
		ttl, err := a.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if ttl <= 0 {
			out = append(out, k)
		}
	}
	return out
}
