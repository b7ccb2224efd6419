package server_test

// BenchmarkStreamsReserve measures what 1,000 event streams held open by one
// member do to the other members: two honest members reserve through the
// HTTP API (mutual TLS, a real redis-server, rb-broker's defaults: 5 s
// keep-alives; the tests' Redis pool of 64 connections) with no stream open
// (base-*, the baseline), while one member holds 1,000 streams that get
// only keep-alives (p50-ms, p99-ms), and while that member also reserves 5
// times a second, each of its events written to all 1,000 streams
// (events-*). The three phases alternate in rounds (the streams opened and
// closed each round) so that load that comes and goes on a shared machine
// weighs on all of them alike; each reports the latencies of every round
// together. Also: the Redis connections in use with the streams open, the
// heap (the broker's and the clients': one process). It runs only with
// -bench; see docs/benchmarks.md.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const (
	abuseRounds     = 10
	abuseStreams    = 1000
	abuseEventEvery = 200 * time.Millisecond // the stream holder's own reservations: each event goes to its 1,000 streams
)

func BenchmarkStreamsReserve(b *testing.B) {
	ctx := context.Background()
	bk := brokertest.Start(b, brokertest.Options{
		Store:                store.Config{StaleThreshold: time.Hour},
		ExpiryInterval:       time.Second,     // rb-broker's default
		EventKeepAlive:       5 * time.Second, // rb-broker's default
		MaxStreamsPerCluster: -1,              // the cap (8) is what would refuse them: measured without it
	})
	rng := rand.New(rand.NewPCG(18, 2))
	for i := range 20 {
		id := fmt.Sprintf("p%02d", i)
		_, err := bk.Store.Advertise(ctx, id, benchProvider(rng, id))
		require.NoError(b, err)
	}
	honest := []string{"rome", "milan"}
	for _, cn := range append(honest, "greedy") {
		bk.Client(cn) // certificates issued before the clock starts
	}
	var seq atomic.Int64
	reserve := func(cn string) (time.Duration, error) {
		body := fmt.Sprintf(`{"id":"r-%d","resources":{"cpu":"100m","memory":"128Mi"}}`, seq.Add(1))
		t0 := time.Now()
		resp, err := bk.Client(cn).Post(bk.URL+"/api/v2/reservations", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return 0, fmt.Errorf("reserve as %s: %s", cn, resp.Status)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return time.Since(t0), nil
	}
	// measure runs n reservations per honest member, the members at once,
	// and returns every latency.
	measure := func(b *testing.B, n int) []time.Duration {
		var mu sync.Mutex
		var all []time.Duration
		var wg sync.WaitGroup
		for _, cn := range honest {
			wg.Add(1)
			go func() {
				defer wg.Done()
				local := make([]time.Duration, 0, n)
				for range n {
					d, err := reserve(cn)
					if err != nil {
						b.Error(err)
						return
					}
					local = append(local, d)
				}
				mu.Lock()
				all = append(all, local...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return all
	}
	pct := func(all []time.Duration, p float64) float64 {
		return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond)
	}
	var base, held, events []time.Duration
	var streamEvents, eventSeconds float64
	var conns int64
	var heap uint64
	b.ResetTimer()
	for round := range abuseRounds {
		n := b.N / abuseRounds
		if round < b.N%abuseRounds {
			n++
		}
		base = append(base, measure(b, n)...)

		streamCtx, stop := context.WithCancel(ctx)
		var received atomic.Int64
		b.StopTimer()
		openRawStreams(b, streamCtx, bk, "greedy", abuseStreams, "", &received)
		// What is measured is streams open, not 1,000 handshakes just made:
		// their garbage is collected first.
		runtime.GC()
		b.StartTimer()
		held = append(held, measure(b, n)...)
		stats := bk.Store.Client().PoolStats()
		conns = max(conns, int64(stats.TotalConns-stats.IdleConns))

		reserving := make(chan struct{})
		go func() {
			defer close(reserving)
			t := time.NewTicker(abuseEventEvery)
			defer t.Stop()
			for {
				select {
				case <-streamCtx.Done():
					return
				case <-t.C:
					if _, err := reserve("greedy"); err != nil && streamCtx.Err() == nil {
						b.Error(err)
					}
				}
			}
		}()
		before, t0 := received.Load(), time.Now()
		events = append(events, measure(b, n)...)
		streamEvents += float64(received.Load() - before)
		eventSeconds += time.Since(t0).Seconds()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap = max(heap, ms.HeapInuse)
		stop()
		<-reserving
		b.StopTimer()
		require.Eventually(b, func() bool { return strings.Contains(scrapeMetrics(b, bk), "rb_broker_event_streams 0") },
			10*time.Second, 20*time.Millisecond, "the streams closed")
		runtime.GC()
		b.StartTimer()
	}
	b.StopTimer()
	for _, l := range []struct {
		prefix string
		all    []time.Duration
	}{{"base-", base}, {"", held}, {"events-", events}} {
		slices.Sort(l.all)
		b.ReportMetric(pct(l.all, 0.50), l.prefix+"p50-ms")
		b.ReportMetric(pct(l.all, 0.99), l.prefix+"p99-ms")
	}
	b.ReportMetric(pct(held, 0.99)/pct(base, 0.99), "p99-ratio")
	b.ReportMetric(pct(events, 0.99)/pct(base, 0.99), "events-p99-ratio")
	b.ReportMetric(streamEvents/eventSeconds, "stream-events/s")
	b.ReportMetric(float64(conns), "redis-conns-in-use")
	b.ReportMetric(float64(heap)/(1<<20), "heap-MiB")
}

// scrapeMetrics returns the broker's /metrics.
func scrapeMetrics(b *testing.B, bk *brokertest.Broker) string {
	resp, err := http.Get(bk.Health + "/metrics")
	require.NoError(b, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	return string(data)
}
