package server_test

// BenchmarkHTTPReserve measures reservations through the real v2 API (HTTPS,
// mutual TLS, keep-alive clients, a real redis-server) against the same
// Store.Reserve called in-process on the same broker, in the same run, so the
// HTTP overhead is the ratio of the two. It runs only with -bench; see
// docs/benchmarks.md.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
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

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const (
	benchProviders   = 100
	benchRequesters  = 8
	benchParallelism = 8 // × GOMAXPROCS goroutines in flight
	benchScale       = 1000
)

// benchProvider is a realistic, varied advertisement scaled by benchScale so
// that no run exhausts it (every iteration is one new reservation).
func benchProvider(rng *rand.Rand, id string) store.Advertisement {
	const gi = int64(1) << 30
	cores := []int64{16, 32, 48, 64, 96, 128, 256, 512, 1024}[rng.IntN(9)]
	memPerCore := []int64{2, 4, 8}[rng.IntN(3)]
	r := store.Resources{CPU: cores * 1000 * benchScale, Memory: cores * memPerCore * gi * benchScale, Storage: cores * 10 * gi * benchScale}
	if rng.IntN(5) == 0 {
		r.GPU = []int64{1, 2, 4, 8}[rng.IntN(4)] * benchScale
	}
	usedPct := rng.Int64N(70)
	used := store.Resources{CPU: r.CPU * usedPct / 100, Memory: r.Memory * usedPct / 100, GPU: r.GPU / 2}
	return store.Advertisement{
		Name: id, Endpoint: "https://" + id + ".example:6443",
		Labels:   map[string]string{"region": []string{"eu-west", "eu-central", "eu-south"}[rng.IntN(3)]},
		Capacity: r, Allocatable: r, Allocated: used,
		Prices: store.Prices{CPU: 20_000 + rng.Int64N(40_000), Memory: 2_000 + rng.Int64N(4_000), GPU: 500_000 + rng.Int64N(2_000_000), Currency: "EUR"},
	}
}

// latencies collects per-operation durations from the parallel goroutines.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, rdb *redis.Client) {
	secs := b.Elapsed().Seconds()
	if secs > 0 {
		b.ReportMetric(float64(b.N)/secs, "reservations/s")
	}
	// Server time of the scripts (reserve, and the broker's expiry timer) from
	// INFO commandstats, reset before the timed loop.
	if calls, usec := evalshaStats(b, rdb); calls > 0 && secs > 0 {
		b.ReportMetric(float64(usec)/float64(calls), "redis-us/op")
		b.ReportMetric(100*float64(usec)/1e6/secs, "redis-busy-%")
	}
	if len(l.all) == 0 {
		return
	}
	slices.Sort(l.all)
	pct := func(p float64) float64 {
		return float64(l.all[int(p*float64(len(l.all)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// evalshaStats returns the calls and microseconds of EVALSHA since the last CONFIG RESETSTAT.
func evalshaStats(b *testing.B, rdb *redis.Client) (calls, usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return calls, usec
}

// runParallel runs op from benchParallelism × GOMAXPROCS goroutines; worker
// is the goroutine's index, seq a number unique across every run.
func runParallel(b *testing.B, rdb *redis.Client, seq *atomic.Int64, op func(worker int, seq int64) error) {
	require.NoError(b, rdb.ConfigResetStat(context.Background()).Err())
	var lat latencies
	var workers atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		worker := int(workers.Add(1) - 1)
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t0 := time.Now()
			if err := op(worker, seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
			local = append(local, time.Since(t0))
		}
		lat.add(local)
	})
	b.StopTimer()
	lat.report(b, rdb)
}

func BenchmarkHTTPReserve(b *testing.B) {
	ctx := context.Background()
	bk := brokertest.Start(b, brokertest.Options{
		Store:          store.Config{StaleThreshold: time.Hour}, // advertised once, live through the run
		ExpiryInterval: time.Second,                             // rb-broker's default
	})
	rng := rand.New(rand.NewPCG(benchProviders, 42))
	var g errgroup.Group
	g.SetLimit(16)
	for i := range benchProviders {
		id := fmt.Sprintf("p%03d", i)
		ad := benchProvider(rng, id)
		g.Go(func() error { _, err := bk.Store.Advertise(ctx, id, ad); return err })
	}
	require.NoError(b, g.Wait())

	requesters := make([]string, benchRequesters)
	clients := make([]*http.Client, benchRequesters)
	for i := range requesters {
		requesters[i] = fmt.Sprintf("requester-%d", i)
		clients[i] = bk.Client(requesters[i])
	}
	const cpu, memory = "500m", "1Gi"
	// The request body with its id spliced in: no JSON encoding in the loop.
	tmpl, err := json.Marshal(reservation("ID", cpu, memory))
	require.NoError(b, err)
	head, tail, ok := bytes.Cut(tmpl, []byte(`"ID"`))
	require.True(b, ok)
	direct, err := reservation("x", cpu, memory).ToStore("x", api.Limits{DefaultDuration: time.Hour})
	require.NoError(b, err)
	url := bk.URL + "/api/v2/reservations"
	var seq atomic.Int64

	b.Run("baseline-store-direct", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, func(worker int, n int64) error {
			req := direct
			req.ID = "d" + strconv.FormatInt(n, 36)
			req.Requester = requesters[worker%benchRequesters]
			_, err := bk.Store.Reserve(ctx, req)
			return err
		})
	})
	post := func(worker int, id string, want int) error {
		body := make([]byte, 0, len(tmpl)+16)
		body = append(body, head...)
		body = strconv.AppendQuote(body, id)
		body = append(body, tail...)
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := clients[worker%benchRequesters].Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("POST /api/v2/reservations %s: %s, want %d", id, resp.Status, want)
		}
		return err
	}
	b.Run("https-mtls", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, func(worker int, n int64) error {
			return post(worker, "h"+strconv.FormatInt(n, 36), http.StatusCreated)
		})
	})

	// The same two paths when the decision is nearly free: each requester
	// retries one reservation it already holds, which the reserve script answers
	// from one HGETALL ("replay", 200). This is the ceiling of the HTTP stack on
	// this machine, whatever the decision costs.
	for i := range benchRequesters {
		require.NoError(b, post(i, "replay-"+strconv.Itoa(i), http.StatusCreated))
	}
	b.Run("replay-baseline-store-direct", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, func(worker int, _ int64) error {
			req := direct
			req.ID = "replay-" + strconv.Itoa(worker%benchRequesters)
			req.Requester = requesters[worker%benchRequesters]
			d, err := bk.Store.Reserve(ctx, req)
			if err == nil && !d.Replayed {
				err = fmt.Errorf("%s was decided again", req.ID)
			}
			return err
		})
	})
	b.Run("replay-https-mtls", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, func(worker int, _ int64) error {
			return post(worker, "replay-"+strconv.Itoa(worker%benchRequesters), http.StatusOK)
		})
	})
}
