package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// The broker tried as a hostile or careless member would: each
// test is one way a member could take more than its share, or leave state
// behind, without sending anything invalid.

// mustPolicy parses a policy file body (apiVersion and kind added).
func mustPolicy(t *testing.T, body string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n" + body))
	require.NoError(t, err)
	return p
}

// TestAbuseOneMemberReservesAllCapacity: mallory asks for every core of the
// federation at once (one batch, as concurrent calls are decided); its
// limits stop it at its share in the same atomic step, and rome, asking
// after it, gets capacity.
func TestAbuseOneMemberReservesAllCapacity(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{Policy: mustPolicy(t, `
requesters:
  default: {maxResources: {cpu: "8"}, maxReservations: 20}
  clusters:
    lyon: {maxReservations: 3}
`)})
	for _, id := range []string{"paris", "berlin"} {
		_, err := s.Advertise(ctx, id, cluster(20, 80, 0, 30_000, nil))
		require.NoError(t, err)
	}
	reqs := make([]model.ReserveRequest, 40)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("grab-%d", i), "mallory", 1000, 1, 0)
	}
	decisions, errs := s.ReserveBatch(ctx, reqs)
	var placed, limited int
	for i, err := range errs {
		var le *store.LimitError
		switch {
		case err == nil:
			placed++
			assert.NotEmpty(t, decisions[i].Reservation.Target)
		case assert.ErrorAs(t, err, &le):
			limited++
			assert.Equal(t, "cpu", le.Limit)
			assert.Equal(t, store.LimitRetryAfter, le.RetryAfter)
			assert.Equal(t, "requester mallory is at its limit of reserved cpu: holds 8, asks 1 more, limit 8", le.Error())
		}
	}
	assert.Equal(t, 8, placed, "mallory gets its share, not the federation")
	assert.Equal(t, 32, limited)

	// Concurrent calls (several batches, two in flight) stop at the same share.
	var wg sync.WaitGroup
	var mu sync.Mutex
	more := 0
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Reserve(ctx, request(fmt.Sprintf("again-%d", i), "mallory", 1000, 1, 0)); err == nil {
				mu.Lock()
				more++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, more, "mallory is at its limit")

	d, err := s.Reserve(ctx, request("honest", "rome", 4000, 8, 0))
	require.NoError(t, err, "rome's request fits what mallory could not take")
	assert.NotEmpty(t, d.Reservation.Target)

	// The count limit of an override, and a retry of a placed id (a replay) is not counted again.
	for i := range 3 {
		_, err := s.Reserve(ctx, request(fmt.Sprintf("l-%d", i), "lyon", 100, 1, 0))
		require.NoError(t, err)
	}
	_, err = s.Reserve(ctx, request("l-0", "lyon", 100, 1, 0))
	require.NoError(t, err, "a replay")
	_, err = s.Reserve(ctx, request("l-3", "lyon", 100, 1, 0))
	var le *store.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "reservations", le.Limit)
	assert.Equal(t, "requester lyon is at its limit of live reservations: holds 3, asks 1 more, limit 3", le.Error())

	// Released capacity counts no more: lyon may reserve again.
	_, err = s.Release(ctx, "lyon", "l-1", "lyon")
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("l-3", "lyon", 100, 1, 0))
	require.NoError(t, err)

	usage, err := s.Usage(ctx)
	require.NoError(t, err)
	assert.Equal(t, model.Usage{Reservations: 8, Resources: model.Resources{CPU: 8000, Memory: 8 * gi}}, usage["mallory"])
	assert.Equal(t, int64(3), usage["lyon"].Reservations)
	assertInvariant(t, s)
}

