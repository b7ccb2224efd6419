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

// waitingSetup: rome and lyon are full (1 core each), paris has 2 cores,
// half held by "hold" (lyon's): a 2-core request fits nowhere until hold is
// released.
func waitingSetup(t *testing.T, ttl time.Duration) *store.Store {
	t.Helper()
	ctx := context.Background()
	s := newStore(t, store.Config{WaitTTL: ttl})
	for id, ad := range map[string]model.Advertisement{"rome": cluster(1, 4, 0, 1, nil), "paris": cluster(2, 8, 0, 1, nil), "lyon": cluster(1, 4, 0, 1, nil)} {
		_, err := s.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	_, err := s.Reserve(ctx, request("hold", "lyon", 1000, 1, 0))
	require.NoError(t, err)
	return s
}

func waitingMembers(t *testing.T, s *store.Store) []string {
	t.Helper()
	m, err := s.Client().ZRange(context.Background(), s.Key("waiting"), 0, -1).Result()
	require.NoError(t, err)
	return m
}

// TestNoWaitRequest: a request refused with NoWait (v1: seed agents never
// retry an id) takes no place on the waiting list, so it defers nobody once
// it would fit; it still passes the priority gate like any other.
func TestNoWaitRequest(t *testing.T) {
	ctx := context.Background()
	s := waitingSetup(t, time.Minute)
	seed := request("seed-1", "rome", 2000, 1, 0)
	seed.Priority, seed.NoWait = 10, true
	var nf *store.NoFitError
	_, err := s.Reserve(ctx, seed)
	require.ErrorAs(t, err, &nf)
	assert.Empty(t, waitingMembers(t, s), "a NoWait request does not wait")
	_, err = s.Release(ctx, "lyon", "hold", "lyon")
	require.NoError(t, err)
	for i, p := range []int32{0, 10} {
		r := request(fmt.Sprintf("other-%d", i), "lyon", 500, 1, 0)
		r.Priority = p
		_, err = s.Reserve(ctx, r)
		require.NoError(t, err, "priority %d: nothing waits", p)
	}

	// Behind a waiting request of higher priority that could be placed, a
	// NoWait request is deferred too, and still does not wait.
	s = waitingSetup(t, time.Minute)
	big := request("big", "rome", 2000, 1, 0)
	big.Priority = 10
	_, err = s.Reserve(ctx, big)
	require.ErrorAs(t, err, &nf)
	_, err = s.Release(ctx, "lyon", "hold", "lyon")
	require.NoError(t, err)
	seed = request("seed-2", "lyon", 1000, 1, 0)
	seed.NoWait = true
	_, err = s.Reserve(ctx, seed)
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, map[string]int64{"waiting_higher_priority": 1}, nf.Rejected)
	require.Len(t, waitingMembers(t, s), 1)
	assertInvariant(t, s)
}

// TestWaitingTTL: a waiting request whose requester never comes back leaves
// the list within the TTL (plus a margin) and stops deferring others; one
// whose requester keeps retrying keeps its place (and its age).
func TestWaitingTTL(t *testing.T) {
	ctx := context.Background()
	const ttl = 700 * time.Millisecond
	var nf *store.NoFitError

	// Forgotten: rome asks once and is gone.
	s := waitingSetup(t, ttl)
	big := request("big", "rome", 2000, 1, 0)
	big.Priority = 10
	_, err := s.Reserve(ctx, big)
	require.ErrorAs(t, err, &nf)
	_, err = s.Release(ctx, "lyon", "hold", "lyon")
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("later", "lyon", 1000, 1, 0))
	require.ErrorAs(t, err, &nf, "big fits now: later is deferred")
	assert.Equal(t, map[string]int64{"waiting_higher_priority": 1}, nf.Rejected)
	time.Sleep(ttl + 300*time.Millisecond)
	n, err := s.Client().Exists(ctx, s.Key("wait:rome/big")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "big's entry expired")
	_, err = s.Reserve(ctx, request("later", "lyon", 1000, 1, 0))
	require.NoError(t, err, "the forgotten waiter defers nobody")
	for _, m := range waitingMembers(t, s) {
		assert.NotContains(t, m, ":big", "big left the list when met")
	}
	assertInvariant(t, s)

	// Retrying: rome retries big more often than the TTL, for several TTLs.
	s = waitingSetup(t, ttl)
	_, err = s.Reserve(ctx, big)
	require.ErrorAs(t, err, &nf)
	first := waitingMembers(t, s)
	require.Len(t, first, 1)
	for deadline := time.Now().Add(3 * ttl); time.Now().Before(deadline); {
		time.Sleep(ttl / 3)
		_, err = s.Reserve(ctx, big)
		require.ErrorAs(t, err, &nf)
	}
	assert.Equal(t, first, waitingMembers(t, s), "the same place, not a new one")
	_, err = s.Release(ctx, "lyon", "hold", "lyon")
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("later", "lyon", 1000, 1, 0))
	require.ErrorAs(t, err, &nf, "big still waits: later is deferred")
	d, err := s.Reserve(ctx, big)
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	m := waitingMembers(t, s)
	require.Len(t, m, 1)
	assert.Contains(t, m[0], ":lyon/later", "big left the list; later, deferred, waits")
	assertInvariant(t, s)
}

