package store_test

// Benchmarks of the decision path on a real redis-server (internal/redistest).
// They run only with -bench; docs/benchmarks.md says how to run and read them.
//
// Each leaf reports, besides ns/op:
//   decisions/s (or calls/s, ads/s)  throughput over the timed loop
//   p50-ms, p99-ms                   per-operation latency seen by the client
//   redis-us/op                      server time per operation (INFO commandstats)
//   ops/call                         operations per script call: concurrent
//                                    reservations are decided in batches
//   redis-busy-%                     share of the wall clock the single Redis thread spent in those calls
// Compare decisions/s with the calls/s of baseline-trivial-evalsha, the floor
// of one EVALSHA round trip on the same server and client.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// benchParallelism × GOMAXPROCS goroutines issue requests in the parallel
// leaves (16 in flight on a 2-core machine), over the client's pool of 64.
const benchParallelism = 8

// benchScale multiplies realistic cluster sizes so that no benchmark run can
// exhaust any capacity (each iteration is exactly one Reserve, never a nofit,
// never a release), while staying below 2^53 so Lua's doubles stay exact.
const benchScale = 1000

// benchCluster is a realistic, varied advertisement (size, memory per core,
// GPUs, local usage, prices, labels), scaled by benchScale.
func benchCluster(rng *rand.Rand, id string) model.Advertisement {
	cores := []int64{16, 32, 48, 64, 96, 128, 256, 512, 1024}[rng.IntN(9)]
	memPerCore := []int64{2, 4, 8}[rng.IntN(3)]
	var gpus int64
	if rng.IntN(5) == 0 {
		gpus = []int64{1, 2, 4, 8}[rng.IntN(4)]
	}
	r := model.Resources{
		CPU:     cores * 1000 * benchScale,
		Memory:  cores * memPerCore * gi * benchScale,
		GPU:     gpus * benchScale,
		Storage: cores * 10 * gi * benchScale,
	}
	usedPct := rng.Int64N(70) // local pods already use 0-69% of it
	used := model.Resources{CPU: r.CPU * usedPct / 100, Memory: r.Memory * usedPct / 100, GPU: r.GPU / 2, Storage: r.Storage * usedPct / 100}
	regions := []string{"eu-west", "eu-central", "eu-south", "eu-north", "us-east"}
	return model.Advertisement{
		Name: id, Endpoint: "https://" + id + ".example:6443",
		Labels:   map[string]string{"region": regions[rng.IntN(len(regions))], "tier": []string{"edge", "cloud"}[rng.IntN(2)]},
		Capacity: r, Allocatable: r, Allocated: used,
		Prices: model.Prices{
			CPU:      20_000 + rng.Int64N(40_000),     // 0.02-0.06 EUR per core-hour
			Memory:   2_000 + rng.Int64N(4_000),       // 0.002-0.006 EUR per GiB-hour
			GPU:      500_000 + rng.Int64N(2_000_000), // 0.5-2.5 EUR per GPU-hour
			Currency: "EUR",
		},
	}
}

func benchClusterID(i int) string { return fmt.Sprintf("c%05d", i) }

// advertiseMany advertises n clusters concurrently (not n serial round trips).
func advertiseMany(b testing.TB, st *store.Store, n int) {
	b.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), 42))
	ads := make([]model.Advertisement, n)
	for i := range ads {
		ads[i] = benchCluster(rng, benchClusterID(i))
	}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range ads {
		g.Go(func() error {
			_, err := st.Advertise(context.Background(), benchClusterID(i), ads[i])
			return err
		})
	}
	require.NoError(b, g.Wait())
}

// benchRequests are the shapes the requesters ask for (CPU and memory, as the
// v2 API requires; no GPU, so every live cluster is a candidate).
var benchRequests = []model.Resources{
	{CPU: 250, Memory: 512 << 20},
	{CPU: 500, Memory: 1 * gi},
	{CPU: 1000, Memory: 2 * gi},
	{CPU: 2000, Memory: 4 * gi},
	{CPU: 500, Memory: 2 * gi},
	{CPU: 4000, Memory: 8 * gi},
}