// TestAbuseReserveRate: a requester's reserve calls beyond its rate (replays
// and refusals included) are refused with the time until the next one is
// allowed; another requester's are not slowed.
func TestAbuseReserveRate(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{Policy: mustPolicy(t, `
requesters:
  default: {reservesPerSecond: 1000}
  clusters:
    mallory: {reservesPerSecond: 2, reserveBurst: 5}
`)})
	_, err := s.Advertise(ctx, "paris", cluster(64, 256, 0, 30_000, nil))
	require.NoError(t, err)
	reqs := make([]model.ReserveRequest, 0, 40)
	for i := range 20 {
		reqs = append(reqs, request(fmt.Sprintf("m-%d", i), "mallory", 100, 1, 0), request(fmt.Sprintf("r-%d", i), "rome", 100, 1, 0))
	}
	_, errs := s.ReserveBatch(ctx, reqs)
	var mallory, rome int
	for i, err := range errs {
		var le *store.LimitError
		if reqs[i].Requester == "rome" {
			require.NoError(t, err)
			rome++
			continue
		}
		if err == nil {
			mallory++
			continue
		}
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "rate", le.Limit)
		assert.InDelta(t, 500, le.RetryAfter.Milliseconds(), 2, "one interval of a 2/s rate: %s", le.Error())
	}
	assert.Equal(t, 5, mallory, "the burst")
	assert.Equal(t, 20, rome)
	time.Sleep(600 * time.Millisecond)
	_, err = s.Reserve(ctx, request("m-after", "mallory", 100, 1, 0))
	require.NoError(t, err, "one interval later, one more call")
	_, err = s.Reserve(ctx, request("m-after", "mallory", 100, 1, 0))
	require.ErrorAs(t, err, new(*store.LimitError), "a replay is a call too")
	assertInvariant(t, s)
}

// TestAbuseHighestPriorityBlocksEveryone: mallory's requests at the highest
// priority waited for capacity and, once it was freed, deferred everyone's
// fitting requests. The ceiling clamps its priority; and a waiting request
// whose requester is at its limits cannot be placed, so it defers nobody.
func TestAbuseHighestPriorityBlocksEveryone(t *testing.T) {
	ctx := context.Background()
	var nf *store.NoFitError
	setup := func(t *testing.T, p *policy.Policy) *store.Store {
		s := newStore(t, store.Config{WaitTTL: time.Minute, Policy: p})
		_, err := s.Advertise(ctx, "paris", cluster(5, 16, 0, 30_000, nil))
		require.NoError(t, err)
		_, err = s.Reserve(ctx, request("hold", "rome", 3000, 1, 0))
		require.NoError(t, err)
		return s
	}

	t.Run("ceiling", func(t *testing.T) {
		s := setup(t, mustPolicy(t, "requesters: {default: {maxPriority: 0}}"))
		big := request("big", "mallory", 4000, 1, 0)
		big.Priority = math.MaxInt32
		_, err := s.Reserve(ctx, big)
		require.ErrorAs(t, err, &nf)
		_, err = s.Release(ctx, "rome", "hold", "rome")
		require.NoError(t, err)
		d, err := s.Reserve(ctx, request("fair", "lyon", 1000, 1, 0))
		require.NoError(t, err, "mallory's request waits at the ceiling, lyon's equal priority is not deferred")
		assert.Equal(t, "paris", d.Reservation.Target)
		m := waitingMembers(t, s)
		require.Len(t, m, 1)
		score, err := s.Client().ZScore(ctx, s.Key("waiting"), m[0]).Result()
		require.NoError(t, err)
		assert.Zero(t, score, "waits at priority 0, the ceiling")

		_, err = s.Release(ctx, "lyon", "fair", "lyon")
		require.NoError(t, err)
		d, err = s.Reserve(ctx, big)
		require.NoError(t, err)
		assert.Equal(t, int32(0), d.Reservation.Priority, "stored at the ceiling")
		entries, err := admin(t, s).XRevRangeN(ctx, s.Key("audit"), "+", "-", 1).Result()
		require.NoError(t, err)
		assert.Contains(t, entries[0].Values["request"], `"priority_asked":"2147483647"`, "the audit keeps what was asked")
		assertInvariant(t, s)
	})

	t.Run("at its limits", func(t *testing.T) {
		s := setup(t, mustPolicy(t, "requesters: {clusters: {mallory: {maxReservations: 1}}}"))
		big := request("big", "mallory", 4000, 1, 0)
		big.Priority = 100
		_, err := s.Reserve(ctx, big)
		require.ErrorAs(t, err, &nf)
		small := request("small", "mallory", 1000, 1, 0)
		small.Priority = 100
		_, err = s.Reserve(ctx, small)
		require.NoError(t, err, "mallory's one reservation: 1 core left of 5")
		_, err = s.Release(ctx, "rome", "hold", "rome")
		require.NoError(t, err)
		_, err = s.Reserve(ctx, request("fair", "lyon", 1000, 1, 0))
		require.NoError(t, err, "big would fit, but mallory is at its limit: it defers nobody")
		_, err = s.Reserve(ctx, big)
		var le *store.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "reservations", le.Limit)
		assert.Empty(t, waitingMembers(t, s), "refused by its limits: off the waiting list")
		assertInvariant(t, s)
	})
}

