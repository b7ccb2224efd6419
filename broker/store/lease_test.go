package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// lease is a request for a lease: hold time hold, lease length length.
func lease(id, requester string, milli int64, hold, length time.Duration) model.ReserveRequest {
	r := request(id, requester, milli, 1, 0)
	r.Duration, r.Lease = hold, length
	return r
}

// snapshot dumps every key of the store (type-aware), to prove that a refused call changed nothing.
func snapshot(t *testing.T, s *store.Store) map[string]string {
	t.Helper()
	ctx := context.Background()
	rdb := admin(t, s)
	keys, err := rdb.Keys(ctx, s.Key("*")).Result()
	require.NoError(t, err)
	out := map[string]string{}
	for _, k := range keys {
		var v any
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "hash":
			v = rdb.HGetAll(ctx, k).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "set":
			m := rdb.SMembers(ctx, k).Val()
			sort.Strings(m)
			v = m
		case "stream":
			v = rdb.XRange(ctx, k, "-", "+").Val()
		default:
			v = rdb.Dump(ctx, k).Val()
		}
		data, _ := json.Marshal(v)
		out[k] = string(data)
	}
	return out
}

// expiryOf reads a reservation's end: its score in the expiry zset and the
// end the store reads back (what the API shows).
func expiryOf(t *testing.T, s *store.Store, requester, id string) (score float64, shown int64) {
	t.Helper()
	ctx := context.Background()
	qid := model.QualifiedID(requester, id)
	score, err := s.Client().ZScore(ctx, s.Key("expiry"), qid).Result()
	require.NoError(t, err, "%s in the expiry zset", qid)
	r, err := s.Reservation(ctx, requester, id)
	require.NoError(t, err)
	return score, r.ExpiresAt.UnixMilli()
}

// TestScopedIDs: two requesters may use the same id and get two
// reservations; neither can read, release, renew or grant the other's.
func TestScopedIDs(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	a, err := s.Reserve(ctx, lease("same", "rome", 1000, time.Hour, time.Minute))
	require.NoError(t, err)
	b, err := s.Reserve(ctx, lease("same", "milan", 2000, time.Hour, time.Minute))
	require.NoError(t, err)
	assert.False(t, b.Replayed, "milan's id is its own, not rome's replayed")
	assert.Equal(t, "same", a.Reservation.ID)
	assert.Equal(t, "same", b.Reservation.ID)
	members := s.Client().ZRange(ctx, s.Key("expiry"), 0, -1).Val()
	assert.ElementsMatch(t, []string{"rome/same", "milan/same"}, members)
	assert.ElementsMatch(t, []string{"rome/same", "milan/same"}, s.Client().SMembers(ctx, s.Key("by-target:paris")).Val())
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(3000), c.Reserved.CPU, "both hold capacity")
	for requester, cpu := range map[string]int64{"rome": 1000, "milan": 2000} {
		r, err := s.Reservation(ctx, requester, "same")
		require.NoError(t, err)
		assert.Equal(t, requester, r.Requester)
		assert.Equal(t, cpu, r.Resources.CPU)
	}
	types := eventTypes(t, s, "paris")
	assert.Equal(t, []string{"Reserved:same", "Reserved:same"}, types, "events carry the bare id (and the requester)")

	before := snapshot(t, s)
	_, err = s.Release(ctx, "rome", "same", "milan")
	assert.ErrorIs(t, err, store.ErrForbidden, "milan cannot release rome's")
	_, err = s.Grant(ctx, "rome", "same", "milan", json.RawMessage(`{}`))
	assert.ErrorIs(t, err, store.ErrForbidden, "nor grant it")
	_, err = s.Reservation(ctx, "berlin", "same")
	assert.ErrorIs(t, err, store.ErrNotFound, "berlin has no id same")
	rn, err := s.Renew(ctx, "berlin", []string{"same"})
	require.NoError(t, err)
	assert.Equal(t, []model.Renewal{{ID: "same", Outcome: model.RenewNotFound}}, rn, "renewals are the caller's own ids only")
	assert.Equal(t, before, snapshot(t, s), "refused calls changed nothing")

	// rome releases its own; milan's lives on.
	res, err := s.Release(ctx, "rome", "same", "rome")
	require.NoError(t, err)
	assert.True(t, res.Released)
	assert.Zero(t, res.Reservation.Remaining, "ended: nothing remains")
	r, err := s.Reservation(ctx, "milan", "same")
	require.NoError(t, err)
	assert.True(t, r.Live())
	assert.Greater(t, r.Remaining, 59*time.Minute)
	assertInvariant(t, s)
}