// benchStats reads the server-side time of every command from INFO commandstats.
type benchStats map[string]struct{ calls, usec int64 }

func readStats(b testing.TB, rdb *redis.Client) benchStats {
	b.Helper()
	// As the administrator, who alone may CONFIG RESETSTAT (manifests/redis/users.acl).
	info, err := adminOf(b, rdb).Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	out := benchStats{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st struct{ calls, usec int64 }
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

// report adds the throughput, latency percentiles and server-time metrics.
func report(b *testing.B, rdb *redis.Client, unit, cmd string, lat []time.Duration) {
	b.Helper()
	secs := b.Elapsed().Seconds()
	if secs > 0 {
		b.ReportMetric(float64(b.N)/secs, unit)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		pct := func(p float64) float64 {
			return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
		}
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
	}
	if st := readStats(b, rdb)[cmd]; st.calls > 0 && secs > 0 {
		// Per operation, not per call: concurrent reservations share a call (store.batcher).
		b.ReportMetric(float64(st.usec)/float64(b.N), "redis-us/op")
		b.ReportMetric(float64(b.N)/float64(st.calls), "ops/call")
		b.ReportMetric(100*float64(st.usec)/1e6/secs, "redis-busy-%")
	}
}

// benchSeq numbers the operations: unique across every leaf and b.N round, so
// no reservation id is ever reused (a reused id would be a cheap replay).
var benchSeq atomic.Int64

// runSerialAndParallel benchmarks op as "serial" (one caller: latency) and
// "parallel" (benchParallelism × GOMAXPROCS callers over the pool: throughput).
// cmd is the Redis command whose server time is reported (evalsha).
func runSerialAndParallel(b *testing.B, rdb *redis.Client, unit, cmd string, op func(ctx context.Context, seq int64) error) {
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		require.NoError(b, adminOf(b, rdb).ConfigResetStat(ctx).Err())
		lat := make([]time.Duration, 0, 1<<14)
		for b.Loop() {
			t0 := time.Now()
			if err := op(ctx, benchSeq.Add(1)); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		report(b, rdb, unit, cmd, lat)
	})
	b.Run("parallel", func(b *testing.B) { runParallel(b, rdb, unit, cmd, op) })
}

// runParallel times op called by benchParallelism × GOMAXPROCS callers over
// the pool (throughput), from Redis' statistics reset, and reports it.
func runParallel(b *testing.B, rdb *redis.Client, unit, cmd string, op func(ctx context.Context, seq int64) error) {
	require.NoError(b, adminOf(b, rdb).ConfigResetStat(context.Background()).Err())
	report(b, rdb, unit, cmd, timeParallel(b, op))
}

// timeParallel calls op from benchParallelism × GOMAXPROCS callers, b.N
// times in all, each with its own benchSeq number, and returns each call's
// latency.
func timeParallel(b *testing.B, op func(ctx context.Context, seq int64) error) []time.Duration {
	ctx := context.Background()
	var mu sync.Mutex
	var all []time.Duration
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		lat := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t0 := time.Now()
			if err := op(ctx, benchSeq.Add(1)); err != nil {
				b.Error(err)
				return
			}
			lat = append(lat, time.Since(t0))
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	})
	b.StopTimer()
	return all
}

func benchStore(b *testing.B) (*store.Store, *redis.Client) {
	b.Helper()
	rdb := startRedis(b)
	// An hour of liveness: the clusters are advertised once, before the timed
	// loops, and must stay live through the slowest run. Every limit is on
	// (benchLimits), as a broker with a policy runs, and none is reached.
	st := store.New(rdb, store.Config{StaleThreshold: time.Hour, Policy: benchLimits(b)})
	require.NoError(b, st.LoadScripts(context.Background()))
	return st, rdb
}

