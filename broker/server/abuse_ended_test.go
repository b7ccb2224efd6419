package server_test

import (
	"context"
	"fmt"
	"net/http"
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
