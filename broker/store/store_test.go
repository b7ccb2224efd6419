package store_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

const gi = int64(1) << 30

func newStore(t *testing.T, cfg store.Config) *store.Store {
	t.Helper()
	s := store.New(startRedis(t), cfg)
	require.NoError(t, s.LoadScripts(context.Background()))
	return s
}

// storeOn returns a store over rdb that decides by the candidate index or,
// with fullScan, by the full-scan reference (store.NewFullScan).
func storeOn(rdb redis.UniversalClient, cfg store.Config, fullScan bool) *store.Store {
	if fullScan {
		return store.NewFullScan(rdb, cfg)
	}
	return store.New(rdb, cfg)
}

// admins maps the broker's client of each test Redis (the ACL's limited user)
// to an administrator's client of the same Redis, for what the tests do and
// the broker never does (FLUSHALL, KEYS, XRANGE, MULTI).
var admins sync.Map // *redis.Client -> *redis.Client

// startRedis starts a redis-server for tb and returns the broker's client.
func startRedis(tb testing.TB) *redis.Client {
	srv := redistest.Start(tb)
	c := srv.Client()
	admins.Store(c, srv.AdminClient())
	tb.Cleanup(func() { admins.Delete(c) })
	return c
}

// admin returns the administrator's client of s's Redis.
func admin(tb testing.TB, s *store.Store) *redis.Client {
	tb.Helper()
	return adminOf(tb, s.Client().(*redis.Client))
}

// adminOf returns the administrator's client of the Redis of rdb, the broker's client.
func adminOf(tb testing.TB, rdb *redis.Client) *redis.Client {
	tb.Helper()
	a, ok := admins.Load(rdb)
	if !ok {
		tb.Fatal("this Redis was not started by startRedis")
	}
	return a.(*redis.Client)
}

// cluster builds an advertisement: cpu in cores, memory in GiB, gpus, price per core-hour in micro-units.
func cluster(cores, memGi, gpus, pricePerCore int64, labels map[string]string) model.Advertisement {
	r := model.Resources{CPU: cores * 1000, Memory: memGi * gi, GPU: gpus, Storage: 100 * gi}
	return model.Advertisement{
		Capacity: r, Allocatable: r, Labels: labels,
		Prices: model.Prices{CPU: pricePerCore, Memory: pricePerCore / 8, GPU: 1_000_000, Currency: "EUR"},
	}
}

func request(id, requester string, milli, memGi, gpus int64) model.ReserveRequest {
	return model.ReserveRequest{ID: id, Requester: requester, Duration: time.Hour,
		Resources: model.Resources{CPU: milli, Memory: memGi * gi, GPU: gpus}}
}

func TestReserveScoring(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		clusters map[string]model.Advertisement
		used     map[string]model.Resources
		req      model.ReserveRequest
		want     string
	}{
		{
			name: "cost decides between equal clusters",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(16, 64, 0, 40_000, nil),
				"paris":  cluster(16, 64, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 2000, 4, 0),
			want: "paris",
		},
		{
			name: "availability decides at equal price",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(64, 256, 0, 30_000, nil),
				"paris":  cluster(8, 32, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 2000, 4, 0),
			want: "berlin",
		},
		{
			name: "much more room outweighs a slightly higher price (70/30)",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(64, 256, 0, 31_000, nil),
				"paris":  cluster(4, 8, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 2000, 4, 0),
			want: "berlin",
		},
		{
			name: "ties go to the smallest cluster id",
			clusters: map[string]model.Advertisement{
				"lyon":  cluster(16, 64, 0, 30_000, nil),
				"paris": cluster(16, 64, 0, 30_000, nil),
				"milan": cluster(16, 64, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 1000, 1, 0),
			want: "lyon",
		},
		{
			name: "a GPU request goes only where GPUs are free",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(64, 256, 0, 10_000, nil),
				"paris":  cluster(8, 32, 2, 90_000, nil),
			},
			req:  request("r1", "rome", 1000, 1, 1),
			want: "paris",
		},
		{
			name: "the requester is never its own provider",
			clusters: map[string]model.Advertisement{
				"rome":  cluster(128, 512, 0, 1_000, nil),
				"paris": cluster(8, 32, 0, 90_000, nil),
			},
			req:  request("r1", "rome", 1000, 1, 0),
			want: "paris",
		},
		{
			name: "allocated capacity is not free",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(16, 64, 0, 30_000, nil),
				"paris":  cluster(16, 64, 0, 20_000, nil),
			},
			used: map[string]model.Resources{"paris": {CPU: 15_500, Memory: 10 * gi}},
			req:  request("r1", "rome", 1000, 1, 0),
			want: "berlin",
		},
		{
			name: "label selector",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(16, 64, 0, 30_000, map[string]string{"region": "eu-central"}),
				"paris":  cluster(16, 64, 0, 20_000, map[string]string{"region": "eu-west"}),
			},
			req: func() model.ReserveRequest {
				r := request("r1", "rome", 1000, 1, 0)
				r.Selector = map[string]string{"region": "eu-central"}
				return r
			}(),
			want: "berlin",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, store.Config{})
			for id, ad := range tc.clusters {
				ad.Allocated = tc.used[id]
				_, err := s.Advertise(ctx, id, ad)
				require.NoError(t, err)
			}
			before, err := s.Clusters(ctx)
			require.NoError(t, err)
			d, err := s.Reserve(ctx, tc.req)
			require.NoError(t, err)
			assert.Equal(t, tc.want, d.Reservation.Target)
			assert.Equal(t, model.PhaseReserved, d.Reservation.Phase)
			require.NotEmpty(t, d.Reservation.Candidates)
			assert.Equal(t, tc.want, d.Reservation.Candidates[0].Cluster)
			assert.InDelta(t, d.Reservation.Candidates[0].Score, d.Reservation.Score, 0.01)
			// The independent reference scorer agrees on the winner and the score.
			refWinner, refScore := referenceDecision(before, tc.req, 0.7, 0.3, map[string]bool{})
			assert.Equal(t, refWinner, d.Reservation.Target)
			assert.InDelta(t, refScore, d.Reservation.Score, 0.01)
			assertInvariant(t, s)
		})
	}
}