// allKeys lists every key of s's Redis (the administrator's SCAN: the
// broker's user may not enumerate keys).
func allKeys(t *testing.T, s *store.Store) []string {
	t.Helper()
	var keys []string
	iter := admin(t, s).Scan(context.Background(), 0, "*", 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	return keys
}

func sorted(keys []string) []string {
	slices.Sort(keys)
	return keys
}

// keysLike lists the keys that start with s's prefix and then prefix.
func keysLike(t *testing.T, s *store.Store, prefix string) []string {
	var out []string
	for _, k := range allKeys(t, s) {
		if strings.HasPrefix(k, s.Key(prefix)) {
			out = append(out, k)
		}
	}
	return out
}

// TestAbuseWaitingNeverSwept: requests that waited and whose requester went
// away left their members on the waiting list for ever (dropped only when a
// later decision happened to meet them). The expiry run sweeps them.
func TestAbuseWaitingNeverSwept(t *testing.T) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	s := newStore(t, store.Config{WaitTTL: ttl, ExpireBatch: 16}) // several expiry runs
	_, err := s.Advertise(ctx, "paris", cluster(2, 8, 0, 30_000, nil))
	require.NoError(t, err)
	for i := range 50 {
		_, err := s.Reserve(ctx, request(fmt.Sprintf("gone-%d", i), "mallory", 4000, 1, 0))
		require.ErrorAs(t, err, new(*store.NoFitError))
	}
	require.Len(t, waitingMembers(t, s), 50)
	time.Sleep(ttl + 100*time.Millisecond)
	for range 4 { // 16 members per run
		_, _, err = s.Expire(ctx)
		require.NoError(t, err)
	}
	assert.Empty(t, waitingMembers(t, s), "swept with their requests")
	assert.Empty(t, keysLike(t, s, "wait"), "no wait:*, waiting or wait-due key left")
	assertInvariant(t, s)
}

// TestAbuseEndedReservationsKept24h: an ended reservation stayed 24 h; now
// it stays the retention (10 minutes by default), and then goes.
func TestAbuseEndedReservationsKept24h(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 30_000, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	_, err = s.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	ttl, err := admin(t, s).PTTL(ctx, s.Key("resv:rome/r1")).Result()
	require.NoError(t, err)
	assert.True(t, ttl > 9*time.Minute && ttl <= store.DefaultRetention, "kept %s", ttl)

	s = newStore(t, store.Config{Retention: 300 * time.Millisecond})
	_, err = s.Advertise(ctx, "paris", cluster(8, 32, 0, 30_000, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	_, err = s.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	r, err := s.Reservation(ctx, "rome", "r1")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseReleased, r.Phase, "readable while retained")
	time.Sleep(400 * time.Millisecond)
	_, err = s.Reservation(ctx, "rome", "r1")
	assert.ErrorIs(t, err, store.ErrNotFound)
	assert.Empty(t, keysLike(t, s, "resv:"))
}

// TestAbuseAuditGrows: the audit stream kept its 100,000 newest decisions
// whatever their age, and a cluster's event stream stayed after the cluster
// was gone. The audit is now capped and trimmed to its retention, and a
// stream without events for the events TTL goes.
func TestAbuseAuditGrows(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{AuditMaxLen: 100, AuditRetention: 500 * time.Millisecond, EventsTTL: 500 * time.Millisecond})
	_, err := s.Advertise(ctx, "paris", cluster(64, 256, 0, 30_000, nil))
	require.NoError(t, err)
	for i := range 500 {
		_, err := s.Reserve(ctx, request(fmt.Sprintf("r%d", i), "rome", 10, 0, 0))
		require.NoError(t, err)
	}
	a := admin(t, s)
	n, err := a.XLen(ctx, s.Key("audit")).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, n, int64(200), "capped near AuditMaxLen (whole stream nodes of 100 are trimmed)")
	assert.Equal(t, []string{s.Key("events:paris"), s.Key("events:rome")}, sorted(keysLike(t, s, "events:")))
	time.Sleep(600 * time.Millisecond)
	_, _, err = s.Expire(ctx)
	require.NoError(t, err)
	n, err = a.XLen(ctx, s.Key("audit")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "every decision is older than the retention")
	assert.Empty(t, keysLike(t, s, "events:"), "no event for the events TTL: the streams went")
	d, err := s.Reserve(ctx, request("again", "rome", 10, 0, 0))
	require.NoError(t, err)
	events, err := s.ReadEvents(ctx, "rome", "0", 10, 0)
	require.NoError(t, err)
	require.Len(t, events, 1, "a new stream")
	assert.Equal(t, d.Reservation.ID, events[0].Reservation)
}

