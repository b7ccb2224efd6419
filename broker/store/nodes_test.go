package store_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/embedredis"
)

// node builds an advertised node: free milli-CPUs of alloc milli-CPUs, 8 GiB
// free of 16 GiB, gpus free of gpus.
func node(name string, allocMilli, freeMilli, gpus int64) model.NodeCapacity {
	return model.NodeCapacity{
		Name:        name,
		Allocatable: model.Resources{CPU: allocMilli, Memory: 16 * gi, GPU: gpus, Storage: 100 * gi},
		Allocated:   model.Resources{CPU: allocMilli - freeMilli, Memory: 8 * gi},
	}
}

// withNodes is an advertisement of nodes whose totals are the nodes' sums
// (used: what runs on them), priced per core.
func withNodes(pricePerCore int64, nodes ...model.NodeCapacity) model.Advertisement {
	var alloc, used model.Resources
	for _, n := range nodes {
		alloc, used = alloc.Add(n.Allocatable), used.Add(n.Allocated)
	}
	return model.Advertisement{
		Capacity: alloc, Allocatable: alloc, Allocated: used, Nodes: nodes,
		Prices: model.Prices{CPU: pricePerCore, Memory: pricePerCore / 8, GPU: 1_000_000, Currency: "EUR"},
	}
}

func advertise(t *testing.T, s *store.Store, id string, ad model.Advertisement) {
	t.Helper()
	_, err := s.Advertise(context.Background(), id, ad)
	require.NoError(t, err)
}

// lastAudit is the newest audit entry.
func lastAudit(t *testing.T, s *store.Store) map[string]any {
	t.Helper()
	entries, err := s.Client().XRevRangeN(context.Background(), s.Key("audit"), "+", "-", 1).Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	return entries[0].Values
}

// TestNodeFitRefusesWhatNoNodeHolds: three nodes with 1 free CPU each hold
// 3 CPUs in total, but no 3-CPU reservation: it is refused, with the reason
// insufficient_node_fit; three 1-CPU reservations are granted, one per node,
// each naming its node (reply, reservation, events, audit), and a fourth is
// refused. The same with the full scan.
func TestNodeFitRefusesWhatNoNodeHolds(t *testing.T) {
	ctx := context.Background()
	for _, fullScan := range []bool{false, true} {
		t.Run(fmt.Sprintf("fullScan=%v", fullScan), func(t *testing.T) {
			s := storeOn(startRedis(t), store.Config{}, fullScan)
			require.NoError(t, s.LoadScripts(ctx))
			advertise(t, s, "paris", withNodes(30_000, node("p1", 2000, 1000, 0), node("p2", 2000, 1000, 0), node("p3", 4000, 1000, 0)))
			c, err := s.Cluster(ctx, "paris")
			require.NoError(t, err)
			require.Equal(t, int64(3000), c.Free().CPU, "3 CPUs free in total")

			_, err = s.Reserve(ctx, request("big", "rome", 3000, 1, 0))
			var nf *store.NoFitError
			require.ErrorAs(t, err, &nf)
			assert.Equal(t, int64(1), nf.Rejected["insufficient_node_fit"])
			assert.Zero(t, nf.Rejected["insufficient_cpu"], "the totals would hold it")
			assert.Contains(t, err.Error(), "insufficient_node_fit=1")
			assert.Equal(t, "nofit", lastAudit(t, s)["outcome"])

			var nodes []string
			for i := range 3 {
				d, err := s.Reserve(ctx, request(fmt.Sprintf("small-%d", i), "rome", 1000, 1, 0))
				require.NoError(t, err)
				require.Equal(t, "paris", d.Reservation.Target)
				require.NotEmpty(t, d.Reservation.Node, "the reply names the node")
				nodes = append(nodes, d.Reservation.Node)
				stored, err := s.Reservation(ctx, "rome", d.Reservation.ID)
				require.NoError(t, err)
				assert.Equal(t, d.Reservation.Node, stored.Node)
				audit := lastAudit(t, s)
				assert.Equal(t, "reserved", audit["outcome"])
				assert.Equal(t, d.Reservation.Node, audit["node"], "the audit names the node")
			}
			sort.Strings(nodes)
			assert.Equal(t, []string{"p1", "p2", "p3"}, nodes, "one per node")
			evs, err := s.ReadEvents(ctx, "paris", "0", 10, 0)
			require.NoError(t, err)
			require.Len(t, evs, 3)
			assert.NotEmpty(t, evs[0].Node, "events name the node")

			_, err = s.Reserve(ctx, request("fourth", "rome", 1000, 1, 0))
			require.ErrorAs(t, err, &nf)
			assert.Equal(t, int64(1), nf.Rejected["insufficient_cpu"], "the totals are spent too")
			assert.Zero(t, nf.Rejected["insufficient_node_fit"], "counted only for clusters that pass every other check")

			// The debits are readable with redis-cli.
			debit, err := s.Client().HGet(ctx, s.Key("node-resv:", "paris"), "p1").Result()
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("cpu=1000 mem=%d gpu=0 sto=0", gi), debit)
			adv, err := s.Client().HGet(ctx, s.Key("nodes:", "paris"), "p3").Result()
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("alloc_cpu=4000 alloc_mem=%d alloc_gpu=0 alloc_sto=%d used_cpu=3000 used_mem=%d used_gpu=0 used_sto=0",
				16*gi, 100*gi, 8*gi), adv)
			assertInvariant(t, s)
			require.NoError(t, s.CheckIndex(ctx))
		})
	}
}

