package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
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

// abuseCounts are what the abusers of startChurnAbuse did.
type abuseCounts struct {
	adsAllowed, adsRefused, adsFailed       atomic.Int64
	renewAllowed, renewRefused, renewFailed atomic.Int64
}

// startChurnAbuse runs, against the broker at url until the returned stop is
// called, the two abusers of the advertisement and renewal rates:
//   - 50 members (churn-00..churn-49) each re-advertising in a loop with 1
//     to 40 nodes, the figures changing at every call (no call is a
//     heartbeat: each costs the index a rewrite when allowed);
//   - one member (heavy) looping from 4 goroutines on renewals of 5,000 ids
//     of 200 bytes each (about 1 MB; valid in shape, none of them its own).
//
// A 429 is counted and the loop goes on at once, as a hostile member would.
func startChurnAbuse(t testing.TB, bk *brokertest.Broker, url string) (stop func(), counts *abuseCounts) {
	ctx, cancel := context.WithCancel(context.Background())
	counts = &abuseCounts{}
	var wg sync.WaitGroup
	loop := func(cn, method, path string, bodies [][]byte, allowed, refused, failed *atomic.Int64) {
		defer wg.Done()
		hc := bk.Client(cn)
		for i := 0; ctx.Err() == nil; i++ {
			req, _ := http.NewRequestWithContext(ctx, method, url+path, bytes.NewReader(bodies[i%len(bodies)]))
			resp, err := hc.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
				}
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				allowed.Add(1)
			case http.StatusTooManyRequests:
				refused.Add(1)
			default:
				failed.Add(1)
			}
		}
	}
	for c := range churners {
		cn := fmt.Sprintf("churn-%02d", c)
		nodes := 1 + c*(churnMaxNodes-1)/(churners-1)
		var bodies [][]byte
		for v := range 4 { // the used cpu moves at every call
			ad := api.Advertisement{ClusterName: cn, Endpoint: "https://" + cn + ".example:6443",
				Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.02"), Memory: brokertest.MustQ("0.004")}}
			for n := range nodes {
				ad.Resources.Nodes = append(ad.Resources.Nodes, api.NodeResources{Name: fmt.Sprintf("n%02d", n),
					Allocatable: brokertest.Quantities("16", "64Gi", ""), Allocated: brokertest.Quantities(fmt.Sprintf("%dm", 100*(v+1)), "1Gi", "")})
			}
			total := brokertest.Quantities(fmt.Sprint(16*nodes), fmt.Sprintf("%dGi", 64*nodes), "")
			ad.Resources.Capacity, ad.Resources.Allocatable = total, total
			ad.Resources.Allocated = brokertest.Quantities(fmt.Sprintf("%dm", 100*(v+1)*nodes), fmt.Sprintf("%dGi", nodes), "")
			data, err := json.Marshal(ad)
			require.NoError(t, err)
			bodies = append(bodies, data)
		}
		wg.Add(1)
		go loop(cn, http.MethodPut, "/api/v2/clusters/"+cn+"/advertisement", bodies, &counts.adsAllowed, &counts.adsRefused, &counts.adsFailed)
	}
	renewal := api.RenewRequest{}
	for i := range heavyRenewalIDs {
		renewal.IDs = append(renewal.IDs, fmt.Sprintf("%0*d", heavyIDLength, i))
	}
	heavy, err := json.Marshal(renewal)
	require.NoError(t, err)
	for range heavyRenewers {
		wg.Add(1)
		go loop("heavy", http.MethodPost, "/api/v2/renewals", [][]byte{heavy}, &counts.renewAllowed, &counts.renewRefused, &counts.renewFailed)
	}
	return func() { cancel(); wg.Wait() }, counts
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
// same honest load alone, measured in this run; the abusers get their
// rates and no more; nothing is lost or broken.
func TestAbuseChurnAndHeavyRenewals(t *testing.T) {
	bk := brokertest.Start(t, brokertest.Options{Store: store.Config{StaleThreshold: time.Hour}})
	for i := range 20 {
		bk.Advertise(fmt.Sprintf("p%02d", i), "64", "256Gi", "", fmt.Sprintf("0.0%d", 1+i%9), nil)
	}
	proc := bk.StartProcess(brokertest.BuildBroker(t, t.TempDir()), nil, "--stale-threshold=1h")
	var honest []*client.Client
	for _, cn := range []string{"rome", "milan", "lyon"} {
		c, err := client.New(proc.URL, bk.ClusterCertDir(cn), client.WithRetries(0, 0))
		require.NoError(t, err)
		t.Cleanup(c.CloseIdleConnections)
		honest = append(honest, c)
	}
	const rate, phase = 40.0, 8 * time.Second // per honest member: within its default reserve rate
	var seq atomic.Int64
	honestReserves(t, honest, rate, time.Second, &seq) // warm connections and caches
	alone, failed := honestReserves(t, honest, rate, phase, &seq)
	require.Zero(t, failed)

	stop, counts := startChurnAbuse(t, bk, proc.URL)
	began := time.Now()
	time.Sleep(3 * time.Second) // past the abusers' bursts
	abused, failed := honestReserves(t, honest, rate, phase, &seq)
	stop()
	abuse := time.Since(began).Seconds()
	require.Zero(t, failed)

	t.Logf("honest reserve p99: alone %s (%d calls), beside the abusers %s (%d calls): %.2fx; p50 %s and %s",
		p99(alone), len(alone), p99(abused), len(abused), float64(p99(abused))/float64(p99(alone)), alone[len(alone)/2], abused[len(abused)/2])
	t.Logf("in %.1fs, churners: %d advertisements stored, %d refused, %d failed; heavy: %d renewals, %d refused, %d failed",
		abuse, counts.adsAllowed.Load(), counts.adsRefused.Load(), counts.adsFailed.Load(),
		counts.renewAllowed.Load(), counts.renewRefused.Load(), counts.renewFailed.Load())
	assert.LessOrEqual(t, p99(abused), 2*p99(alone), "honest reserve p99 within 2x of the same load alone")
	assert.Zero(t, counts.adsFailed.Load()+counts.renewFailed.Load(), "abusers are refused (429), not failed")
	assert.Positive(t, counts.adsRefused.Load())
	assert.Positive(t, counts.renewRefused.Load())
	// Their rates and no more (policy.DefaultMemberRates): a burst, then the
	// rate, for advertisements per member and for the renewer's ids.
	ads, ids := policy.DefaultMemberRates.Advertisements, policy.DefaultMemberRates.RenewedIDs
	assert.LessOrEqual(t, float64(counts.adsAllowed.Load()), churners*(float64(ads.Burst)+ads.PerSecond*abuse))
	assert.LessOrEqual(t, float64(counts.renewAllowed.Load()*heavyRenewalIDs), float64(ids.Burst)+ids.PerSecond*abuse)
	require.NoError(t, bk.Store.CheckInvariant(context.Background()))
}