// TestRenew: a renewal extends a lease to broker-now + lease (its expiry
// score, which every read shows), never shortens it, and refuses ended, fixed-duration
// and unknown ids without changing them, all in one batch.
func TestRenew(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	short, err := s.Reserve(ctx, lease("short-hold", "rome", 500, 200*time.Millisecond, 10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, short.Reservation.Lease)
	assert.Equal(t, 200*time.Millisecond, short.Reservation.Duration, "the hold time")
	_, err = s.Reserve(ctx, lease("long-hold", "rome", 500, time.Hour, 10*time.Second))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("fixed", "rome", 500, 1, 0))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, lease("gone", "rome", 500, time.Hour, time.Minute))
	require.NoError(t, err)
	_, err = s.Release(ctx, "rome", "gone", "rome")
	require.NoError(t, err)
	_, err = s.Reserve(ctx, lease("milans", "milan", 500, time.Hour, time.Minute))
	require.NoError(t, err)

	_, longShown := expiryOf(t, s, "rome", "long-hold")
	fixedScore, fixedShown := expiryOf(t, s, "rome", "fixed")
	shortScore, _ := expiryOf(t, s, "rome", "short-hold")
	gone := s.Client().HGetAll(ctx, s.Key("resv:", "rome/gone")).Val()
	milans := s.Client().HGetAll(ctx, s.Key("resv:", "milan/milans")).Val()
	events := len(eventTypes(t, s, "rome")) + len(eventTypes(t, s, "paris"))

	rn, err := s.Renew(ctx, "rome", []string{"short-hold", "long-hold", "fixed", "gone", "unknown", "milans"})
	require.NoError(t, err)
	outcomes := map[string]model.RenewOutcome{}
	for _, r := range rn {
		outcomes[r.ID] = r.Outcome
	}
	assert.Equal(t, map[string]model.RenewOutcome{"short-hold": model.Renewed, "long-hold": model.Renewed,
		"fixed": model.RenewNotALease, "gone": model.RenewEnded, "unknown": model.RenewNotFound, "milans": model.RenewNotFound}, outcomes)
	assert.InDelta(t, 10*time.Second, rn[0].Remaining, float64(time.Second), "renewed to now + lease")
	assert.Greater(t, rn[1].Remaining, 59*time.Minute, "not shortened to the lease")
	for _, r := range rn[2:] {
		assert.Zero(t, r.Remaining, r.ID)
	}

	score, shown := expiryOf(t, s, "rome", "short-hold")
	assert.Equal(t, float64(shown), score, "the end read back is the expiry score")
	assert.Greater(t, score, shortScore+5000, "extended")
	_, shown = expiryOf(t, s, "rome", "long-hold")
	assert.Equal(t, longShown, shown, "a renewal never shortens an expiry")
	score, shown = expiryOf(t, s, "rome", "fixed")
	assert.Equal(t, [2]int64{int64(fixedScore), fixedShown}, [2]int64{int64(score), shown}, "fixed: unchanged")
	assert.Equal(t, gone, s.Client().HGetAll(ctx, s.Key("resv:", "rome/gone")).Val(), "ended: unchanged")
	assert.Equal(t, milans, s.Client().HGetAll(ctx, s.Key("resv:", "milan/milans")).Val(), "milan's: unchanged")
	assert.Equal(t, events, len(eventTypes(t, s, "rome"))+len(eventTypes(t, s, "paris")), "no event per renewal")

	// The short hold is past, but the renewal carried the lease on.
	time.Sleep(300 * time.Millisecond)
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	r, err := s.Reservation(ctx, "rome", "short-hold")
	require.NoError(t, err)
	assert.True(t, r.Live())
	assertInvariant(t, s)
}

// TestLeaseExpiresAtHoldTime: a lease nobody renews ends at its hold time;
// once expired it cannot be renewed; a lease past its end but not yet
// expired is refused too (Ended), and nothing is revived.
func TestLeaseExpiresAtHoldTime(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	d, err := s.Reserve(ctx, lease("unbound", "rome", 1000, 300*time.Millisecond, time.Minute))
	require.NoError(t, err)
	assert.InDelta(t, 300*time.Millisecond, d.Reservation.Remaining, float64(5*time.Millisecond), "the hold time, on the broker's clock")
	_, err = s.Reserve(ctx, lease("late", "rome", 1000, 300*time.Millisecond, time.Minute))
	require.NoError(t, err)

	time.Sleep(400 * time.Millisecond)
	rn, err := s.Renew(ctx, "rome", []string{"late"})
	require.NoError(t, err)
	assert.Equal(t, model.RenewEnded, rn[0].Outcome, "past its end on the broker's clock: too late")
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "both expired at their hold time")
	for _, id := range []string{"unbound", "late"} {
		r, err := s.Reservation(ctx, "rome", id)
		require.NoError(t, err)
		assert.Equal(t, model.PhaseExpired, r.Phase, id)
		assert.Zero(t, r.Remaining, id)
	}
	rn, err = s.Renew(ctx, "rome", []string{"unbound"})
	require.NoError(t, err)
	assert.Equal(t, model.RenewEnded, rn[0].Outcome)
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, c.Reserved, "capacity back")
	assertInvariant(t, s)
}

