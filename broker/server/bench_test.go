package server_test

// BenchmarkHTTPReserve measures reservations through the real v2 API (HTTPS,
// mutual TLS, keep-alive clients, a real redis-server) against two baselines
// of the same run: the same Store.Reserve called in-process on the same
// broker (the HTTP layer's overhead is the ratio of the two) and GET /healthz
// over the same mutual-TLS connections (the floor of the HTTP stack). Each
// line also reports the CPU time per operation of this process (broker and
// clients) and of redis-server, steadier than the rates on a shared machine,
// and the interleaved line runs every path in alternating rounds so that its
// ratios are not skewed by load that comes and goes. It runs only with
// -bench; see docs/benchmarks.md.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
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
func benchProvider(rng *rand.Rand, id string) model.Advertisement {
	const gi = int64(1) << 30
	cores := []int64{16, 32, 48, 64, 96, 128, 256, 512, 1024}[rng.IntN(9)]
	memPerCore := []int64{2, 4, 8}[rng.IntN(3)]
	r := model.Resources{CPU: cores * 1000 * benchScale, Memory: cores * memPerCore * gi * benchScale, Storage: cores * 10 * gi * benchScale}
	if rng.IntN(5) == 0 {
		r.GPU = []int64{1, 2, 4, 8}[rng.IntN(4)] * benchScale
	}
	usedPct := rng.Int64N(70)
	used := model.Resources{CPU: r.CPU * usedPct / 100, Memory: r.Memory * usedPct / 100, GPU: r.GPU / 2}
	return model.Advertisement{
		Name: id, Endpoint: "https://" + id + ".example:6443",
		Labels:   map[string]string{"region": []string{"eu-west", "eu-central", "eu-south"}[rng.IntN(3)]},
		Capacity: r, Allocatable: r, Allocated: used,
		Prices: model.Prices{CPU: 20_000 + rng.Int64N(40_000), Memory: 2_000 + rng.Int64N(4_000), GPU: 500_000 + rng.Int64N(2_000_000), Currency: "EUR"},
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

func (l *latencies) report(b *testing.B, rdb *redis.Client, unit string) {
	secs := b.Elapsed().Seconds()
	if secs > 0 {
		b.ReportMetric(float64(b.N)/secs, unit)
	}
	// Server time of the scripts (reserve, and the broker's expiry timer) from
	// INFO commandstats, reset before the timed loop; per request, not per
	// call (concurrent reservations share a reserve call).
	if calls, usec := evalshaStats(b, rdb); calls > 0 && secs > 0 {
		b.ReportMetric(float64(usec)/float64(b.N), "redis-us/op")
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

// cpuTimes are CPU seconds (user + system) of this process (the broker and
// the benchmark's clients) and of redis-server (every thread), and the Go
// runtime's estimate of this process's garbage collection CPU (background
// marking, assists, pauses), which GOGC changes.
type cpuTimes struct{ self, redis, gc float64 }

var gcCPU = []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}

func readCPU(b testing.TB, rdb *redis.Client) cpuTimes {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	t := cpuTimes{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()}
	metrics.Read(gcCPU)
	if gcCPU[0].Value.Kind() == metrics.KindFloat64 {
		t.gc = gcCPU[0].Value.Float64()
	}
	info, err := rdb.Info(context.Background(), "cpu").Result()
	require.NoError(b, err)
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			t.redis += f
		}
	}
	return t
}

// reportCPU reports the CPU time per operation since start: on 2 shared
// cores, a steadier measure of cost than the rates.
func reportCPU(b *testing.B, rdb *redis.Client, start cpuTimes) {
	end := readCPU(b, rdb)
	if b.N > 0 {
		b.ReportMetric((end.self-start.self)*1e6/float64(b.N), "go-cpu-us/op")
		b.ReportMetric((end.gc-start.gc)*1e6/float64(b.N), "gc-cpu-us/op")
		b.ReportMetric((end.redis-start.redis)*1e6/float64(b.N), "redis-cpu-us/op")
	}
}

// runParallel runs op from benchParallelism × GOMAXPROCS goroutines; worker
// is the goroutine's index, seq a number unique across every run. unit names
// the rate; rate, if not nil, receives it.
func runParallel(b *testing.B, rdb *redis.Client, seq *atomic.Int64, unit string, rate func(float64), op func(worker int, seq int64) error) {
	require.NoError(b, rdb.ConfigResetStat(context.Background()).Err())
	cpu := readCPU(b, rdb)
	var lat latencies
	var workers atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ReportAllocs() // the whole process: the broker and the benchmark's clients
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
	reportCPU(b, rdb, cpu)
	lat.report(b, rdb, unit)
	if secs := b.Elapsed().Seconds(); secs > 0 && rate != nil {
		rate(float64(b.N) / secs)
	}
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
	// Rates of the baselines measured so far in this run (the last sample of
	// each), for the ratio metrics of the HTTP lines.
	rates := map[string]float64{}
	ratio := func(b *testing.B, rate float64, unit string, of ...string) {
		for _, name := range of {
			if base := rates[name]; base > 0 && rate > 0 {
				b.ReportMetric(rate/base, unit+"-"+name)
			}
		}
	}
	record := func(name string) func(float64) { return func(r float64) { rates[name] = r } }

	// The operations, one per line of the benchmark.
	storeDirect := func(worker int, n int64) error {
		req := direct
		req.ID = "d" + strconv.FormatInt(n, 36)
		req.Requester = requesters[worker%benchRequesters]
		_, err := bk.Store.Reserve(ctx, req)
		return err
	}
	// The floor of the HTTP stack: GET /healthz on the API port, over the same
	// keep-alive mutual-TLS connections, with no Redis call.
	healthz := bk.URL + "/healthz"
	floor := func(worker int, _ int64) error { return get(clients[worker%benchRequesters], healthz) }
	https := func(worker int, n int64) error {
		return post(clients[worker%benchRequesters], url, head, tail, "h"+strconv.FormatInt(n, 36), http.StatusCreated)
	}
	// The same two paths when the decision is nearly free: each requester
	// retries one reservation it already holds, which the reserve script answers
	// from one HGETALL ("replay", 200). This is the ceiling of the HTTP stack on
	// this machine, whatever the decision costs.
	for i := range benchRequesters {
		require.NoError(b, post(clients[i], url, head, tail, "replay-"+strconv.Itoa(i), http.StatusCreated))
	}
	replayStore := func(worker int, _ int64) error {
		req := direct
		req.ID = "replay-" + strconv.Itoa(worker%benchRequesters)
		req.Requester = requesters[worker%benchRequesters]
		d, err := bk.Store.Reserve(ctx, req)
		if err == nil && !d.Replayed {
			err = fmt.Errorf("%s was decided again", req.ID)
		}
		return err
	}
	replayHTTPS := func(worker int, _ int64) error {
		return post(clients[worker%benchRequesters], url, head, tail, "replay-"+strconv.Itoa(worker%benchRequesters), http.StatusOK)
	}
	// HTTP/2 instead of HTTP/1.1, same certificates (the broker offers both
	// through ALPN; the Go clients speak HTTP/1.1 unless told otherwise).
	h2 := make([]*http.Client, benchRequesters)
	for i, c := range clients {
		tr := c.Transport.(*http.Transport).Clone()
		tr.ForceAttemptHTTP2 = true
		b.Cleanup(tr.CloseIdleConnections)
		h2[i] = &http.Client{Transport: tr, Timeout: c.Timeout}
		resp, err := h2[i].Get(healthz)
		require.NoError(b, err)
		resp.Body.Close()
		require.Equal(b, 2, resp.ProtoMajor, "the broker did not negotiate HTTP/2")
	}
	replayHTTP2 := func(worker int, _ int64) error {
		return post(h2[worker%benchRequesters], url, head, tail, "replay-"+strconv.Itoa(worker%benchRequesters), http.StatusOK)
	}

	// One line per path, each for the whole -benchtime. The ratio metrics
	// compare with the last sample of the baselines run before them.
	b.Run("baseline-store-direct", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, "reservations/s", record("store"), storeDirect)
	})
	b.Run("floor-healthz-mtls", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, "requests/s", record("floor"), floor)
	})
	b.Run("https-mtls", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, "reservations/s", func(r float64) { ratio(b, r, "ratio-vs", "store", "floor") }, https)
	})
	b.Run("replay-baseline-store-direct", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, "reservations/s", record("replay-store"), replayStore)
	})
	b.Run("replay-https-mtls", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, "reservations/s", func(r float64) { ratio(b, r, "ratio-vs", "replay-store", "floor") }, replayHTTPS)
	})
	b.Run("replay-https-mtls-http2", func(b *testing.B) {
		runParallel(b, bk.RDB, &seq, "reservations/s", func(r float64) { ratio(b, r, "ratio-vs", "replay-store", "floor") }, replayHTTP2)
	})

	// The same two HTTPS paths against rb-broker in its own process (built from
	// cmd/rb-broker, its default flags and GC settings, same Redis, same
	// certificates): broker-cpu-us/op is the broker's CPU per request, from
	// /proc, and go-cpu-us/op is then the clients' (this process). Extra
	// environment for the broker: RB_BENCH_BROKER_ENV (e.g. GOGC=100); another
	// binary (e.g. one built from an older commit): RB_BENCH_BROKER_BIN; extra
	// flags: RB_BENCH_BROKER_FLAGS (e.g. --pprof-bind-address=127.0.0.1:6060).
	bin := os.Getenv("RB_BENCH_BROKER_BIN")
	if bin == "" {
		bin = brokertest.BuildBroker(b, b.TempDir())
	}
	proc := bk.StartProcess(bin, strings.Fields(os.Getenv("RB_BENCH_BROKER_ENV")),
		append([]string{"--stale-threshold=1h"}, strings.Fields(os.Getenv("RB_BENCH_BROKER_FLAGS"))...)...)
	procURL := proc.URL + "/api/v2/reservations"
	procLine := func(b *testing.B, unit string, op func(worker int, seq int64) error) {
		start, err := proc.CPU()
		require.NoError(b, err)
		runParallel(b, bk.RDB, &seq, unit, nil, op)
		end, err := proc.CPU()
		require.NoError(b, err)
		if b.N > 0 {
			b.ReportMetric(float64((end-start).Microseconds())/float64(b.N), "broker-cpu-us/op")
		}
	}
	b.Run("process-https-mtls", func(b *testing.B) {
		procLine(b, "reservations/s", func(worker int, n int64) error {
			return post(clients[worker%benchRequesters], procURL, head, tail, "x"+strconv.FormatInt(n, 36), http.StatusCreated)
		})
	})
	b.Run("process-replay-https-mtls", func(b *testing.B) {
		procLine(b, "reservations/s", func(worker int, _ int64) error {
			return post(clients[worker%benchRequesters], procURL, head, tail, "replay-"+strconv.Itoa(worker%benchRequesters), http.StatusOK)
		})
	})
	b.Run("process-replay-https-mtls-http2", func(b *testing.B) {
		procLine(b, "reservations/s", func(worker int, _ int64) error {
			return post(h2[worker%benchRequesters], procURL, head, tail, "replay-"+strconv.Itoa(worker%benchRequesters), http.StatusOK)
		})
	})

	// All the paths again, interleaved: each iteration is one round that runs
	// every path for a fixed number of operations, so that the load other
	// jobs put on the machine falls on all of them alike and the ratios hold
	// within one line. Use -benchtime Nx (N rounds).
	b.Run("interleaved", func(b *testing.B) {
		paths := []*interleavedPath{
			{name: "store", ops: 256, op: storeDirect},
			{name: "floor", ops: 1024, op: floor},
			{name: "https", ops: 256, op: https},
			{name: "replay-store", ops: 1024, op: replayStore},
			{name: "replay-https", ops: 1024, op: replayHTTPS},
		}
		b.ResetTimer()
		for range b.N {
			for _, p := range paths {
				p.round(b, bk.RDB, &seq)
			}
		}
		b.StopTimer()
		rate := map[string]float64{}
		for _, p := range paths {
			rate[p.name] = p.report(b)
		}
		b.ReportMetric(rate["https"]/rate["store"], "ratio-vs-store")
		b.ReportMetric(rate["https"]/rate["floor"], "ratio-vs-floor")
		b.ReportMetric(rate["replay-https"]/rate["replay-store"], "replay-ratio-vs-store")
		b.ReportMetric(rate["replay-https"]/rate["floor"], "replay-ratio-vs-floor")
	})
}