func TestReserveNothingFits(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for id, ad := range map[string]model.Advertisement{
		"rome":   cluster(64, 256, 0, 1, nil),
		"paris":  cluster(2, 64, 0, 1, nil),
		"berlin": cluster(16, 2, 0, 1, nil),
		"lyon":   cluster(16, 64, 0, 1, nil),
	} {
		_, err := s.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	// Each reason counts every live cluster other than the requester that fails
	// it (a cluster may fail several); the full scan counts the same.
	req := request("r1", "rome", 4000, 4, 1)
	for _, st := range []*store.Store{s, store.NewFullScan(s.Client(), store.Config{})} {
		_, err := st.Reserve(ctx, req)
		var nf *store.NoFitError
		require.ErrorAs(t, err, &nf)
		assert.Equal(t, int64(1), nf.Rejected["requester"])
		assert.Equal(t, int64(1), nf.Rejected["insufficient_cpu"], "paris")
		assert.Equal(t, int64(1), nf.Rejected["insufficient_mem"], "berlin")
		assert.Equal(t, int64(3), nf.Rejected["insufficient_gpu"], "paris, berlin, lyon")
		assert.Contains(t, err.Error(), "insufficient_gpu=3")
	}
	_, err := s.Reservation(ctx, "rome", "r1")
	assert.ErrorIs(t, err, store.ErrNotFound, "a failed decision stores no reservation, so a retry with the same id can succeed later")
	assertInvariant(t, s)
}

func TestStaleClustersExcluded(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{StaleThreshold: 300 * time.Millisecond})
	_, err := s.Advertise(ctx, "berlin", cluster(64, 256, 0, 1_000, nil)) // cheaper and bigger, but goes stale
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	_, err = s.Advertise(ctx, "paris", cluster(8, 32, 0, 50_000, nil))
	require.NoError(t, err)
	d, err := s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	clusters, err := s.Clusters(ctx)
	require.NoError(t, err)
	require.Len(t, clusters, 2)
	assert.Equal(t, []string{"berlin", "paris"}, []string{clusters[0].ID, clusters[1].ID}, "id order, not last-seen order")
	live, stale, err := s.CountClusters(ctx)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{1, 1}, [2]int64{live, stale})

	_, err = s.Reserve(ctx, request("r2", "rome", 64000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["stale"])
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

// TestReserveMatchesReference runs random states through the script and an
// independent Go implementation of the same rules; every decision must agree.
func TestReserveMatchesReference(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%02d", i)
		ad := cluster(int64(2+rng.IntN(64)), int64(4+rng.IntN(256)), int64(rng.IntN(3)), int64(10_000+rng.IntN(5)*5_000), nil)
		ad.Allocated = model.Resources{CPU: int64(rng.IntN(2000)), Memory: int64(rng.IntN(4)) * gi}
		ad.Nodes = randomNodes(rng)
		_, err := s.Advertise(ctx, ids[i], ad)
		require.NoError(t, err)
	}
	decided, onNodes := 0, 0
	for i := 0; i < 300; i++ {
		req := request(fmt.Sprintf("r%d", i), ids[rng.IntN(len(ids))], int64(100+rng.IntN(8000)), int64(1+rng.IntN(16)), int64(rng.IntN(2)))
		clusters, err := s.Clusters(ctx)
		require.NoError(t, err)
		want, wantScore := referenceDecision(clusters, req, 0.7, 0.3, map[string]bool{})
		d, err := s.Reserve(ctx, req)
		if want == "" {
			var nf *store.NoFitError
			require.ErrorAs(t, err, &nf, "request %d", i)
			continue
		}
		require.NoError(t, err, "request %d", i)
		require.Equal(t, want, d.Reservation.Target, "request %d", i)
		require.InDelta(t, wantScore, d.Reservation.Score, 0.01)
		for _, c := range clusters {
			if c.ID == want {
				require.Equal(t, referenceNode(c, req), d.Reservation.Node, "request %d", i)
			}
		}
		if d.Reservation.Node != "" {
			onNodes++
		}
		decided++
	}
	assert.Greater(t, decided, 50)
	assert.Greater(t, onNodes, 20)
	assertInvariant(t, s)
}