// TestLeaseInvariantUnderConcurrency: reservations, renewals, releases and
// expiry from many goroutines at once (short holds, some leases renewed,
// some left to lapse) keep the accounting invariant.
func TestLeaseInvariantUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for i := range 6 {
		_, err := s.Advertise(ctx, fmt.Sprintf("p%d", i), cluster(16, 64, 0, int64(1_000+i*100), nil))
		require.NoError(t, err)
	}
	requesters := []string{"rome", "milan", "lyon"}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { // the expiry timer of every broker replica
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, clamped, err := s.Expire(ctx)
			assert.NoError(t, err)
			assert.Zero(t, clamped)
		}
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 15))
			requester := requesters[w%len(requesters)]
			var mine []string
			for i := range 150 {
				switch op := rng.IntN(10); {
				case op < 5 || len(mine) == 0:
					id := fmt.Sprintf("w%d-%d", w, rng.IntN(200)) // ids reused across requesters and rounds
					req := lease(id, requester, 500+rng.Int64N(4000), time.Duration(20+rng.IntN(80))*time.Millisecond, time.Duration(1+rng.IntN(3))*time.Second)
					if rng.IntN(4) == 0 {
						req.Lease = 0 // fixed
					}
					_, err := s.Reserve(ctx, req)
					var nf *store.NoFitError
					if err != nil && !errors.As(err, &nf) && !errors.Is(err, store.ErrConflict) {
						t.Errorf("reserve %s: %v", id, err)
					}
					mine = append(mine, id)
				case op < 8:
					_, err := s.Renew(ctx, requester, mine[max(0, len(mine)-20):])
					assert.NoError(t, err)
				default:
					id := mine[rng.IntN(len(mine))]
					_, err := s.Release(ctx, requester, id, requester)
					if err != nil && !errors.Is(err, store.ErrNotFound) {
						t.Errorf("release %s: %v", id, err)
					}
				}
				if i%50 == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	assertInvariant(t, s)
	// Everything lapses: nobody renews any more.
	time.Sleep(3100 * time.Millisecond)
	_, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Zero(t, s.Client().ZCard(ctx, s.Key("expiry")).Val(), "every lease and hold ended")
	for i := range 6 {
		c, err := s.Cluster(ctx, fmt.Sprintf("p%d", i))
		require.NoError(t, err)
		assert.Equal(t, model.Resources{}, c.Reserved, c.ID)
	}
	assertInvariant(t, s)
}

