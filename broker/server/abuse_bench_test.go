package server_test

// BenchmarkAbuseCombined is the bounded abuse run: every abuse at once
// against one rb-broker process as deployed (its own process and defaults,
// the operator's policy file, the cap of 8 streams per cluster), on a real
// redis-server with mutual TLS:
//   - bulk holds 60,000 live reservations and lists them all, 8 full
//     listings in parallel, over and over;
//   - greedy opens 1,000 event streams;
//   - mallory is at its limits and keeps calling reserve from 4 goroutines;
//   - 50 members (churn-*) re-advertise in a loop, 1 to 40 nodes each, and
//     heavy loops on renewals of 5,000 ids of 200 bytes (churnAbuse);
//   - rome and milan, the honest members, reserve.
//
// quiet: the honest members alone, on the same state (the baseline, in the
// same run); abuse: the same while all of the above runs;
// abuse-member-rates-off: the same against a second rb-broker process whose
// policy turns the members' rates off (advertisements, renewals: what those
// rates are worth); abuse-unbounded-lists: against a third without the
// bound on list pages (--max-lists-per-cluster), what that bound is worth.
// One op is one honest reservation. Reported: the honest members' p50/p99
// and refusals, mallory's calls and refusals, greedy's streams open and
// refused, the listings done, the churners' advertisements stored and
// refused, heavy's renewals done and refused, the broker's peak RSS (VmHWM,
// its manifest's limit is 256 MiB), and after the run the honest
// reservations not found (lost) and the orphan keys (see orphanKeys). It
// runs only with -bench; see docs/benchmarks.md.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const (
	combinedLive    = 60_000
	combinedListers = 8
	combinedStreams = 1000
	combinedGreedy  = 4 // mallory's goroutines
	combinedPolicy  = `apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters:
  clusters:
    mallory: {maxReservations: 20, maxResources: {cpu: "2"}, reservesPerSecond: 50, reserveBurst: 50}
`
	// combinedRatesOff is combinedPolicy with the members' rates off.
	combinedRatesOff = combinedPolicy + `members:
  default:
    advertisements: {perSecond: "0"}
    renewals: {perSecond: "0"}
    renewedIDs: {perSecond: "0"}
    renewalBytes: {perSecond: "0"}
    writes: {perSecond: "0"}
    protections: {perSecond: "0"}
`
)