// TestAbuseGrantTokenInClear: a provider's grant (its tenant's bearer token)
// was stored in clear in Redis and its append-only file for 24 h. It is
// sealed before it reaches Redis (the pair's access: scripts/lib/grants.lua),
// opens for the requester, goes when the reservation ends, and opens with no
// other key.
func TestAbuseGrantTokenInClear(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.WithAppendOnly())
	keys, err := store.NewGrantKeys([]byte(strings.Repeat("k", store.GrantKeySize)))
	require.NoError(t, err)
	s := store.New(srv.Client(), store.Config{GrantKeys: keys})
	require.NoError(t, s.LoadScripts(ctx))
	_, err = s.Advertise(ctx, "paris", cluster(8, 32, 0, 30_000, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	const token = "eyJhbGciOiJSUzI1NiJ9.the-tenant-token-of-rome"
	grant, err := json.Marshal(map[string]string{"endpoint": "https://paris:6443", "token": token, "namespace": "rb-rome"})
	require.NoError(t, err)
	_, err = s.Grant(ctx, "rome", "r1", "paris", grant)
	require.NoError(t, err)

	r, err := s.Reservation(ctx, "rome", "r1")
	require.NoError(t, err)
	assert.JSONEq(t, string(grant), string(r.Grant), "the requester reads it")
	stored, err := srv.AdminClient().HGet(ctx, s.Key("grant:paris:rome"), "sealed").Result()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(stored, "v1."), "sealed: %.40s", stored)
	assertNowhere(t, srv, token)

	// Another broker without the key cannot open it, and says why.
	other := store.New(srv.Client(), store.Config{})
	_, err = other.Reservation(ctx, "rome", "r1")
	assert.ErrorContains(t, err, "give every replica the same --grant-key-file")

	_, err = s.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	exists, err := srv.AdminClient().Exists(ctx, s.Key("grant:paris:rome")).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "the access goes when the pair's last reservation ends")
	r, err = s.Reservation(ctx, "rome", "r1")
	require.NoError(t, err)
	assert.Empty(t, r.Grant)
}

// assertNowhere checks that no value of srv's Redis, and nothing in its
// data directory (the append-only file), contains secret.
func assertNowhere(t *testing.T, srv *redistest.Server, secret string) {
	t.Helper()
	ctx := context.Background()
	a := srv.AdminClient()
	iter := a.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		var dump []string
		switch a.Type(ctx, k).Val() {
		case "hash":
			for f, v := range a.HGetAll(ctx, k).Val() {
				dump = append(dump, f, v)
			}
		case "stream":
			for _, m := range a.XRange(ctx, k, "-", "+").Val() {
				dump = append(dump, fmt.Sprint(m.Values))
			}
		case "string":
			dump = append(dump, a.Get(ctx, k).Val())
		case "set":
			dump = append(dump, a.SMembers(ctx, k).Val()...)
		case "zset":
			dump = append(dump, a.ZRange(ctx, k, 0, -1).Val()...)
		}
		for _, v := range dump {
			assert.NotContains(t, v, secret, "key %s", k)
		}
	}
	require.NoError(t, iter.Err())
	require.NoError(t, a.Do(ctx, "BGREWRITEAOF").Err())
	require.NoError(t, filepath.WalkDir(srv.Dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		assert.NotContains(t, string(data), secret, "file %s", path)
		return nil
	}))
}