// TestReindexMovesOlderLayout: live reservations written by a broker before
// scoped ids (keys and members named by the bare id) are moved to the
// qualified ones at start-up, and stay readable, renewable and releasable.
func TestReindexMovesOlderLayout(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	rdb := s.Client()
	ad := cluster(8, 32, 0, 1_000, nil)
	ad.Nodes = []model.NodeCapacity{{Name: "n1", Allocatable: ad.Allocatable}}
	_, err := s.Advertise(ctx, "paris", ad)
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("old", "rome", 1000, 1, 0))
	require.NoError(t, err)
	ad.ReservationsOnNodes = []string{"rome/old"}
	_, err = s.Advertise(ctx, "paris", ad)
	require.NoError(t, err)
	// Rewrite it as the older layout had it.
	score := rdb.ZScore(ctx, s.Key("expiry"), "rome/old").Val()
	pipe := admin(t, s).TxPipeline()
	pipe.Rename(ctx, s.Key("resv:rome/old"), s.Key("resv:old"))
	pipe.ZRem(ctx, s.Key("expiry"), "rome/old")
	pipe.ZAdd(ctx, s.Key("expiry"), redis.Z{Score: score, Member: "old"})
	for _, k := range []string{"by-target:paris", "by-requester:rome", "node-listed:paris"} {
		pipe.SRem(ctx, s.Key(k), "rome/old")
		pipe.SAdd(ctx, s.Key(k), "old")
	}
	pipe.ZAdd(ctx, s.Key("waiting"), redis.Z{Score: 0, Member: "000000000000000001:w"})
	pipe.HSet(ctx, s.Key("wait:w"), "requester", "rome", "member", "000000000000000001:w")
	pipe.Set(ctx, s.Key("idx:version"), "3", 0)
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	require.NoError(t, store.New(rdb, store.Config{}).LoadScripts(ctx), "start-up of the newer broker")
	assert.Equal(t, []string{"rome/old"}, rdb.ZRange(ctx, s.Key("expiry"), 0, -1).Val())
	for _, k := range []string{"by-target:paris", "by-requester:rome", "node-listed:paris"} {
		assert.Equal(t, []string{"rome/old"}, rdb.SMembers(ctx, s.Key(k)).Val(), k)
	}
	assert.Zero(t, rdb.Exists(ctx, s.Key("resv:old"), s.Key("wait:w")).Val())
	assert.Zero(t, rdb.ZCard(ctx, s.Key("waiting")).Val(), "waiting entries of the older layout dropped")
	r, err := s.Reservation(ctx, "rome", "old")
	require.NoError(t, err)
	assert.True(t, r.Live())
	assertInvariant(t, s)
	rn, err := s.Renew(ctx, "rome", []string{"old"})
	require.NoError(t, err)
	assert.Equal(t, model.RenewNotALease, rn[0].Outcome)
	res, err := s.Release(ctx, "rome", "old", "rome")
	require.NoError(t, err)
	assert.True(t, res.Released)
	assertInvariant(t, s)
}

func TestIdempotentReserveAndRelease(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)

	first, err := s.Reserve(ctx, request("r1", "rome", 3000, 4, 0))
	require.NoError(t, err)
	assert.False(t, first.Replayed)
	again, err := s.Reserve(ctx, request("r1", "rome", 3000, 4, 0))
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	assert.LessOrEqual(t, again.Reservation.Remaining, first.Reservation.Remaining, "measured at each answer")
	again.Reservation.Remaining = first.Reservation.Remaining
	assert.Equal(t, first.Reservation, again.Reservation)
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{CPU: 3000, Memory: 4 * gi}, c.Reserved, "locked once")

	other, err := s.Reserve(ctx, request("r1", "milan", 1000, 1, 0))
	require.NoError(t, err, "ids are scoped per requester: milan's r1 is another reservation")
	assert.False(t, other.Replayed)
	_, err = s.Reserve(ctx, request("r1", "rome", 3000, 8, 0))
	assert.ErrorIs(t, err, store.ErrConflict, "same id, other amounts")

	_, err = s.Release(ctx, "rome", "r1", "milan")
	assert.ErrorIs(t, err, store.ErrForbidden, "milan is no party to rome's r1")
	_, err = s.Release(ctx, "milan", "r1", "milan")
	require.NoError(t, err, "its own r1")
	res, err := s.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	assert.True(t, res.Released)
	assert.Equal(t, model.PhaseReleased, res.Reservation.Phase)
	res, err = s.Release(ctx, "rome", "r1", "paris")
	require.NoError(t, err)
	assert.False(t, res.Released, "second release changes nothing")
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, c.Reserved, "both freed once, not below zero")
	_, err = s.Release(ctx, "rome", "nope", "rome")
	assert.ErrorIs(t, err, store.ErrNotFound)
	assertInvariant(t, s)
}

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	short := request("short", "rome", 2000, 2, 0)
	short.Duration = 150 * time.Millisecond
	_, err = s.Reserve(ctx, short)
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("long", "rome", 1000, 1, 0))
	require.NoError(t, err)

	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is due yet")
	time.Sleep(200 * time.Millisecond)
	n, clamped, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Zero(t, clamped)

	r, err := s.Reservation(ctx, "rome", "short")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseExpired, r.Phase)
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{CPU: 1000, Memory: gi}, c.Reserved, "the expired capacity came back")
	// The requester and the provider were both told.
	for _, who := range []string{"rome", "paris"} {
		evs, err := s.ReadEvents(ctx, who, "0", 10, 0)
		require.NoError(t, err)
		require.Len(t, evs, 3, who)
		assert.Equal(t, []string{"Reserved", "Reserved", "Expired"}, []string{evs[0].Type, evs[1].Type, evs[2].Type})
		assert.Equal(t, "short", evs[2].Reservation)
	}
	assertInvariant(t, s)
}