// benchLimits is a policy that checks every per-requester limit (live
// reservations, cpu, memory, gpu, priority ceiling, rate) on every request,
// with limits no benchmark reaches: what the limits cost, not what they refuse.
func benchLimits(b *testing.B) *policy.Policy {
	p, err := policy.Parse([]byte(`apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters:
  default:
    maxReservations: 1000000000
    maxResources: {cpu: "1000000000", memory: 1000Ti, gpu: "1000000000"}
    maxPriority: 1000000000
    reservesPerSecond: 1000000
    reserveBurst: 1000000
`))
	require.NoError(b, err)
	return p
}

// BenchmarkReserve measures one decision (reserve.lua) at several federation
// sizes, through the candidate index, among the candidates of the replica's
// view (hint: the view's catch-up, a script call, counts in redis-us/op too;
// the proposal, made in the replica, in the latency alone), and by the
// full scan (the baseline), and the floor of a trivial EVALSHA on the same
// server and client.
func BenchmarkReserve(b *testing.B) {
	st, rdb := benchStore(b)
	ctx := context.Background()

	b.Run("baseline-trivial-evalsha", func(b *testing.B) {
		trivial := redis.NewScript("return 1")
		require.NoError(b, trivial.Load(ctx, rdb).Err())
		runSerialAndParallel(b, rdb, "calls/s", "evalsha", func(ctx context.Context, _ int64) error {
			return rdb.EvalSha(ctx, trivial.Hash(), nil).Err()
		})
	})

	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			// A fresh data set per size (FLUSHALL keeps the script cache).
			require.NoError(b, admin(b, st).FlushAll(ctx).Err())
			require.NoError(b, st.LoadScripts(ctx))
			advertiseMany(b, st, n)
			requesters := min(n, 8) // requesters are federation members: never candidates
			for _, method := range []string{"index", "hint", "scan"} {
				s := st
				switch method {
				case "hint": // candidates from the replica's view (Config.DecideFromView)
					s = store.New(rdb, store.Config{StaleThreshold: time.Hour, Policy: benchLimits(b), DecideFromView: true})
				case "scan":
					s = store.NewFullScan(rdb, store.Config{StaleThreshold: time.Hour, Policy: benchLimits(b)})
				}
				b.Run("method="+method, func(b *testing.B) {
					runSerialAndParallel(b, rdb, "decisions/s", "evalsha", func(ctx context.Context, seq int64) error {
						_, err := s.Reserve(ctx, model.ReserveRequest{
							ID:        "b" + strconv.FormatInt(seq, 36),
							Requester: benchClusterID(int(seq) % requesters),
							Resources: benchRequests[seq%int64(len(benchRequests))],
							Duration:  time.Hour,
						})
						return err
					})
				})
			}
		})
	}
}

// BenchmarkAdvertise measures one advertisement of a cluster with 10 nodes,
// 100 clusters known: unchanged (a heartbeat: an agent publishing the same
// figures again, which refreshes its liveness only) and changed (one node's
// figures differ from those stored, so the cluster is indexed again).
func BenchmarkAdvertise(b *testing.B) {
	st, rdb := benchStore(b)
	const n = 100
	rng := rand.New(rand.NewPCG(n, 42))
	ads := make([]model.Advertisement, n)
	for i := range ads {
		ads[i] = benchCluster(rng, benchClusterID(i))
		ads[i].Nodes = benchNodes(rng, ads[i], false)
		_, err := st.Advertise(context.Background(), benchClusterID(i), ads[i])
		require.NoError(b, err)
	}
	b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
		for _, variant := range []string{"unchanged", "changed"} {
			b.Run(variant, func(b *testing.B) {
				runSerialAndParallel(b, rdb, "ads/s", "evalsha", func(ctx context.Context, seq int64) error {
					i := int(seq % n)
					ad := ads[i]
					if variant == "changed" {
						// seq is new to every call: no two consecutive ones of a cluster agree.
						ad.Nodes = slices.Clone(ad.Nodes)
						ad.Nodes[0].Allocated.CPU = seq % (ad.Nodes[0].Allocatable.CPU + 1)
					}
					_, err := st.Advertise(ctx, benchClusterID(i), ad)
					return err
				})
			})
		}
	})
}