func BenchmarkAbuseCombined(b *testing.B) {
	ctx := context.Background()
	bk := brokertest.Start(b, brokertest.Options{Store: store.Config{StaleThreshold: time.Hour}})
	for i := range 20 {
		bk.Advertise(fmt.Sprintf("p%02d", i), "64", "256Gi", "", fmt.Sprintf("0.0%d", 1+i%9), nil)
	}
	fillLive(b, bk.Store, "bulk", combinedLive)
	policyFile := filepath.Join(b.TempDir(), "policy.yaml")
	require.NoError(b, os.WriteFile(policyFile, []byte(combinedPolicy), 0o600))
	ratesOffFile := filepath.Join(b.TempDir(), "rates-off.yaml")
	require.NoError(b, os.WriteFile(ratesOffFile, []byte(combinedRatesOff), 0o600))
	bin := brokertest.BuildBroker(b, b.TempDir())
	// A replica as deployed, one with the members' rates off and one without
	// the bound on list pages (what each is worth, in the same run).
	deployed := connect(b, bk, bk.StartProcess(bin, nil, "--stale-threshold=1h", "--policy-file="+policyFile))
	ratesOff := connect(b, bk, bk.StartProcess(bin, nil, "--stale-threshold=1h", "--policy-file="+ratesOffFile))
	unbounded := connect(b, bk, bk.StartProcess(bin, nil, "--stale-threshold=1h", "--policy-file="+policyFile, "--max-lists-per-cluster=1000000"))
	for i := range 20 { // mallory at its limit of live reservations
		_, err := deployed.mallory.Reserve(ctx, reservation(fmt.Sprintf("m-%d", i), "100m", "128Mi"))
		require.NoError(b, err)
	}
	var seq atomic.Int64
	// measure makes n honest reservations on r, the members at once, and
	// returns their latencies and how many were refused.
	measure := func(r replica, n int) (lat []time.Duration, refused int64) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range r.honest {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range (n + 1) / 2 {
					t0 := time.Now()
					_, err := c.Reserve(ctx, reservation(fmt.Sprintf("h-%d", seq.Add(1)), "100m", "128Mi"))
					d := time.Since(t0)
					mu.Lock()
					if err != nil {
						refused++
					} else {
						lat = append(lat, d)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		slices.Sort(lat)
		return lat, refused
	}
	report := func(b *testing.B, lat []time.Duration, refused int64) {
		if len(lat) == 0 {
			b.Fatal("no honest reservation was placed")
		}
		b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Millisecond), "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100])/float64(time.Millisecond), "p99-ms")
		b.ReportMetric(float64(refused), "honest-refused")
	}

	b.Run("quiet", func(b *testing.B) {
		lat, refused := measure(deployed, b.N)
		report(b, lat, refused)
	})
	abuse := func(b *testing.B, r replica) {
		abuseCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var pages, listings, list429, listErrors, malloryCalls, malloryPlaced, mallory429 atomic.Int64
		for range combinedListers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				listAll(abuseCtx, bk.Client("bulk"), r.proc.URL, &pages, &listings, &list429, &listErrors)
			}()
		}
		for range combinedGreedy {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for abuseCtx.Err() == nil {
					_, err := r.mallory.Reserve(abuseCtx, reservation(fmt.Sprintf("g-%d", seq.Add(1)), "100m", "128Mi"))
					malloryCalls.Add(1)
					if _, over := client.OverLimit(err); over {
						mallory429.Add(1)
					} else if err == nil {
						malloryPlaced.Add(1)
					}
				}
			}()
		}
		open, refusedStreams := tryStreams(b, abuseCtx, bk, r.proc.URL, "greedy", combinedStreams)
		churn := prepareChurnAbuse(b, bk, r.proc.URL)
		churn.start()
		b.ResetTimer()
		t0 := time.Now()
		lat, refused := measure(r, b.N)
		took := time.Since(t0)
		b.StopTimer()
		stop()
		churn.stop()
		wg.Wait()
		report(b, lat, refused)
		b.ReportMetric(float64(malloryCalls.Load()), "mallory-calls")
		b.ReportMetric(float64(mallory429.Load()), "mallory-429")
		b.ReportMetric(float64(malloryPlaced.Load()), "mallory-placed")
		b.ReportMetric(float64(open), "greedy-streams-open")
		b.ReportMetric(float64(refusedStreams), "greedy-streams-429")
		b.ReportMetric(float64(pages.Load())/took.Seconds(), "bulk-pages/s")
		b.ReportMetric(float64(listings.Load()), "bulk-full-listings")
		b.ReportMetric(float64(list429.Load()), "bulk-list-429")
		b.ReportMetric(float64(listErrors.Load()), "bulk-list-errors")
		c := &churn.counts
		b.ReportMetric(float64(c.adsAllowed.Load())/took.Seconds(), "churn-ads/s")
		b.ReportMetric(float64(c.adsRefused.Load()), "churn-ads-429")
		b.ReportMetric(float64(c.adsFailed.Load()), "churn-ads-errors")
		b.ReportMetric(float64(c.renewAllowed.Load()), "heavy-renewals")
		b.ReportMetric(float64(c.renewRefused.Load()), "heavy-renewals-429")
		b.ReportMetric(float64(c.renewFailed.Load()), "heavy-renewal-errors")
		b.ReportMetric(float64(procStatusKiB(b, r.proc.Pid, "VmHWM"))/1024, "broker-peak-rss-MiB")
	}
	b.Run("abuse", func(b *testing.B) { abuse(b, deployed) })
	b.Run("abuse-member-rates-off", func(b *testing.B) { abuse(b, ratesOff) })
	b.Run("abuse-unbounded-lists", func(b *testing.B) { abuse(b, unbounded) })

	// Nothing lost: every honest reservation placed is live at the broker.
	placed := int64(0)
	for cn := range deployed.honest {
		n, err := bk.RDB.SCard(ctx, bk.Store.Key("by-requester:"+cn)).Result()
		require.NoError(b, err)
		placed += n
	}
	require.NoError(b, bk.Store.CheckInvariant(ctx))
	orphans := orphanKeys(b, bk.RDB, bk.Store)
	b.Logf("after the run: %d honest reservations live, %d orphan keys %v", placed, len(orphans), orphans[:min(len(orphans), 5)])
	if len(orphans) > 0 {
		b.Errorf("orphan keys: %v", orphans[:min(len(orphans), 20)])
	}
}

