package server_test

// BenchmarkEventLatency measures how long a reservation's notification takes
// to reach the agents: from the moment the decision is back in the broker
// (Store.Reserve returned) to the moment the event comes out of
// broker/client's EventStream.Next at the requester and at the provider, over
// real mutual-TLS server-sent events from a real broker on a real
// redis-server. Its baseline, in the same run on the same redis-server, is
// the bare Redis notification: XADD returned -> a blocked XREAD returned. It
// runs only with -bench; see docs/benchmarks.md.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const (
	eventProviders  = 10
	eventRequesters = 4
	eventWait       = 10 * time.Second // how long an event may take before the benchmark fails
)

// arrivals records, per reservation id, when Reserve returned (t0) and when
// each of its events came out of a stream.
type arrivals struct {
	mu     sync.Mutex
	t0     map[string]time.Time
	seen   map[string][]time.Time
	notify chan struct{} // a token after every arrival
}

func newArrivals() *arrivals {
	return &arrivals{t0: map[string]time.Time{}, seen: map[string][]time.Time{}, notify: make(chan struct{}, 1)}
}

func (a *arrivals) decided(id string, at time.Time) {
	a.mu.Lock()
	a.t0[id] = at
	a.mu.Unlock()
}

func (a *arrivals) arrived(id string, at time.Time) {
	a.mu.Lock()
	a.seen[id] = append(a.seen[id], at)
	a.mu.Unlock()
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// wait returns once every decided id has want arrivals, or fails b.
func (a *arrivals) wait(b *testing.B, want int) {
	deadline := time.NewTimer(eventWait)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		missing := ""
		for id := range a.t0 {
			if len(a.seen[id]) < want {
				missing = id
				break
			}
		}
		a.mu.Unlock()
		if missing == "" {
			return
		}
		select {
		case <-a.notify:
		case <-deadline.C:
			b.Fatalf("reservation %s: fewer than %d events after %s", missing, want, eventWait)
		}
	}
}

// report computes arrival - t0 for every event of every decided id (0 when
// the event beat Reserve's return) and reports the percentiles.
func (a *arrivals) report(b *testing.B) (p50, p99 float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var all []time.Duration
	early := 0
	for id, t0 := range a.t0 {
		for _, at := range a.seen[id] {
			d := at.Sub(t0)
			if d < 0 {
				d, early = 0, early+1
			}
			all = append(all, d)
		}
	}
	if len(all) == 0 {
		return 0, 0
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond)
	}
	p50, p99 = pct(0.50), pct(0.99)
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(p99, "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
	b.ReportMetric(float64(len(all)), "events")
	b.ReportMetric(100*float64(early)/float64(len(all)), "early-%")
	return p50, p99
}

func (a *arrivals) reset() {
	a.mu.Lock()
	a.t0, a.seen = map[string]time.Time{}, map[string][]time.Time{}
	a.mu.Unlock()
}

// follow reads an event stream until ctx ends, recording every Reserved event.
func follow(ctx context.Context, s *client.EventStream, a *arrivals, errs chan<- error) {
	defer s.Close()
	for {
		_, e, err := s.Next()
		at := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				errs <- err
			}
			return
		}
		if e.Type == "Reserved" {
			a.arrived(e.Reservation, at)
		}
	}
}