// benchNodes splits a benchCluster advertisement into 10 nodes of varied
// sizes and use (their sums are the cluster's totals, give or take the
// rounding). slowPath makes the node with the most free cpu memory-full,
// so that the record's node summary cannot decide any request and every
// candidate's node record is read: the worst case of the per-node check.
func benchNodes(rng *rand.Rand, ad model.Advertisement, slowPath bool) []model.NodeCapacity {
	return benchNodesOf(rng, ad, 1, slowPath)
}

// benchNodesOf splits a cluster into 10*k nodes of the same shapes.
func benchNodesOf(rng *rand.Rand, ad model.Advertisement, k int, slowPath bool) []model.NodeCapacity {
	var weights []int64
	for range k {
		weights = append(weights, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4) // sums to 20
	}
	nodes := make([]model.NodeCapacity, len(weights))
	part := func(total, w int64) int64 { return total / int64(20*k) * w }
	for i, w := range weights {
		a := model.Resources{CPU: part(ad.Allocatable.CPU, w), Memory: part(ad.Allocatable.Memory, w),
			GPU: part(ad.Allocatable.GPU, w), Storage: part(ad.Allocatable.Storage, w)}
		pct := rng.Int64N(70)
		nodes[i] = model.NodeCapacity{Name: fmt.Sprintf("node-%02d", i), Allocatable: a,
			Allocated: model.Resources{CPU: a.CPU * pct / 100, Memory: a.Memory * pct / 100, GPU: a.GPU / 2, Storage: a.Storage * pct / 100}}
	}
	if slowPath {
		top := &nodes[len(nodes)-1]
		top.Allocated = model.Resources{Memory: top.Allocatable.Memory}
	}
	return nodes
}

// BenchmarkReserveNodes measures the cost of the per-node fit: one
// decision (reserve.lua, through the index) at 100 and 10,000 clusters, in
// the same run, with the clusters advertising no nodes (nodes=0: the
// cluster-level fit, as before), 10 nodes each (nodes=10: the record's node
// summary decides, the winner's node record is read to choose its node) and
// 10 nodes whose largest by cpu has no memory free (nodes=10-slowpath: every
// candidate's node record is read); and 50 nodes each decided from the
// replica's view (nodes=50-hint: the simulator's clusters, where the
// commit's work on the winner's node table weighs).
func BenchmarkReserveNodes(b *testing.B) {
	st, rdb := benchStore(b)
	ctx := context.Background()
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			for _, variant := range []string{"0", "10", "10-slowpath", "50-hint"} {
				require.NoError(b, admin(b, st).FlushAll(ctx).Err())
				require.NoError(b, st.LoadScripts(ctx))
				rng := rand.New(rand.NewPCG(uint64(n), 42))
				ads := make([]model.Advertisement, n)
				for i := range ads {
					ads[i] = benchCluster(rng, benchClusterID(i))
					switch variant {
					case "10", "10-slowpath":
						ads[i].Nodes = benchNodes(rng, ads[i], variant == "10-slowpath")
					case "50-hint":
						ads[i].Nodes = benchNodesOf(rng, ads[i], 5, false)
					}
				}
				var g errgroup.Group
				g.SetLimit(32)
				for i := range ads {
					g.Go(func() error {
						_, err := st.Advertise(ctx, benchClusterID(i), ads[i])
						return err
					})
				}
				require.NoError(b, g.Wait())
				requesters := min(n, 8)
				s := st
				if variant == "50-hint" { // as the simulator's members: decided from the replica's view
					s = store.New(rdb, store.Config{StaleThreshold: time.Hour, Policy: benchLimits(b), DecideFromView: true})
				}
				b.Run("nodes="+variant, func(b *testing.B) {
					runSerialAndParallel(b, rdb, "decisions/s", "evalsha", func(ctx context.Context, seq int64) error {
						d, err := s.Reserve(ctx, model.ReserveRequest{
							ID:        "b" + strconv.FormatInt(seq, 36),
							Requester: benchClusterID(int(seq) % requesters),
							Resources: benchRequests[seq%int64(len(benchRequests))],
							Duration:  time.Hour,
						})
						if err == nil && (d.Reservation.Node == "") != (variant == "0") {
							err = fmt.Errorf("reservation on node %q with %s nodes", d.Reservation.Node, variant)
						}
						return err
					})
				})
			}
		})
	}
}

