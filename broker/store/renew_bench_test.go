package store_test

import (
	"context"
	"fmt"
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

// renewLeases is how many leases BenchmarkRenew renews per op: one requester's.
const renewLeases = 10_000

// BenchmarkRenew measures renew.lua per renewed id: 10,000 leases of one
// requester (2-minute leases and hold times, as the agent makes them), all
// renewed once per op, one call at a time, in calls of 100 ids (the agent's
// batch at 1,000,000 leases over 10,000 members) and of 5,000
// (api.MaxRenewBatch). Every renewal extends its lease (now + lease is later
// than its last end), so each id pays the write. Reports, per id: redis-us/id
// (EVALSHA time inside Redis, INFO commandstats) and redis-cpu-us/id (the
// server's CPU, INFO cpu: the truer figure on a loaded machine, where
// commandstats also counts the waits for a core).
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
	ids := make([]string, renewLeases)
	var g errgroup.Group
	g.SetLimit(64)
	for i := range ids {
		ids[i] = fmt.Sprintf("pod-%05d-0f3c9a2e-6b1d-4c8e-9a7f", i)
		g.Go(func() error {
			_, err := st.Reserve(ctx, model.ReserveRequest{ID: ids[i], Requester: "rome", Owner: "default/pod",
				Resources: model.Resources{CPU: 250, Memory: 256 << 20}, Duration: 2 * time.Minute, Lease: 2 * time.Minute})
			return err
		})
	}
	require.NoError(b, g.Wait())

	for _, batch := range []int{100, 5000} {
		b.Run(fmt.Sprintf("batch-%d", batch), func(b *testing.B) {
			admin := adminOf(b, rdb)
			require.NoError(b, admin.ConfigResetStat(ctx).Err())
			cpu0 := redisCPUSeconds(b, admin)
			for b.Loop() {
				for first := 0; first < len(ids); first += batch {
					out, err := st.Renew(ctx, "rome", ids[first:min(first+batch, len(ids))])
					require.NoError(b, err)
					for _, r := range out {
						if r.Outcome != model.Renewed {
							b.Fatalf("%s: %s", r.ID, r.Outcome)
						}
					}
				}
			}
			renewed := float64(b.N * len(ids))
			b.ReportMetric((redisCPUSeconds(b, admin)-cpu0)*1e6/renewed, "redis-cpu-us/id")
			if s := readStats(b, rdb)["evalsha"]; s.calls > 0 {
				b.ReportMetric(float64(s.usec)/renewed, "redis-us/id")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/renewed, "ns/id")
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