// interleavedPath accumulates one path's rounds in the interleaved benchmark.
type interleavedPath struct {
	name string
	ops  int // per round
	op   func(worker int, seq int64) error

	done int
	wall time.Duration
	cpu  cpuTimes
	lat  []time.Duration
}

// round runs p.ops operations from benchParallelism × GOMAXPROCS goroutines.
func (p *interleavedPath) round(b *testing.B, rdb *redis.Client, seq *atomic.Int64) {
	workers := benchParallelism * runtime.GOMAXPROCS(0)
	var next atomic.Int64
	lats := make([][]time.Duration, workers)
	start := readCPU(b, rdb)
	t0 := time.Now()
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			for next.Add(1) <= int64(p.ops) {
				t := time.Now()
				if err := p.op(w, seq.Add(1)); err != nil {
					return err
				}
				lats[w] = append(lats[w], time.Since(t))
			}
			return nil
		})
	}
	require.NoError(b, g.Wait())
	p.wall += time.Since(t0)
	end := readCPU(b, rdb)
	p.cpu.self += end.self - start.self
	p.cpu.redis += end.redis - start.redis
	p.done += p.ops
	for _, l := range lats {
		p.lat = append(p.lat, l...)
	}
}

// report reports the path's rate, latency and CPU per operation, and returns the rate.
func (p *interleavedPath) report(b *testing.B) float64 {
	if p.done == 0 {
		return 0
	}
	rate := float64(p.done) / p.wall.Seconds()
	b.ReportMetric(rate, p.name+"-ops/s")
	slices.Sort(p.lat)
	b.ReportMetric(float64(p.lat[int(0.99*float64(len(p.lat)-1))])/float64(time.Millisecond), p.name+"-p99-ms")
	b.ReportMetric(p.cpu.self*1e6/float64(p.done), p.name+"-go-cpu-us/op")
	b.ReportMetric(p.cpu.redis*1e6/float64(p.done), p.name+"-redis-cpu-us/op")
	return rate
}

// post sends the reservation template with id spliced in and wants status want.
func post(c *http.Client, url string, head, tail []byte, id string, want int) error {
	body := make([]byte, 0, len(head)+len(tail)+len(id)+2)
	body = append(body, head...)
	body = strconv.AppendQuote(body, id)
	body = append(body, tail...)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return send(c, req, want)
}

func get(c *http.Client, url string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	return send(c, req, http.StatusOK)
}

// send reads the whole answer, so that the connection is reused.
func send(c *http.Client, req *http.Request, want int) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %s, want %d", req.Method, req.URL.Path, resp.Status, want)
	}
	return err
}