// BenchmarkReserveReplicated measures what waiting for a replica costs a
// decision (Config.Replicas: the script, a mark write and WAIT in one round
// trip, answered once the replica acknowledged): 100 clusters, a primary with
// one replica on loopback, the same store with wait=off (Replicas 0) and
// wait=on (Replicas 1), in the same run.
func BenchmarkReserveReplicated(b *testing.B) {
	ctx := context.Background()
	primary := redistest.Start(b)
	rdb := primary.Client()
	admins.Store(rdb, primary.AdminClient())
	b.Cleanup(func() { admins.Delete(rdb) })
	replica := redistest.Start(b).AdminClient()
	host, port, _ := net.SplitHostPort(primary.Addr)
	require.NoError(b, replica.ConfigSet(ctx, "masteruser", redistest.AdminUser).Err())
	require.NoError(b, replica.ConfigSet(ctx, "masterauth", primary.Users.AdminPassword).Err())
	require.NoError(b, replica.ReplicaOf(ctx, host, port).Err())
	require.Eventually(b, func() bool {
		info, err := replica.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 30*time.Second, 10*time.Millisecond, "the replica never synced")

	const n = 100
	for _, wait := range []int{0, 1} {
		// A busy test machine can starve the replica for a second: the
		// benchmark measures the wait, it must not fail on its timeout.
		st := store.New(rdb, store.Config{StaleThreshold: time.Hour, Policy: benchLimits(b), Replicas: wait, ReplicaTimeout: 2 * time.Second})
		require.NoError(b, st.LoadScripts(ctx))
		if wait == 0 {
			advertiseMany(b, st, n)
		}
		b.Run(fmt.Sprintf("clusters=%d/wait=%s", n, map[int]string{0: "off", 1: "on"}[wait]), func(b *testing.B) {
			runSerialAndParallel(b, rdb, "decisions/s", "evalsha", func(ctx context.Context, seq int64) error {
				_, err := st.Reserve(ctx, model.ReserveRequest{
					ID:        "b" + strconv.FormatInt(seq, 36),
					Requester: benchClusterID(int(seq) % 8),
					Resources: benchRequests[seq%int64(len(benchRequests))],
					Duration:  time.Hour,
				})
				return err
			})
		})
	}
}

// BenchmarkReservePreferences measures what preferences cost a decision:
// none (the path of every request without them), a first term that fits
// (by label: a fifth of the clusters, region eu-south; by name: eight
// clusters), and a first term that fits nothing (eight clusters named, all
// full: each is judged, then the decision runs again without preferences,
// the cost of the fallback). docs/benchmarks.md, "Preferences", has figures.
func BenchmarkReservePreferences(b *testing.B) {
	st, _ := benchStore(b)
	ctx := context.Background()
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			require.NoError(b, admin(b, st).FlushAll(ctx).Err())
			require.NoError(b, st.LoadScripts(ctx))
			advertiseMany(b, st, n)
			var named, full []string
			for i := range 8 {
				named = append(named, benchClusterID(10+i))
				id := fmt.Sprintf("full%d", i)
				ad := benchCluster(rand.New(rand.NewPCG(uint64(i), 7)), id)
				ad.Allocated = ad.Allocatable
				_, err := st.Advertise(ctx, id, ad)
				require.NoError(b, err)
				full = append(full, id)
			}
			requesters := 8 // c00000-c00007: never candidates, nor among the named
			for _, v := range []struct {
				name  string
				prefs []model.Preference
			}{
				{"none", nil},
				{"first-fits-label", []model.Preference{{Weight: 100, Labels: map[string]string{"region": "eu-south"}}}},
				{"first-fits-named", []model.Preference{{Weight: 100, Clusters: named}}},
				{"first-fits-nothing", []model.Preference{{Weight: 100, Clusters: full}, {Weight: 50, Labels: map[string]string{"region": "mars"}}}},
			} {
				b.Run("prefs="+v.name, func(b *testing.B) {
					runSerialAndParallel(b, st.Client().(*redis.Client), "decisions/s", "evalsha", func(ctx context.Context, seq int64) error {
						_, err := st.Reserve(ctx, model.ReserveRequest{
							ID:          "p" + strconv.FormatInt(seq, 36),
							Requester:   benchClusterID(int(seq) % requesters),
							Resources:   benchRequests[seq%int64(len(benchRequests))],
							Duration:    time.Hour,
							Preferences: v.prefs,
						})
						return err
					})
				})
			}
		})
	}
}