// TestNodeBestFit: a reservation takes the node with the least free GPU,
// then CPU, that holds it: small requests fill the small node first, GPU
// nodes are kept for GPU requests, and ties go to the node name.
func TestNodeBestFit(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000,
		node("big", 16000, 16000, 0), node("gpu", 8000, 8000, 2), node("small-b", 4000, 2000, 0), node("small-a", 4000, 2000, 0)))
	place := func(id string, milli, gpus int64) string {
		t.Helper()
		d, err := s.Reserve(ctx, request(id, "rome", milli, 1, gpus))
		require.NoError(t, err)
		return d.Reservation.Node
	}
	assert.Equal(t, "small-a", place("r1", 1500, 0), "least free cpu, then name")
	assert.Equal(t, "small-a", place("r2", 500, 0), "small-a has 500m left: the tightest fit")
	assert.Equal(t, "small-b", place("r3", 2000, 0))
	assert.Equal(t, "big", place("r4", 4000, 0), "the GPU node is kept for GPU requests")
	assert.Equal(t, "gpu", place("r5", 1000, 1))
	assertInvariant(t, s)
}

// TestNodeFitReleaseAndExpiry: release and expiry credit the node back,
// exactly once; the node then takes the same request again.
func TestNodeFitReleaseAndExpiry(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 2000, 1000, 0), node("p2", 4000, 2000, 0)))
	debits := func() map[string]string {
		return s.Client().HGetAll(ctx, s.Key("node-resv:", "paris")).Val()
	}

	d, err := s.Reserve(ctx, request("a", "rome", 1000, 1, 0))
	require.NoError(t, err)
	require.Equal(t, "p1", d.Reservation.Node)
	_, err = s.Reserve(ctx, request("b", "rome", 2000, 1, 0))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("c", "rome", 1000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf, "both nodes are full")
	assert.Len(t, debits(), 2)

	res, err := s.Release(ctx, "rome", "a", "rome")
	require.NoError(t, err)
	require.True(t, res.Released)
	assert.NotContains(t, debits(), "p1", "credited back")
	res, err = s.Release(ctx, "rome", "a", "paris")
	require.NoError(t, err)
	require.False(t, res.Released)
	assert.NotContains(t, debits(), "p1", "not twice")
	assertInvariant(t, s)

	short := request("short", "rome", 1000, 1, 0)
	short.Duration = 100 * time.Millisecond
	d, err = s.Reserve(ctx, short)
	require.NoError(t, err)
	require.Equal(t, "p1", d.Reservation.Node)
	time.Sleep(150 * time.Millisecond)
	n, clamped, err := s.Expire(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, clamped)
	assert.Equal(t, map[string]string{"p2": fmt.Sprintf("cpu=2000 mem=%d gpu=0 sto=0", gi)}, debits())
	n, _, err = s.Expire(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	d, err = s.Reserve(ctx, request("again", "rome", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "p1", d.Reservation.Node, "the expired capacity came back")
	assertInvariant(t, s)
	require.NoError(t, s.CheckIndex(ctx))
}

// TestNodeFitListedReservations: the counting rule. The provider reports
// its nodes' usage with the reservations' pods and lists their ids: the
// broker then drops its own debit (no double count), wherever the
// provider's scheduler put the pod; a live reservation no longer listed is
// debited again; a listed reservation's release credits nothing (the pod's
// usage is in the provider's figures until it reports again).
func TestNodeFitListedReservations(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	p1, p2 := node("p1", 4000, 2000, 0), node("p2", 4000, 2000, 0)
	advertise(t, s, "paris", withNodes(30_000, p1, p2))
	a, err := s.Reserve(ctx, request("a", "rome", 2000, 1, 0))
	require.NoError(t, err)
	require.Equal(t, "p1", a.Reservation.Node)
	_, err = s.Reserve(ctx, request("b", "rome", 2000, 1, 0))
	require.NoError(t, err) // p2
	_, err = s.Reserve(ctx, request("c", "rome", 1000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)

	// a's pod landed on p2 (not where the broker debited), b's is not
	// running yet: paris reports p2 full and lists a. (Its totals leave the
	// reservations' pods out, as ever.)
	p2a := p2
	p2a.Allocated.CPU += 2000
	ad := withNodes(30_000, p1, p2a)
	ad.Allocated = withNodes(30_000, p1, p2).Allocated
	ad.ReservationsOnNodes = []string{"rome/a", "rome/unknown-id"}
	advertise(t, s, "paris", ad)
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	nodes := c.StoredNodes()
	assert.Equal(t, int64(2000), nodes[0].Free().CPU, "p1: a's debit dropped")
	assert.Equal(t, int64(-2000), nodes[1].Free().CPU, "p2: a's pod and b's debit")
	assert.Equal(t, []string{"rome/a"}, s.Client().SMembers(ctx, s.Key("node-listed:", "paris")).Val())
	assertInvariantExceptOverbooked(t, s, "p2")
	// p1's 2000m are what b's pod will need (p2 is full): the totals, which
	// count every live reservation, refuse c.
	_, err = s.Reserve(ctx, request("c", "rome", 2000, 1, 0))
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["insufficient_cpu"])
	_, err = s.Release(ctx, "rome", "b", "rome")
	require.NoError(t, err)
	d, err := s.Reserve(ctx, request("c", "rome", 2000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "p1", d.Reservation.Node)
	_, err = s.Release(ctx, "rome", "c", "rome")
	require.NoError(t, err)
	assertInvariant(t, s)

	// a's pod is gone while a lives (the requester re-creates it): not listed,
	// debited again on p1.
	advertise(t, s, "paris", withNodes(30_000, p1, p2))
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{CPU: 2000, Memory: gi}, c.NodesReserved["p1"])
	assertInvariant(t, s)

	// Listed again, then released: nothing to credit, the listing goes.
	advertise(t, s, "paris", ad)
	_, err = s.Release(ctx, "rome", "a", "rome")
	require.NoError(t, err)
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.NotContains(t, c.NodesReserved, "p1")
	assert.Empty(t, s.Client().SMembers(ctx, s.Key("node-listed:", "paris")).Val())
	assertInvariant(t, s)
	require.NoError(t, s.CheckIndex(ctx))
}

// assertInvariantExceptOverbooked checks the invariant, allowing only the
// named node to be reported overbooked (an advertisement, not a
// reservation, made it so).
func assertInvariantExceptOverbooked(t *testing.T, s *store.Store, node string) {
	t.Helper()
	err := s.CheckInvariant(context.Background())
	if err == nil {
		return
	}
	for _, e := range unwrapJoined(err) {
		require.Contains(t, e.Error(), "node "+node+": overbooked", "only %s may be overbooked", node)
	}
}

func unwrapJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// TestNodeFitConcurrent: 100 concurrent 1-CPU reservations against nodes
// whose free capacity adds up to 60 CPUs (and one node with 900m, which
// holds none) grant exactly 60, each on a node that holds it; the debits
// equal the live reservations per node and no node is overbooked.
func TestNodeFitConcurrent(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{StaleThreshold: time.Hour, ReserveBatch: 16})
	frees := map[string][]int64{"paris": {1, 3, 5, 7, 9, 11}, "berlin": {2, 4, 6, 12}}
	free := map[string]int64{}
	for id, cpus := range frees {
		var nodes []model.NodeCapacity
		for i, c := range cpus {
			n := node(fmt.Sprintf("%s-%d", id, i), 16000, c*1000, 0)
			nodes = append(nodes, n)
			free[id+"/"+n.Name] = c * 1000
		}
		nodes = append(nodes, node(id+"-tiny", 1000, 900, 0))
		ad := withNodes(30_000, nodes...)
		ad.Allocated = model.Resources{} // the totals would hold far more
		advertise(t, s, id, ad)
	}
	var (
		mu     sync.Mutex
		placed = map[string]int64{}
		wg     sync.WaitGroup
		n      int
	)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := s.Reserve(ctx, model.ReserveRequest{ID: fmt.Sprintf("q%03d", i), Requester: "rome", Duration: time.Hour,
				Resources: model.Resources{CPU: 1000, Memory: gi / 8}})
			var nf *store.NoFitError
			if errors.As(err, &nf) {
				return
			}
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			placed[d.Reservation.Target+"/"+d.Reservation.Node] += 1000
			n++
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Equal(t, 60, n)
	for k, used := range placed {
		assert.LessOrEqual(t, used, free[k], "node %s", k)
	}
	assert.Zero(t, placed["paris/paris-tiny"]+placed["berlin/berlin-tiny"])
	assertInvariant(t, s)
	require.NoError(t, s.CheckIndex(ctx))
}