// referenceDecision is the scoring rule of ARCHITECTURE.md written plainly in Go.
func referenceDecision(clusters []model.Cluster, req model.ReserveRequest, wRes, wCost float64, stale map[string]bool) (string, float64) {
	type cand struct {
		id           string
		rs, price, s float64
	}
	get := func(r model.Resources, i int) int64 { return [4]int64{r.CPU, r.Memory, r.GPU, r.Storage}[i] }
	var fits []cand
	for _, c := range clusters {
		if c.ID == req.Requester || stale[c.ID] {
			continue
		}
		ok, sum, n := true, 0.0, 0
		for i := 0; i < 4; i++ {
			want := get(req.Resources, i)
			if want == 0 {
				continue
			}
			free := get(c.Free(), i)
			if free < want {
				ok = false
				break
			}
			sum += float64(free-want) / float64(get(c.Allocatable, i))
			n++
		}
		for k, v := range req.Selector {
			if c.Labels[k] != v {
				ok = false
			}
		}
		if len(c.Nodes) > 0 && referenceNode(c, req) == "" {
			ok = false // no node holds it
		}
		if ok {
			price := float64(req.Resources.CPU)/1000*float64(c.Prices.CPU) +
				float64(req.Resources.Memory)/float64(gi)*float64(c.Prices.Memory) +
				float64(req.Resources.GPU)*float64(c.Prices.GPU)
			fits = append(fits, cand{id: c.ID, rs: 100 * sum / float64(n), price: price})
		}
	}
	if len(fits) == 0 {
		return "", 0
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range fits {
		lo, hi = math.Min(lo, c.price), math.Max(hi, c.price)
	}
	for i := range fits {
		cs := 100.0
		if hi > lo {
			cs = 100 * (hi - fits[i].price) / (hi - lo)
		}
		fits[i].s = wRes*fits[i].rs + wCost*cs
	}
	sort.Slice(fits, func(i, j int) bool {
		if fits[i].s != fits[j].s {
			return fits[i].s > fits[j].s
		}
		return fits[i].id < fits[j].id
	})
	return fits[0].id, fits[0].s
}

// referenceNode is the node a reservation takes on cluster c, written
// plainly: among the nodes whose free capacity holds every requested amount,
// the least free GPU, then CPU, memory, storage, then name ("" if none).
func referenceNode(c model.Cluster, req model.ReserveRequest) string {
	get := func(r model.Resources) [4]int64 { return [4]int64{r.CPU, r.Memory, r.GPU, r.Storage} }
	want := get(req.Resources)
	var best *model.Node
	for _, n := range c.StoredNodes() {
		free := get(n.Free())
		holds := true
		for i := range want {
			if want[i] > 0 && free[i] < want[i] {
				holds = false
			}
		}
		if !holds {
			continue
		}
		if best == nil {
			best = &n
			continue
		}
		b := get(best.Free())
		key, bkey := [4]int64{free[2], free[0], free[1], free[3]}, [4]int64{b[2], b[0], b[1], b[3]}
		if key != bkey {
			for i := range key {
				if key[i] != bkey[i] {
					if key[i] < bkey[i] {
						best = &n
					}
					break
				}
			}
		} else if n.Name < best.Name {
			best = &n
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}

func assertInvariant(t *testing.T, s *store.Store) {
	t.Helper()
	require.NoError(t, s.CheckInvariant(context.Background()))
}

func TestAdvertiseCannotSetBrokerOwnedFields(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	before, err := rdb.HGetAll(ctx, s.Key("cluster:", "paris")).Result()
	require.NoError(t, err)

	// Call the script directly, as a buggy or hostile caller would.
	err = scripts.Advertise.Run(ctx, rdb, []string{store.DefaultPrefix}, "paris", 100, 60_000, 0, 0, "alloc_cpu", "1", "resv_cpu", "0").Err()
	require.ErrorContains(t, err, "unknown field resv_cpu")
	after, err := rdb.HGetAll(ctx, s.Key("cluster:", "paris")).Result()
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing written")
}

func TestCheckInvariantDetectsDrift(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	require.NoError(t, s.CheckInvariant(ctx))

	require.NoError(t, rdb.HIncrBy(ctx, s.Key("cluster:", "paris"), "resv_cpu", 1).Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "reserved counter")
	require.NoError(t, rdb.HSet(ctx, s.Key("cluster:", "paris"), "resv_cpu", 1000, "used_cpu", 7500).Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "overbooked")
}

// eventTypes lists the types of the events on a cluster's stream, oldest first.
func eventTypes(t *testing.T, s *store.Store, cluster string) []string {
	t.Helper()
	entries, err := admin(t, s).XRange(context.Background(), s.Key("events:", cluster), "-", "+").Result()
	require.NoError(t, err)
	types := make([]string, 0, len(entries))
	for _, e := range entries {
		types = append(types, e.Values["type"].(string)+":"+e.Values["reservation"].(string))
	}
	return types
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
