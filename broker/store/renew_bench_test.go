package store_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// BenchmarkRenew measures renewals per renewed id, over 10,000 leases of
// 100 requesters (100 each: the agent's call at 1,000,000 leases over
// 10,000 members) and 5,000 of one more (api.MaxRenewBatch), 2-minute
// leases and hold times as the agent makes them, one call at a time:
//   - same-100: each of the 100 requesters renews its 100 ids, the same
//     every op: its renewal set renews them at once (scripts/lib/renew_set.lua);
//   - changing-100: each names 99 of its 100 ids, another one left out every
//     op: each call is a full renewal, id by id, and no set is opened;
//   - batch-5000: the one requester's 5,000 ids in one call, id by id
//     (store.RenewalSetMaxIDs);
//   - churn-100: before each op (not measured: its Redis CPU is taken out)
//     each requester releases its oldest lease and reserves a new one, as
//     pods end and start; each then renews the 100 it holds.
//
// Every renewal extends its lease (now + lease is later than its last end),
// so each id renewed one by one pays the write. Reports, per id:
// redis-us/id (EVALSHA time inside Redis, INFO commandstats) and
// redis-cpu-us/id (the server's CPU, INFO cpu: the truer figure on a loaded
// machine, where commandstats also counts the waits for a core).
func BenchmarkRenew(b *testing.B) {
	ctx := context.Background()
	rdb := startRedis(b)
	st := store.New(rdb, store.Config{StaleThreshold: time.Hour})
	require.NoError(b, st.LoadScripts(ctx))
	for i := range 4 {
		r := model.Resources{CPU: 100_000_000, Memory: 400_000 * gi, Storage: 1_000_000 * gi}
		_, err := st.Advertise(ctx, fmt.Sprintf("p%d", i), model.Advertisement{Capacity: r, Allocatable: r,
			Prices: model.Prices{CPU: 30_000 + int64(i)*1000, Memory: 4_000, Currency: "EUR"}})
		require.NoError(b, err)
	}
	leases := map[string][]string{} // requester -> its lease ids
	for r := range 100 {
		leases[fmt.Sprintf("r%02d", r)] = make([]string, 100)
	}
	leases["bulk"] = make([]string, 5000)
	var g errgroup.Group
	g.SetLimit(64)
	for requester, ids := range leases {
		for i := range ids {
			ids[i] = fmt.Sprintf("pod-%05d-0f3c9a2e-6b1d-4c8e-9a7f", i)
			g.Go(func() error {
				_, err := st.Reserve(ctx, model.ReserveRequest{ID: ids[i], Requester: requester, Owner: "default/pod",
					Resources: model.Resources{CPU: 250, Memory: 256 << 20}, Duration: 2 * time.Minute, Lease: 2 * time.Minute})
				return err
			})
		}
	}
	require.NoError(b, g.Wait())
	hundreds := slices.DeleteFunc(slices.Sorted(maps.Keys(leases)), func(r string) bool { return r == "bulk" })

	renew := func(b *testing.B, requester string, ids []string) {
		out, err := st.Renew(ctx, requester, ids)
		require.NoError(b, err)
		for _, r := range out {
			if r.Outcome != model.Renewed {
				b.Fatalf("%s: %s", r.ID, r.Outcome)
			}
		}
	}
	churn := func(b *testing.B, n int) {
		for _, r := range hundreds {
			ids := leases[r]
			_, err := st.Release(ctx, r, ids[0], r)
			require.NoError(b, err)
			id := fmt.Sprintf("pod-new-%06d-0f3c9a2e-6b1d-4c8e", n)
			_, err = st.Reserve(ctx, model.ReserveRequest{ID: id, Requester: r, Owner: "default/pod",
				Resources: model.Resources{CPU: 250, Memory: 256 << 20}, Duration: 2 * time.Minute, Lease: 2 * time.Minute})
			require.NoError(b, err)
			leases[r] = append(ids[1:], id)
		}
	}
	for _, bc := range []struct {
		name    string
		prepare func(b *testing.B, n int)     // before the nth op, not measured; nil: none
		op      func(b *testing.B, n int) int // renews once, the nth time; returns the ids renewed
	}{
		{"same-100", nil, func(b *testing.B, _ int) int {
			for _, r := range hundreds {
				renew(b, r, leases[r])
			}
			return 100 * len(hundreds)
		}},
		{"changing-100", nil, func(b *testing.B, n int) int {
			for _, r := range hundreds {
				ids := leases[r]
				renew(b, r, slices.Delete(slices.Clone(ids), n%len(ids), n%len(ids)+1))
			}
			return 99 * len(hundreds)
		}},
		{"batch-5000", nil, func(b *testing.B, _ int) int {
			renew(b, "bulk", leases["bulk"])
			return len(leases["bulk"])
		}},
		{"churn-100", churn, func(b *testing.B, _ int) int {
			for _, r := range hundreds {
				renew(b, r, leases[r])
			}
			return 100 * len(hundreds)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bc.op(b, 0) // the first two renewals of a set are full: not measured
			bc.op(b, 0)
			admin := adminOf(b, rdb)
			require.NoError(b, admin.ConfigResetStat(ctx).Err())
			cpu0 := redisCPUSeconds(b, admin)
			renewed, n, unmeasured := 0, 1, 0.0
			for b.Loop() {
				if bc.prepare != nil {
					b.StopTimer()
					c := redisCPUSeconds(b, admin)
					bc.prepare(b, n)
					unmeasured += redisCPUSeconds(b, admin) - c
					b.StartTimer()
				}
				renewed += bc.op(b, n)
				n++
			}
			b.ReportMetric((redisCPUSeconds(b, admin)-cpu0-unmeasured)*1e6/float64(renewed), "redis-cpu-us/id")
			if s := readStats(b, rdb)["evalsha"]; s.calls > 0 && bc.prepare == nil {
				b.ReportMetric(float64(s.usec)/float64(renewed), "redis-us/id")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(renewed), "ns/id")
		})
	}
}

