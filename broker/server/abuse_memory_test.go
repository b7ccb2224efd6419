package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestAbuseEndedReservationsBounded: a member reserving and releasing at its
// full rate kept every ended reservation for the retention (about 1.3 KB
// each: 60,000, 80 MB, at the default rate), so a few members could take
// Redis to maxmemory, and every member's writes with it. Now the ended
// reservations a member keeps are capped: what mallory's take in Redis
// stays under its cap, rome's are untouched, and the usage list shows both.
func TestAbuseEndedReservationsBounded(t *testing.T) {
	const (
		limit  = 40  // --max-ended-per-member, small to keep the test short
		cycles = 300 // mallory's reserve-and-release cycles
	)
	p, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n" +
		"requesters: {default: {reservesPerSecond: 200, reserveBurst: 20}}\n"))
	require.NoError(t, err)
	b := brokertest.Start(t, brokertest.Options{Store: store.Config{Policy: p, MaxEndedPerMember: limit}})
	b.Advertise("paris", "64", "256Gi", "", "0.03", nil)
	cycle := func(cn, id string) bool {
		code, data := b.Do(cn, http.MethodPost, "/api/v2/reservations", reservation(id, "100m", "128Mi"))
		if code == http.StatusTooManyRequests {
			return false // at its rate
		}
		require.Equal(t, http.StatusCreated, code, "%s", data)
		code, data = b.Do(cn, http.MethodDelete, "/api/v2/reservations/"+id, nil)
		require.Equal(t, http.StatusOK, code, "%s", data)
		return true
	}
	for i := range 5 {
		require.True(t, cycle("rome", fmt.Sprintf("honest-%d", i)))
	}

	// mallory, from two goroutines, as fast as its rate lets it.
	var ended, limited atomic.Int64
	var seq atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ended.Load() < cycles {
				if cycle("mallory", fmt.Sprintf("m-%d", seq.Add(1))) {
					ended.Add(1)
				} else {
					limited.Add(1)
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("mallory ended %d reservations in %s (%d calls refused by its rate)", ended.Load(), time.Since(start).Round(time.Millisecond), limited.Load())
	require.Positive(t, limited.Load(), "mallory ran at its full rate")

	// What mallory's ended reservations take in Redis.
	ctx := context.Background()
	memoryOf := func(pattern string) (keys int, bytes int64) {
		iter := b.RDB.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			n, err := b.RDB.MemoryUsage(ctx, iter.Val()).Result()
			require.NoError(t, err)
			keys++
			bytes += n
		}
		require.NoError(t, iter.Err())
		return keys, bytes
	}
	keys, records := memoryOf("rb:{b}:resv:mallory/*")
	_, set := memoryOf("rb:{b}:ended:mallory")
	t.Logf("mallory keeps %d ended reservations: %d bytes, and %d bytes of its ended set", keys, records, set)
	assert.Equal(t, limit, keys, "mallory keeps its cap of ended reservations, not the %d it ended", ended.Load())
	assert.LessOrEqual(t, records+set, int64(limit*2048), "under 2 KB each, its set included")
	romeKeys, _ := memoryOf("rb:{b}:resv:rome/*")
	assert.Equal(t, 5, romeKeys, "rome's ended reservations are untouched")

	code, data := b.Do("rome", http.MethodGet, "/api/v2/usage", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	got := map[string]int64{}
	for _, u := range brokertest.Decode[[]api.MemberUsage](t, data) {
		got[u.Cluster] = u.EndedReservations
	}
	assert.Equal(t, map[string]int64{"mallory": limit, "rome": 5, "paris": 0}, got)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// TestAbuseRedisMemoryShown: nothing told how far Redis was from its
// maxmemory until it got there and refused every member's writes. /readyz
// and the metrics say it now: unlimited, then the headroom, then a warning
// near maxmemory (readiness holds: every replica shares the one Redis).
func TestAbuseRedisMemoryShown(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	get := func(path string) string { return healthGet(t, b, path) }
	metric := func(name string) (float64, bool) {
		for _, line := range strings.Split(get("/metrics"), "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				require.NoError(t, err, line)
				return f, true
			}
		}
		return 0, false
	}
	// What Redis counts against maxmemory, as the administrator reads it.
	used := func() int64 {
		info, err := b.RDB.InfoMap(ctx, "memory").Result()
		require.NoError(t, err)
		n, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
		require.NoError(t, err)
		buffers, err := strconv.ParseInt(info["Memory"]["mem_not_counted_for_evict"], 10, 64)
		require.NoError(t, err)
		return n - buffers
	}

	body := get("/readyz")
	assert.True(t, strings.HasPrefix(body, "ok\n"), body)
	assert.Contains(t, body, "no maxmemory (unlimited)")
	limit, ok := metric("rb_broker_redis_maxmemory_bytes")
	assert.True(t, ok)
	assert.Zero(t, limit, "0: unlimited")
	usedBytes, _ := metric("rb_broker_redis_memory_used_bytes")
	assert.Positive(t, usedBytes)
	_, ok = metric("rb_broker_redis_memory_headroom_bytes")
	assert.False(t, ok, "no headroom without a maxmemory")

	// 16 MiB in Redis (SETRANGE: no 16 MiB command in a query buffer), so
	// that a few KB more or less (connections, the probe's key) do not move
	// the shares below.
	require.NoError(t, b.RDB.SetRange(ctx, "ballast", 16<<20-1, "x").Err())
	require.NoError(t, b.RDB.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	t.Cleanup(func() { b.RDB.ConfigSet(ctx, "maxmemory", "0") })

	// 64 MiB of headroom: shown once the reading is renewed (every 5s).
	maxmemory := used() + 64<<20
	require.NoError(t, b.RDB.ConfigSet(ctx, "maxmemory", strconv.FormatInt(maxmemory, 10)).Err())
	require.Eventually(t, func() bool { return strings.Contains(get("/readyz"), "of maxmemory") }, 10*time.Second, 100*time.Millisecond)
	body = get("/readyz")
	assert.Regexp(t, `redis memory: [0-9.]+ MiB used of maxmemory [0-9.]+ MiB \([0-9.]+%\), 6[34]\.[0-9] MiB headroom`, body)
	assert.NotContains(t, body, "warning")
	headroom, ok := metric("rb_broker_redis_memory_headroom_bytes")
	require.True(t, ok)
	assert.InDelta(t, float64(64<<20), headroom, float64(1<<20))
	limit, _ = metric("rb_broker_redis_maxmemory_bytes")
	assert.Equal(t, float64(maxmemory), limit)

	// 97% of maxmemory: a warning, still ready.
	maxmemory = used() * 100 / 97
	require.NoError(t, b.RDB.ConfigSet(ctx, "maxmemory", strconv.FormatInt(maxmemory, 10)).Err())
	require.Eventually(t, func() bool { return strings.Contains(get("/readyz"), "warning") }, 10*time.Second, 100*time.Millisecond)
	body = get("/readyz")
	assert.True(t, strings.HasPrefix(body, "ok\n"), "ready: %s", body)
	assert.Contains(t, body, "near maxmemory")
	headroom, _ = metric("rb_broker_redis_memory_headroom_bytes")
	assert.Less(t, headroom, 0.05*float64(maxmemory))
}