// BenchmarkRelease measures ending one reservation (release.lua) placed on
// a node of a cluster advertising 50 (the simulator's size): the capacity
// given back to the cluster's counters, its node's debit and its index
// entries. Redis time per release (redis-us/op); parallel: callers overlap, so
// releases share calls (ops/call).
func BenchmarkRelease(b *testing.B) {
	st, rdb := benchStore(b)
	ctx := context.Background()
	const n, nodes = 100, 50
	rng := rand.New(rand.NewPCG(n, 50))
	for i := range n {
		ad := benchCluster(rng, benchClusterID(i))
		ad.Nodes = make([]model.NodeCapacity, nodes)
		for k := range ad.Nodes {
			a := model.Resources{CPU: ad.Allocatable.CPU / nodes, Memory: ad.Allocatable.Memory / nodes,
				GPU: ad.Allocatable.GPU / nodes, Storage: ad.Allocatable.Storage / nodes}
			pct := rng.Int64N(70)
			ad.Nodes[k] = model.NodeCapacity{Name: fmt.Sprintf("node-%02d", k), Allocatable: a,
				Allocated: model.Resources{CPU: a.CPU * pct / 100, Memory: a.Memory * pct / 100, Storage: a.Storage * pct / 100}}
		}
		_, err := st.Advertise(ctx, benchClusterID(i), ad)
		require.NoError(b, err)
	}
	type placed struct{ requester, id string }
	place := func(b *testing.B) []placed {
		held := make([]placed, b.N)
		for i := range held {
			seq := benchSeq.Add(1)
			req := model.ReserveRequest{ID: "rel" + strconv.FormatInt(seq, 36), Requester: benchClusterID(int(seq) % 8),
				Resources: model.Resources{CPU: 250, Memory: gi / 4}, Duration: time.Hour}
			_, err := st.Reserve(ctx, req)
			require.NoError(b, err)
			held[i] = placed{req.Requester, req.ID}
		}
		require.NoError(b, adminOf(b, rdb).ConfigResetStat(ctx).Err())
		return held
	}
	// serial: one caller, one release.lua call per release; parallel:
	// benchParallelism × GOMAXPROCS callers, whose releases the store
	// batches (store.batcher).
	b.Run(fmt.Sprintf("nodes=%d/serial", nodes), func(b *testing.B) {
		held := place(b)
		lat := make([]time.Duration, 0, len(held))
		b.ResetTimer()
		for _, p := range held {
			t0 := time.Now()
			if _, err := st.Release(ctx, p.requester, p.id, p.requester); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		report(b, rdb, "releases/s", "evalsha", lat)
	})
	b.Run(fmt.Sprintf("nodes=%d/parallel", nodes), func(b *testing.B) {
		held := place(b)
		var next atomic.Int64
		runParallel(b, rdb, "releases/s", "evalsha", func(ctx context.Context, _ int64) error {
			p := held[next.Add(1)-1]
			_, err := st.Release(ctx, p.requester, p.id, p.requester)
			return err
		})
	})
}