// TestNodeFitMixesWithTotals: a cluster that advertises no nodes (a v1 or
// older agent) keeps the cluster-level rule next to one that does: its
// reservations name no node, and a request its totals hold is granted.
func TestNodeFitMixesWithTotals(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(10_000, node("p1", 2000, 1000, 0), node("p2", 2000, 1000, 0), node("p3", 2000, 1000, 0)))
	advertise(t, s, "berlin", cluster(3, 8, 0, 90_000, nil))
	d, err := s.Reserve(ctx, request("big", "rome", 3000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "berlin", d.Reservation.Target, "paris's nodes cannot hold it, berlin's totals can")
	assert.Empty(t, d.Reservation.Node)
	d, err = s.Reserve(ctx, request("small", "rome", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target, "cheaper")
	assert.NotEmpty(t, d.Reservation.Node)

	// paris's agent is downgraded: no nodes any more, its totals rule again.
	ad := withNodes(10_000, node("p1", 2000, 1000, 0), node("p2", 2000, 1000, 0), node("p3", 2000, 1000, 0))
	ad.Nodes = nil
	advertise(t, s, "paris", ad)
	d, err = s.Reserve(ctx, request("big2", "rome", 2000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	assert.Empty(t, d.Reservation.Node)
	assertInvariant(t, s)
	require.NoError(t, s.CheckIndex(ctx))
}

// TestNodeFitWaitingList: a request that no node can hold waits, does not
// hold lower priorities back (it cannot be placed), and hears of it when an
// advertisement frees a node enough.
func TestNodeFitWaitingList(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{WaitTTL: time.Minute})
	nodes := []model.NodeCapacity{node("p1", 4000, 1000, 0), node("p2", 4000, 1000, 0)}
	advertise(t, s, "paris", withNodes(10_000, nodes...))
	high := request("high", "rome", 2000, 1, 0)
	high.Priority = 100
	_, err := s.Reserve(ctx, high)
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	_, err = s.Reserve(ctx, request("low", "lyon", 1000, 1, 0))
	require.NoError(t, err, "high cannot be placed: low is not deferred")

	nodes[1].Allocated.CPU = 0 // p2's pods ended
	advertise(t, s, "paris", withNodes(10_000, nodes...))
	assert.Contains(t, eventTypes(t, s, "rome"), "CapacityAvailable:high")
	d, err := s.Reserve(ctx, high)
	require.NoError(t, err)
	assert.Equal(t, "p2", d.Reservation.Node)
	assertInvariant(t, s)
}

// TestCheckInvariantDetectsNodeDrift: a node debit that does not match the
// live reservations, or a listing of something not placed there, is found.
func TestCheckInvariantDetectsNodeDrift(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 2000, 0)))
	_, err := s.Reserve(ctx, request("a", "rome", 1000, 1, 0))
	require.NoError(t, err)
	require.NoError(t, s.CheckInvariant(ctx))

	rdb, key := s.Client(), s.Key("node-resv:", "paris")
	good := rdb.HGet(ctx, key, "p1").Val()
	require.NoError(t, rdb.HSet(ctx, key, "p1", "cpu=2000 mem=1 gpu=0 sto=0").Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "sum of its unlisted live reservations")
	require.NoError(t, rdb.HSet(ctx, key, "p1", "cpu=3000 mem=1073741824 gpu=0 sto=0", "p9", "cpu=1 mem=0 gpu=0 sto=0").Err())
	err = s.CheckInvariant(ctx)
	require.ErrorContains(t, err, "node p1: overbooked")
	require.ErrorContains(t, err, "node p9: debit")
	require.NoError(t, rdb.HDel(ctx, key, "p9").Err())
	require.NoError(t, rdb.HSet(ctx, key, "p1", good).Err())
	require.NoError(t, rdb.SAdd(ctx, s.Key("node-listed:", "paris"), "ghost").Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "node-listed holds ghost")
}

// TestNodeFitOnEmbeddedRedis: the demo's embedded Redis (no struct library:
// the records are JSON) places on nodes the same way.
func TestNodeFitOnEmbeddedRedis(t *testing.T) {
	ctx := context.Background()
	srv, err := embedredis.Start()
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	advertise(t, s, "paris", withNodes(30_000, node("p1", 2000, 1000, 0), node("p2", 2000, 1000, 0), node("p3", 4000, 1000, 1)))
	_, err = s.Reserve(ctx, request("big", "rome", 3000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["insufficient_node_fit"])
	var nodes []string
	for i := range 3 {
		d, err := s.Reserve(ctx, request(fmt.Sprintf("small-%d", i), "rome", 1000, 1, 0))
		require.NoError(t, err)
		nodes = append(nodes, d.Reservation.Node)
	}
	assert.Equal(t, []string{"p1", "p2", "p3"}, nodes, "best fit: the GPU node last")
	_, err = s.Release(ctx, "rome", "small-1", "rome")
	require.NoError(t, err)
	d, err := s.Reserve(ctx, request("again", "rome", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "p2", d.Reservation.Node)
	assertInvariant(t, s)
	require.NoError(t, s.CheckIndex(ctx))
}