// TestAbuseAllocatedOverAllocatable: an advertisement with more allocated
// than allocatable was stored, showing negative free capacity; it is refused
// and nothing is stored.
func TestAbuseAllocatedOverAllocatable(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	ad := cluster(4, 16, 0, 30_000, nil)
	ad.Allocated = model.Resources{CPU: 6000, Memory: gi}
	_, err := s.Advertise(ctx, "paris", ad)
	require.ErrorIs(t, err, model.ErrInvalid)
	assert.EqualError(t, err, "invalid advertisement: allocated cpu 6 exceeds allocatable 4: free capacity cannot be negative")
	_, err = s.Cluster(ctx, "paris")
	assert.ErrorIs(t, err, store.ErrNotFound, "nothing stored")
}

// TestAbuseLiarProvider: a member that declared a huge capacity at price 0
// won every decision. Outside the operator's bounds, its advertisement is
// refused (nothing stored), and the decision goes to an honest provider.
func TestAbuseLiarProvider(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{Policy: mustPolicy(t, `
providers:
  default:
    maxCapacity: {cpu: "128", memory: 512Gi}
    prices: {cpu: {min: "0.01"}, memory: {min: "0.001"}}
`)})
	liar := cluster(100_000, 400_000, 0, 0, nil)
	_, err := s.Advertise(ctx, "mallory", liar)
	var be *model.BoundError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "providers.default.maxCapacity.cpu", be.Bound)
	liar = cluster(128, 512, 0, 0, nil)
	_, err = s.Advertise(ctx, "mallory", liar)
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "providers.default.prices.cpu.min", be.Bound)
	assert.Equal(t, "advertised price of cpu 0 is below the least allowed, 10m (operator bound providers.default.prices.cpu.min)", be.Error())
	_, err = s.Cluster(ctx, "mallory")
	require.ErrorIs(t, err, store.ErrNotFound, "nothing stored")

	_, err = s.Advertise(ctx, "paris", cluster(16, 64, 0, 30_000, nil))
	require.NoError(t, err)
	d, err := s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
}

// TestAbuseGroupCallsBypassRate: a member at its reserve-call rate could go
// on calling through the group route (POST /api/v2/groups), which did not
// count against the rate. Group calls count now, as single calls do, and
// the two share one budget; another member is not slowed.
func TestAbuseGroupCallsBypassRate(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{Policy: mustPolicy(t, `
requesters:
  default: {reservesPerSecond: 1000}
  clusters:
    mallory: {reservesPerSecond: 1, reserveBurst: 3}
`)})
	_, err := s.Advertise(ctx, "paris", cluster(64, 256, 0, 30_000, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("single", "mallory", 100, 1, 0))
	require.NoError(t, err)
	placed, limited := 0, 0
	for i := range 10 {
		_, err := s.ReserveGroup(ctx, gang(fmt.Sprintf("g%d", i), "mallory", 2, 2, 100))
		var le *store.LimitError
		switch {
		case err == nil:
			placed++
		case errors.As(err, &le):
			limited++
			assert.Equal(t, "rate", le.Limit)
			assert.Positive(t, le.RetryAfter)
			assert.LessOrEqual(t, le.RetryAfter, time.Second)
		default:
			t.Fatal(err)
		}
	}
	assert.Equal(t, 2, placed, "the burst of 3, one taken by the single call")
	assert.Equal(t, 8, limited)
	_, err = s.Reserve(ctx, request("after", "mallory", 100, 1, 0))
	require.ErrorAs(t, err, new(*store.LimitError), "one budget for both routes")
	for i := range 5 {
		_, err := s.ReserveGroup(ctx, gang(fmt.Sprintf("r%d", i), "rome", 2, 2, 100))
		require.NoError(t, err, "rome is not slowed")
	}
	assertInvariant(t, s)
}