func BenchmarkEventLatency(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bk := brokertest.Start(b, brokertest.Options{
		Store:          store.Config{StaleThreshold: time.Hour},
		ExpiryInterval: time.Second,     // rb-broker's default
		EventKeepAlive: 5 * time.Second, // rb-broker's default
	})
	rng := rand.New(rand.NewPCG(eventProviders, 7))
	providers := make([]string, eventProviders)
	for i := range providers {
		providers[i] = fmt.Sprintf("p%03d", i)
		_, err := bk.Store.Advertise(ctx, providers[i], benchProvider(rng, providers[i]))
		require.NoError(b, err)
	}
	requesters := make([]string, eventRequesters)
	for i := range requesters {
		requesters[i] = fmt.Sprintf("requester-%d", i)
	}

	// Every cluster follows its stream through broker/client, as the agents do.
	var seen = newArrivals()
	streamErrs := make(chan error, len(providers)+len(requesters))
	certDirs := map[string]string{}
	for _, id := range append(slices.Clone(providers), requesters...) {
		certDirs[id] = bk.ClusterCertDir(id)
		c, err := client.New(bk.URL, certDirs[id])
		require.NoError(b, err)
		s, err := c.OpenEvents(ctx, "")
		require.NoError(b, err)
		go follow(ctx, s, seen, streamErrs)
	}
	checkStreams := func() {
		select {
		case err := <-streamErrs:
			b.Fatalf("event stream: %v", err)
		default:
		}
	}

	// load runs measure while another process (this test binary again, see
	// TestEventLoadHelper) reserves through the HTTP API from 16 goroutines
	// (broker/client, as the agents do) for the other requesters, whose
	// events flow through the same provider streams and the same Redis. The
	// load lives in a process of its own, as the agents are other machines:
	// it shares the cores, not the broker's Go scheduler. load reports its
	// rate, counted in Redis (reservations: how many measure made itself).
	var loadRuns atomic.Int64
	load := func(b *testing.B, reservations int64, measure func()) {
		spec := loadSpec{URL: bk.URL, Run: loadRuns.Add(1), Workers: 16}
		for _, id := range requesters[1:] {
			spec.CertDirs = append(spec.CertDirs, certDirs[id])
		}
		stop := startLoad(b, spec)
		calls0, _ := evalshaStats(b, bk.RDB)
		b.ResetTimer()
		measure()
		b.StopTimer()
		calls1, _ := evalshaStats(b, bk.RDB)
		stop()
		b.ReportMetric(float64(calls1-calls0-reservations)/b.Elapsed().Seconds(), "load-reservations/s")
	}

	// The bare Redis path: one client blocks in XREAD on a stream, another
	// appends the fields of a Reserved event.
	xread := func(b *testing.B, loaded bool) (p50, p99 float64) {
		reader, writer := bk.Redis.Client(), bk.Redis.Client()
		key := bk.Store.Key("bench:xread:", b.Name(), strconv.Itoa(b.N)) // a key the broker's user may use
		got := newArrivals()
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			cursor := "0-0"
			for rctx.Err() == nil {
				streams, err := reader.XRead(rctx, &redis.XReadArgs{Streams: []string{key, cursor}, Count: 256, Block: 5 * time.Second}).Result()
				at := time.Now()
				if errors.Is(err, redis.Nil) {
					continue
				}
				if err != nil {
					if rctx.Err() != nil {
						break
					}
					done <- err
					return
				}
				for _, m := range streams[0].Messages {
					if id, ok := m.Values["reservation"].(string); ok {
						got.arrived(id, at)
					}
					cursor = m.ID
				}
			}
			done <- nil
		}()
		measure := func() {
			for i := range b.N {
				id := "x" + strconv.Itoa(i)
				require.NoError(b, writer.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: 10000, Approx: true, Values: []any{
					"type", "Reserved", "reservation", id, "requester", "requester-0", "provider", "p000", "phase", "Reserved",
					"cpu", "500", "mem", "1073741824", "gpu", "0", "sto", "0", "expires_ms", "1700000000000",
				}}).Err())
				got.decided(id, time.Now())
				got.wait(b, 1)
			}
		}
		if loaded {
			load(b, 0, measure)
		} else {
			b.ResetTimer()
			measure()
			b.StopTimer()
		}
		rcancel()
		// An entry without a reservation wakes the blocked XREAD at once.
		require.NoError(b, writer.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"type", "stop"}}).Err())
		require.NoError(b, <-done)
		require.NoError(b, writer.Del(ctx, key).Err())
		return got.report(b)
	}
	var baseP50, baseP99, loadedP50, loadedP99 float64
	b.Run("baseline-redis-xadd-xread", func(b *testing.B) { baseP50, baseP99 = xread(b, false) })

	var seq int
	reserve := func(b *testing.B, requester string) string {
		seq++
		id := "e" + strconv.Itoa(seq)
		req, err := reservation(id, "500m", "1Gi").ToStore(requester, api.Limits{DefaultDuration: time.Hour})
		require.NoError(b, err)
		_, err = bk.Store.Reserve(ctx, req)
		require.NoError(b, err)
		seen.decided(id, time.Now())
		return id
	}
	b.Run("sse-mtls", func(b *testing.B) {
		// One reservation at a time: the latency of the path, without queueing.
		seen.reset()
		b.ResetTimer()
		for i := range b.N {
			reserve(b, requesters[i%len(requesters)])
			seen.wait(b, 2) // the requester's and the provider's
			checkStreams()
		}
		b.StopTimer()
		p50, p99 := seen.report(b)
		b.ReportMetric(p50-baseP50, "added-p50-ms")
		b.ReportMetric(p99-baseP99, "added-p99-ms")
	})
	b.Run("baseline-redis-xadd-xread-loaded", func(b *testing.B) { loadedP50, loadedP99 = xread(b, true) })
	b.Run("sse-mtls-loaded", func(b *testing.B) {
		// The same measurement while the broker is saturated (see load).
		seen.reset()
		load(b, int64(b.N), func() {
			for range b.N {
				reserve(b, requesters[0])
				seen.wait(b, 2)
				checkStreams()
			}
		})
		p50, p99 := seen.report(b)
		b.ReportMetric(p50-loadedP50, "added-p50-ms")
		b.ReportMetric(p99-loadedP99, "added-p99-ms")
	})
}