// TestWaitingGateSkipsForgotten: forgotten waiters, more than the gate looks
// at, do not hide a live waiter of higher priority behind them.
func TestWaitingGateSkipsForgotten(t *testing.T) {
	ctx := context.Background()
	s := waitingSetup(t, time.Minute)
	var nf *store.NoFitError
	for i := range 12 {
		r := request(fmt.Sprintf("gone-%d", i), "rome", 2000, 1, 0)
		r.Priority = 20
		_, err := s.Reserve(ctx, r)
		require.ErrorAs(t, err, &nf)
		require.NoError(t, s.Client().Del(ctx, s.Key(fmt.Sprintf("wait:rome/gone-%d", i))).Err()) // as if expired
	}
	live := request("live", "rome", 2000, 1, 0)
	live.Priority = 10
	_, err := s.Reserve(ctx, live)
	require.ErrorAs(t, err, &nf)
	_, err = s.Release(ctx, "lyon", "hold", "lyon")
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("later", "lyon", 1000, 1, 0))
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, map[string]int64{"waiting_higher_priority": 1}, nf.Rejected, "deferred behind live")
	m := waitingMembers(t, s)
	require.Len(t, m, 2, "the forgotten ones left, live and later wait: %v", m)
}

// TestPriorityWaitingList: requests nothing fits wait; freed capacity
// notifies them; while a waiting request of higher priority could be placed,
// a lower one is deferred even if it asks first; a withdrawn or forgotten
// waiter stops holding others back.
func TestPriorityWaitingList(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{WaitTTL: time.Minute})
	for id, ad := range map[string]model.Advertisement{
		"rome":  cluster(1, 4, 0, 1, nil),
		"lyon":  cluster(1, 4, 0, 1, nil),
		"paris": cluster(4, 64, 0, 1, nil),
	} {
		_, err := s.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	_, err := s.Reserve(ctx, request("fill", "rome", 4000, 1, 0))
	require.NoError(t, err)

	low := request("low", "lyon", 2000, 1, 0)
	high := request("high", "rome", 2000, 1, 0)
	high.Priority = 100
	var nf *store.NoFitError
	_, err = s.Reserve(ctx, low)
	require.ErrorAs(t, err, &nf)
	_, err = s.Reserve(ctx, high)
	require.ErrorAs(t, err, &nf)
	waiting, err := s.Client().ZRange(ctx, s.Key("waiting"), 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, waiting, 2)
	assert.True(t, strings.HasSuffix(waiting[0], ":rome/high"), "highest priority first: %v", waiting)

	// Capacity frees: both requesters hear of it, the higher priority first.
	_, err = s.Release(ctx, "rome", "fill", "rome")
	require.NoError(t, err)
	assert.Contains(t, eventTypes(t, s, "rome"), "CapacityAvailable:high")
	assert.Contains(t, eventTypes(t, s, "lyon"), "CapacityAvailable:low")

	// lyon's agent is quicker, but high could be placed: low is deferred.
	_, err = s.Reserve(ctx, low)
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, map[string]int64{"waiting_higher_priority": 1}, nf.Rejected)
	d, err := s.Reserve(ctx, high)
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	// high left the list, which told low to try again: it fits the rest.
	assert.Equal(t, "CapacityAvailable:low", eventTypes(t, s, "lyon")[len(eventTypes(t, s, "lyon"))-1])
	d, err = s.Reserve(ctx, low)
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	n, err := s.Client().ZCard(ctx, s.Key("waiting")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nobody waits any more")
	assertInvariant(t, s)

	// A waiter withdrawn by its requester (DELETE of a request that never got
	// a reservation) no longer holds a lower priority back.
	urgent := request("urgent", "rome", 2000, 1, 0)
	urgent.Priority = 50
	_, err = s.Reserve(ctx, urgent)
	require.ErrorAs(t, err, &nf) // paris is full again
	_, err = s.Release(ctx, "lyon", "low", "lyon")
	require.NoError(t, err)
	small := request("small", "lyon", 1000, 1, 0)
	_, err = s.Reserve(ctx, small)
	require.ErrorAs(t, err, &nf, "urgent fits now: small waits behind it")
	_, err = s.Release(ctx, "rome", "urgent", "rome")
	require.ErrorIs(t, err, store.ErrNotFound, "it never had a reservation")
	_, err = s.Reserve(ctx, small)
	require.NoError(t, err, "urgent was withdrawn")

	// A forgotten waiter (its requester stopped retrying) expires.
	short := newStore(t, store.Config{WaitTTL: 300 * time.Millisecond})
	for id, ad := range map[string]model.Advertisement{"rome": cluster(1, 4, 0, 1, nil), "paris": cluster(2, 8, 0, 1, nil), "lyon": cluster(1, 4, 0, 1, nil)} {
		_, err := short.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	big := request("big", "rome", 2000, 1, 0)
	big.Priority = 10
	_, err = short.Reserve(ctx, request("hold", "lyon", 1000, 1, 0))
	require.NoError(t, err)
	_, err = short.Reserve(ctx, big)
	require.ErrorAs(t, err, &nf)
	_, err = short.Release(ctx, "lyon", "hold", "lyon")
	require.NoError(t, err)
	_, err = short.Reserve(ctx, request("later", "lyon", 1000, 1, 0))
	require.ErrorAs(t, err, &nf, "big (priority 10) fits now and waits: later (priority 0) is deferred")
	time.Sleep(400 * time.Millisecond) // rome never retries big
	_, err = short.Reserve(ctx, request("later", "lyon", 1000, 1, 0))
	require.NoError(t, err, "the forgotten waiter expired")
}