// replica is one rb-broker process and the clients of the members that call it.
type replica struct {
	proc    *brokertest.Process
	honest  map[string]*client.Client
	mallory *client.Client
}

func connect(b *testing.B, bk *brokertest.Broker, proc *brokertest.Process) replica {
	clientOf := func(cn string) *client.Client {
		c, err := client.New(proc.URL, bk.ClusterCertDir(cn), client.WithRetries(0, 0))
		require.NoError(b, err)
		b.Cleanup(c.CloseIdleConnections)
		return c
	}
	return replica{proc: proc, honest: map[string]*client.Client{"rome": clientOf("rome"), "milan": clientOf("milan")}, mallory: clientOf("mallory")}
}

// listAll lists every reservation of hc's cluster as requester, page after
// page (as broker/client does, without its retries), over and over until
// ctx ends, counting the pages, the full listings (each must hold
// combinedLive), the 429s (then it waits the Retry-After's second) and
// other errors.
func listAll(ctx context.Context, hc *http.Client, url string, pages, listings, refused, failed *atomic.Int64) {
	cont, n := "", 0
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v2/reservations?role=requester&continue="+cont, nil)
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				failed.Add(1)
			}
			return
		}
		var page api.ReservationList
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			refused.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		case ctx.Err() != nil: // stopped while reading
			return
		case resp.StatusCode != http.StatusOK || err != nil:
			failed.Add(1)
			return
		}
		pages.Add(1)
		n += len(page.Items)
		if cont = page.Continue; cont == "" {
			if n != combinedLive {
				failed.Add(1)
			}
			listings.Add(1)
			n = 0
		}
	}
}

// fillLive makes n live reservations of requester through the store (the
// real scripts: usage, expiry, by-* sets all kept), 32 calls in flight.
func fillLive(b *testing.B, s *store.Store, requester string, n int) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				_, err := s.Reserve(ctx, model.ReserveRequest{ID: fmt.Sprintf("bulk-%d", i), Requester: requester,
					Duration: time.Hour, Resources: model.Resources{CPU: 1, Memory: 1 << 20}})
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// tryStreams opens n event streams of cn on the broker at url and keeps
// them open until ctx ends; it returns how many opened and how many were
// refused with 429.
func tryStreams(b *testing.B, ctx context.Context, bk *brokertest.Broker, url, cn string, n int) (open, refused int) {
	tr := bk.Client(cn).Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = n
	b.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v2/events", nil)
			resp, err := hc.Do(req)
			if err != nil {
				return
			}
			mu.Lock()
			switch resp.StatusCode {
			case http.StatusOK:
				open++
			case http.StatusTooManyRequests:
				refused++
			}
			mu.Unlock()
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				return
			}
			go func() { // held open, read until ctx ends
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
			}()
		}()
	}
	wg.Wait()
	return open, refused
}

// orphanKeys lists the broker's keys that nothing owns: each key is either
// the federation's (a cluster, its nodes, the candidate index, the
// structures every operation keeps: expiry, usage, the expiry clock, waiting, audit, by-*,
// ended-requesters), a live reservation (in the expiry index), or has a
// lifetime of its own (PTTL: an ended reservation, a requester's set of
// them, a waiting request, an event stream, a rate state, the readiness
// probe's key). Anything else would stay for ever.
func orphanKeys(b *testing.B, admin *redis.Client, s *store.Store) []string {
	ctx := context.Background()
	var orphans []string
	iter := admin.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		name, ours := strings.CutPrefix(k, s.Key())
		if !ours {
			orphans = append(orphans, k)
			continue
		}
		family, _, _ := strings.Cut(name, ":")
		switch family {
		case "cluster", "clusters", "nodes", "node-resv", "node-listed", "idx", "expiry", "usage", "clock",
			"waiting", "wait-due", "audit", "by-target", "by-requester", "ended-requesters":
			continue
		case "resv":
			if _, err := admin.ZScore(ctx, s.Key("expiry"), strings.TrimPrefix(name, "resv:")).Result(); err == nil {
				continue // live
			}
		}
		ttl, err := admin.PTTL(ctx, k).Result()
		require.NoError(b, err)
		if ttl <= 0 {
			orphans = append(orphans, k)
		}
	}
	require.NoError(b, iter.Err())
	return orphans
}
