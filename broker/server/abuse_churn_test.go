package server_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const (
	churners        = 50   // members re-advertising as fast as they can
	churnMaxNodes   = 40   // each with 1 to 40 nodes
	heavyRenewers   = 4    // goroutines of the one member looping on heavy renewals
	heavyRenewalIDs = 5000 // ids per renewal (api.MaxRenewBatch)
	heavyIDLength   = 200  // bytes per id: a body of about 1 MB
)

// abuseCounts are what the abusers of churnAbuse did.
type abuseCounts struct {
	adsAllowed, adsRefused, adsFailed       atomic.Int64
	renewAllowed, renewRefused, renewFailed atomic.Int64
}

// churnAbuse are the two abusers of the advertisement and renewal rates,
// against the broker at url (prepareChurnAbuse; start runs them until stop):
//   - 50 members (churn-00..churn-49) each re-advertising in a loop with 1
//     to 40 nodes, their allocatable changing at every call (no call is a
//     heartbeat: each costs the index a full rewrite when allowed);
//   - one member (heavy) looping from 4 goroutines on renewals of 5,000 ids
//     of 200 bytes each (about 1 MB; valid in shape, none of them its own).
//
// A 429 (or an advertisement's 503 Busy) is counted and the loop goes on at
// once, as a hostile member would.
type churnAbuse struct {
	bk     *brokertest.Broker
	url    string
	loops  []abuseLoop
	counts abuseCounts
	paused atomic.Bool
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// abuseLoop is one abuser's loop: its calls, their bodies in turn.
type abuseLoop struct {
	cn, method, path         string
	bodies                   [][]byte
	allowed, refused, failed *atomic.Int64
}

// prepareChurnAbuse makes the abusers' calls and advertises each churner
// once: the honest members are measured on the same federation with and
// without the abuse (70 clusters, 1,000 nodes, not 20).
func prepareChurnAbuse(t testing.TB, bk *brokertest.Broker, url string) *churnAbuse {
	a := &churnAbuse{bk: bk, url: url}
	counts := &a.counts
	only := os.Getenv("RB_ABUSE_ONLY")
	for c := range churners {
		if only == "heavy" {
			break
		}
		cn := fmt.Sprintf("churn-%02d", c)
		nodes := 1 + c*(churnMaxNodes-1)/(churners-1)
		var bodies [][]byte
		for v := range 4 {
			// The allocatable and used cpu move together at every call: the
			// index is rewritten in full each time (the dearest advertisement),
			// while the free capacity the broker may have booked stays as it was.
			ad := api.Advertisement{ClusterName: cn, Endpoint: "https://" + cn + ".example:6443",
				Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.02"), Memory: brokertest.MustQ("0.004")}}
			used := 100 * (v + 1)
			for n := range nodes {
				ad.Resources.Nodes = append(ad.Resources.Nodes, api.NodeResources{Name: fmt.Sprintf("n%02d", n),
					Allocatable: brokertest.Quantities(fmt.Sprintf("%dm", 16000+used), "64Gi", ""), Allocated: brokertest.Quantities(fmt.Sprintf("%dm", used), "1Gi", "")})
			}
			total := brokertest.Quantities(fmt.Sprintf("%dm", (16000+used)*nodes), fmt.Sprintf("%dGi", 64*nodes), "")
			ad.Resources.Capacity, ad.Resources.Allocatable = total, total
			ad.Resources.Allocated = brokertest.Quantities(fmt.Sprintf("%dm", used*nodes), fmt.Sprintf("%dGi", nodes), "")
			data, err := json.Marshal(ad)
			require.NoError(t, err)
			bodies = append(bodies, data)
		}
		a.loops = append(a.loops, abuseLoop{cn, http.MethodPut, "/api/v2/clusters/" + cn + "/advertisement", bodies,
			&counts.adsAllowed, &counts.adsRefused, &counts.adsFailed})
		code, data := bk.Do(cn, http.MethodPut, "/api/v2/clusters/"+cn+"/advertisement", bodies[len(bodies)-1])
		require.Equal(t, http.StatusOK, code, "%s", data)
	}
	renewal := api.RenewRequest{}
	for i := range heavyRenewalIDs {
		renewal.IDs = append(renewal.IDs, fmt.Sprintf("%0*d", heavyIDLength, i))
	}
	heavy, err := json.Marshal(renewal)
	require.NoError(t, err)
	for range heavyRenewers {
		if only == "churn" {
			break
		}
		a.loops = append(a.loops, abuseLoop{"heavy", http.MethodPost, "/api/v2/renewals", [][]byte{heavy},
			&counts.renewAllowed, &counts.renewRefused, &counts.renewFailed})
	}
	return a
}

// start runs the abusers' loops.
func (a *churnAbuse) start() {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	for _, l := range a.loops {
		a.wg.Add(1)
		go a.loop(ctx, l)
	}
}

// pause holds the loops after their calls in flight; resume lets them go on.
func (a *churnAbuse) pause()  { a.paused.Store(true) }
func (a *churnAbuse) resume() { a.paused.Store(false) }

// stop ends the loops and waits for them.
func (a *churnAbuse) stop() {
	a.cancel()
	a.wg.Wait()
}

func (a *churnAbuse) loop(ctx context.Context, l abuseLoop) {
	defer a.wg.Done()
	hc := a.bk.Client(l.cn)
	for i := 0; ctx.Err() == nil; i++ {
		if a.paused.Load() {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, l.method, a.url+l.path, bytes.NewReader(l.bodies[i%len(l.bodies)]))
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				l.failed.Add(1)
			}
			continue
		}
		var answer api.Error
		_ = json.NewDecoder(resp.Body).Decode(&answer)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			l.allowed.Add(1)
		case resp.StatusCode == http.StatusTooManyRequests,
			resp.StatusCode == http.StatusServiceUnavailable && answer.Reason == api.ReasonBusy: // an advertisement shed
			l.refused.Add(1)
		default:
			l.failed.Add(1)
		}
	}
}