// loadSpec tells TestEventLoadHelper what to do.
type loadSpec struct {
	URL      string
	CertDirs []string // one client per requester
	Run      int64    // makes the reservation ids unique
	Workers  int
}

const loadEnv = "RB_EVENT_LOAD"

// startLoad runs TestEventLoadHelper in a new process and returns once it is
// reserving; stop ends it.
func startLoad(b *testing.B, spec loadSpec) (stop func()) {
	data, err := json.Marshal(spec)
	require.NoError(b, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEventLoadHelper$", "-test.count=1", "-test.timeout=1h")
	cmd.Env = append(os.Environ(), loadEnv+"="+string(data))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	exited := false
	b.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	require.NoError(b, err, "load generator: %s", line)
	require.Equal(b, "ready\n", line)
	return func() {
		stdin.Close() // the helper stops when its stdin closes
		rest, _ := io.ReadAll(out)
		err := cmd.Wait()
		exited = true
		require.NoError(b, err, "load generator: %s", rest)
	}
}

// TestEventLoadHelper is not a test: it is BenchmarkEventLatency's load
// generator, run in a process of its own (see startLoad). It says "ready" once
// every worker has made its first reservation (its connection is up), then
// reserves as fast as it can until its stdin closes, lets the calls in flight
// finish and exits.
func TestEventLoadHelper(t *testing.T) {
	env := os.Getenv(loadEnv)
	if env == "" {
		t.Skip("the load generator of BenchmarkEventLatency, run by it")
	}
	var spec loadSpec
	require.NoError(t, json.Unmarshal([]byte(env), &spec))
	var stopping atomic.Bool
	clients := make([]*client.Client, len(spec.CertDirs))
	for i, dir := range spec.CertDirs {
		c, err := client.New(spec.URL, dir, client.WithRetries(0, 0))
		require.NoError(t, err)
		clients[i] = c
	}
	var warm, wg sync.WaitGroup
	errs := make(chan error, spec.Workers)
	for g := range spec.Workers {
		warm.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[g%len(clients)]
			for n := 0; n == 0 || !stopping.Load(); n++ {
				_, err := c.Reserve(context.Background(), reservation(fmt.Sprintf("load-%d-%d-%d", spec.Run, g, n), "500m", "1Gi"))
				if err != nil {
					errs <- err
					if n == 0 {
						warm.Done()
					}
					return
				}
				if n == 0 {
					warm.Done()
				}
			}
		}()
	}
	warm.Wait()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	stopping.Store(true)
	wg.Wait()
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