// redisCPUSeconds is the server's CPU so far (INFO cpu: used_cpu_sys + used_cpu_user).
func redisCPUSeconds(b *testing.B, admin *redis.Client) float64 {
	info, err := admin.Info(context.Background(), "cpu").Result()
	require.NoError(b, err)
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			s, err := strconv.ParseFloat(v, 64)
			require.NoError(b, err)
			total += s
		}
	}
	return total
}

// BenchmarkCoveredLeases measures what covered leases cost in a steady
// state: 10,000 leases of 100 requesters (100 each), each requester renewing
// its set at once (scripts/lib/renew_set.lua), and expiry runs between the
// renewals (scripts/expire.lua). 5-second leases, so that every score is
// within expiry's look-ahead at every run: a version that moves each covered
// lease's score to its end moves all 10,000 each op (in a real federation
// once per lease or so, every third or fourth renewal); one that parks them
// does so once, and reads nothing after. Reports the Redis CPU (INFO cpu) of
// the renewals and of expiry per lease per op, and expiry's wall time per
// lease per op.
func BenchmarkCoveredLeases(b *testing.B) {
	ctx := context.Background()
	rdb := startRedis(b)
	st := store.New(rdb, store.Config{StaleThreshold: time.Hour})
	require.NoError(b, st.LoadScripts(ctx))
	r := model.Resources{CPU: 100_000_000, Memory: 400_000 * gi, Storage: 1_000_000 * gi}
	_, err := st.Advertise(ctx, "p0", model.Advertisement{Capacity: r, Allocatable: r,
		Prices: model.Prices{CPU: 30_000, Memory: 4_000, Currency: "EUR"}})
	require.NoError(b, err)
	const length = 5 * time.Second
	leases := map[string][]string{}
	var g errgroup.Group
	g.SetLimit(64)
	for n := range 100 {
		requester := fmt.Sprintf("r%02d", n)
		ids := make([]string, 100)
		for i := range ids {
			ids[i] = fmt.Sprintf("pod-%05d-0f3c9a2e-6b1d-4c8e-9a7f", i)
			g.Go(func() error {
				_, err := st.Reserve(ctx, model.ReserveRequest{ID: ids[i], Requester: requester, Owner: "default/pod",
					Resources: model.Resources{CPU: 250, Memory: 256 << 20}, Duration: length, Lease: length})
				return err
			})
		}
		leases[requester] = ids
	}
	require.NoError(b, g.Wait())
	renewAll := func() {
		for requester, ids := range leases {
			out, err := st.Renew(ctx, requester, ids)
			require.NoError(b, err)
			require.Equal(b, model.Renewed, out[0].Outcome)
		}
	}
	renewAll() // the full renewals that make the sets
	renewAll()
	admin := adminOf(b, rdb)
	var renewCPU, expireCPU float64
	var took time.Duration
	ops := 0
	for b.Loop() {
		b.StopTimer()
		time.Sleep(2 * time.Millisecond) // a later renewal time than the scores'
		cpu0 := redisCPUSeconds(b, admin)
		renewAll()
		cpu1 := redisCPUSeconds(b, admin)
		b.StartTimer()
		start := time.Now()
		res, err := st.ExpireRun(ctx)
		took += time.Since(start)
		b.StopTimer()
		require.NoError(b, err)
		require.Zero(b, res.Expired)
		renewCPU += cpu1 - cpu0
		expireCPU += redisCPUSeconds(b, admin) - cpu1
		ops++
		b.StartTimer()
	}
	n := float64(ops * 100 * 100)
	b.ReportMetric(renewCPU*1e6/n, "renew-redis-cpu-us/lease")
	b.ReportMetric(expireCPU*1e6/n, "expire-redis-cpu-us/lease")
	b.ReportMetric(float64(took.Nanoseconds())/n, "expire-ns/lease")
}