// honestReserves makes reservations of the honest requesters, each at rate
// calls a second (paced, as agents call), for d, and returns their
// latencies, sorted, and how many failed.
func honestReserves(t testing.TB, honest []*client.Client, rate float64, d time.Duration, seq *atomic.Int64) (lat []time.Duration, failed int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	interval := time.Duration(float64(time.Second) / rate)
	for _, c := range honest {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next := time.Now(); next.Before(end); next = next.Add(interval) {
				time.Sleep(time.Until(next))
				t0 := time.Now()
				_, err := c.Reserve(context.Background(), reservation(fmt.Sprintf("h-%d", seq.Add(1)), "100m", "128Mi"))
				took := time.Since(t0)
				mu.Lock()
				if err != nil {
					failed++
					t.Logf("honest reserve failed: %v", err)
				} else {
					lat = append(lat, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return lat, failed
}

func p99(lat []time.Duration) time.Duration { return lat[len(lat)*99/100] }

// TestAbuseChurnAndHeavyRenewals: 50 members churning advertisements and one
// member looping on heavy renewals, beside honest members, against an
// rb-broker process as deployed (default flags, no policy file: the
// members' default rates). The honest reserves' p99 stays within 2x of the
// same honest load alone on the same federation, measured in this run; the
// abusers get their rates and no more; nothing is lost or broken.
// To look into it: RB_ABUSE_ONLY=churn or heavy runs one abuser,
// RB_ABUSE_PPROF=127.0.0.1:6061 serves the broker's pprof,
// RB_ABUSE_SLOWLOG=<µs> sums Redis' commands slower than that, by script.
func TestAbuseChurnAndHeavyRenewals(t *testing.T) {
	bk := brokertest.Start(t, brokertest.Options{Store: store.Config{StaleThreshold: time.Hour}})
	for i := range 20 {
		bk.Advertise(fmt.Sprintf("p%02d", i), "64", "256Gi", "", fmt.Sprintf("0.0%d", 1+i%9), nil)
	}
	flags := []string{"--stale-threshold=1h"}
	if a := os.Getenv("RB_ABUSE_PPROF"); a != "" {
		flags = append(flags, "--pprof-bind-address="+a)
	}
	proc := bk.StartProcess(brokertest.BuildBroker(t, t.TempDir()), nil, flags...)
	var honest []*client.Client
	for _, cn := range []string{"rome", "milan", "lyon"} {
		c, err := client.New(proc.URL, bk.ClusterCertDir(cn), client.WithRetries(0, 0))
		require.NoError(t, err)
		t.Cleanup(c.CloseIdleConnections)
		honest = append(honest, c)
	}
	// The honest load alone and beside the abusers, in interleaved slices
	// (alone, abused, alone, ...): whatever else the machine runs meanwhile
	// weighs on both sides alike. Each slice starts after a settling time:
	// past the burst their rates refilled while paused when they resume (up
	// to 5 advertisements per churner, 250 in all), past their calls in
	// flight when they pause.
	const rate = 40.0 // per honest member: within its default reserve rate
	const rounds, slice, resumed, paused = 6, 2 * time.Second, 1500 * time.Millisecond, 500 * time.Millisecond
	abusers := prepareChurnAbuse(t, bk, proc.URL)
	var seq atomic.Int64
	honestReserves(t, honest, rate, time.Second, &seq) // warm connections and caches
	abusers.start()                                    // their bursts first, then their rates
	began := time.Now()
	t.Log("the abusers start")
	time.Sleep(3 * time.Second)
	abusers.pause()
	time.Sleep(paused)
	counts := &abusers.counts
	var alone, abused []time.Duration
	var aloneCPU, abusedCPU cpuShares
	measure := func(into *[]time.Duration, cpu *cpuShares) {
		before := readCPUs(t, bk, proc)
		lat, failed := honestReserves(t, honest, rate, slice, &seq)
		cpu.add(before, readCPUs(t, bk, proc))
		require.Zero(t, failed)
		*into = append(*into, lat...)
	}
	if us := os.Getenv("RB_ABUSE_SLOWLOG"); us != "" {
		logSlowScripts(t, bk, us)
	}
	for range rounds {
		measure(&alone, &aloneCPU)
		abusers.resume()
		time.Sleep(resumed)
		measure(&abused, &abusedCPU)
		abusers.pause()
		time.Sleep(paused)
	}
	abusers.stop()
	abuse := time.Since(began).Seconds() // their rates refill paused or not
	slices.Sort(alone)
	slices.Sort(abused)

	t.Logf("honest reserve p99: alone %s (%d calls), beside the abusers %s (%d calls): %.2fx; p50 %s and %s",
		p99(alone), len(alone), p99(abused), len(abused), float64(p99(abused))/float64(p99(alone)), alone[len(alone)/2], abused[len(abused)/2])
	q := func(l []time.Duration) string {
		return fmt.Sprintf("p90 %s p95 %s p98 %s p99 %s p99.5 %s max %s", l[len(l)*90/100], l[len(l)*95/100], l[len(l)*98/100], l[len(l)*99/100], l[len(l)*995/1000], l[len(l)-1])
	}
	t.Logf("alone: %s", q(alone))
	t.Logf("abused: %s", q(abused))
	t.Logf("CPU used, alone: %s; beside the abusers: %s", aloneCPU, abusedCPU)
	t.Logf("in %.1fs, churners: %d advertisements stored, %d refused, %d failed; heavy: %d renewals, %d refused, %d failed",
		abuse, counts.adsAllowed.Load(), counts.adsRefused.Load(), counts.adsFailed.Load(),
		counts.renewAllowed.Load(), counts.renewRefused.Load(), counts.renewFailed.Load())
	// Alone on the machine (make test runs it after the other packages) the
	// ratio measures 1.2-1.6x; beside a CPU burner, 2.2-3x: the abusers'
	// clients share the 2 cores with the broker and Redis.
	assert.LessOrEqual(t, p99(abused), 2*p99(alone), "honest reserve p99 within 2x of the same load alone")
	assert.Zero(t, counts.adsFailed.Load()+counts.renewFailed.Load(), "abusers are refused (429, or 503 Busy), not failed")
	assert.Positive(t, counts.adsRefused.Load())
	assert.Positive(t, counts.renewRefused.Load())
	// Their rates and no more (policy.DefaultMemberRates): a burst, then the
	// rate, for advertisements per member and for the renewer's ids.
	ads, ids := policy.DefaultMemberRates.Advertisements, policy.DefaultMemberRates.RenewedIDs
	assert.LessOrEqual(t, float64(counts.adsAllowed.Load()), churners*(float64(ads.Burst)+ads.PerSecond*abuse))
	assert.LessOrEqual(t, float64(counts.renewAllowed.Load()*heavyRenewalIDs), float64(ids.Burst)+ids.PerSecond*abuse)
	require.NoError(t, bk.Store.CheckInvariant(context.Background()))
}

// logSlowScripts has Redis log its commands slower than us microseconds
// from now on and, when the test ends, logs their count and time by script
// (named by its first argument: a cluster id for advertise, a number for
// reserve's stale threshold, a requester for renew).
func logSlowScripts(t *testing.T, bk *brokertest.Broker, us string) {
	ctx := context.Background()
	require.NoError(t, bk.RDB.ConfigSet(ctx, "slowlog-log-slower-than", us).Err())
	require.NoError(t, bk.RDB.ConfigSet(ctx, "slowlog-max-len", "200000").Err())
	require.NoError(t, bk.RDB.SlowLogReset(ctx).Err())
	t.Cleanup(func() {
		logs, err := bk.RDB.SlowLogGet(ctx, 200000).Result()
		require.NoError(t, err)
		count, took := map[string]int{}, map[string]time.Duration{}
		for _, l := range logs {
			k := strings.ToLower(l.Args[0])
			if k == "evalsha" && len(l.Args) > 4 {
				k = l.Args[4][:min(len(l.Args[4]), 6)]
			}
			count[k]++
			took[k] += l.Duration
		}
		for _, k := range slices.SortedFunc(maps.Keys(count), func(a, b string) int { return cmp.Compare(took[b], took[a]) }) {
			n := count[k]
			t.Logf("slowlog %-8s %6d calls, %10s in all, %8s each", k, n, took[k], took[k]/time.Duration(n))
		}
	})
}

// cpuReading is the CPU time used so far by Redis and this test process
// (its clients: the honest members and the abusers; readCPU) and by the
// broker process, at a time.
type cpuReading struct {
	at     time.Time
	cpu    cpuTimes
	broker time.Duration
}

func readCPUs(t *testing.T, bk *brokertest.Broker, proc *brokertest.Process) cpuReading {
	broker, err := proc.CPU()
	require.NoError(t, err)
	return cpuReading{at: time.Now(), cpu: readCPU(t, bk.RDB), broker: broker}
}

// cpuShares sums the CPU used between readings, as shares of one core.
type cpuShares struct{ wall, redis, broker, test float64 }

func (c *cpuShares) add(from, to cpuReading) {
	c.wall += to.at.Sub(from.at).Seconds()
	c.redis += to.cpu.redis - from.cpu.redis
	c.broker += (to.broker - from.broker).Seconds()
	c.test += to.cpu.self - from.cpu.self
}

func (c cpuShares) String() string {
	return fmt.Sprintf("redis %.0f%%, broker %.0f%%, test process %.0f%% of a core",
		100*c.redis/c.wall, 100*c.broker/c.wall, 100*c.test/c.wall)
}
