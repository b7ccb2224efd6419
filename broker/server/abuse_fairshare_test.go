package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// The operator's fair share through the API (real broker, real redis-server,
// mutual TLS): what a hostile member gets back, and that the honest ones are
// not held back.

func startWithPolicy(t *testing.T, body string) *brokertest.Broker {
	t.Helper()
	p, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n" + body))
	require.NoError(t, err)
	return brokertest.Start(t, brokertest.Options{Store: store.Config{Policy: p}})
}

// postResp sends a reservation as cn and returns the answer with its headers.
func postResp(t *testing.T, b *brokertest.Broker, cn string, req api.ReservationRequest) (*http.Response, []byte) {
	t.Helper()
	data, err := json.Marshal(req)
	require.NoError(t, err)
	resp, err := b.Client(cn).Post(b.URL+"/api/v2/reservations", "application/json", bytes.NewReader(data))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// TestAbuseOneMemberReservesAllCapacityHTTP: mallory fires 60 concurrent
// reservations for every core of the federation; past its limit each is
// refused with 429 LimitExceeded naming the limit, with Retry-After; rome's
// request, after them, is placed.
func TestAbuseOneMemberReservesAllCapacityHTTP(t *testing.T) {
	b := startWithPolicy(t, `requesters: {default: {maxResources: {cpu: "10"}}}`)
	b.Advertise("paris", "32", "128Gi", "", "0.03", nil)
	b.Advertise("berlin", "28", "128Gi", "", "0.05", nil)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body := postResp(t, b, "mallory", reservation(fmt.Sprintf("grab-%d", i), "1", "1Gi"))
			mu.Lock()
			defer mu.Unlock()
			codes[resp.StatusCode]++
			if resp.StatusCode == http.StatusTooManyRequests {
				e := brokertest.Decode[api.Error](t, body)
				assert.Equal(t, api.ReasonLimitExceeded, e.Reason)
				assert.Contains(t, e.Error, "requester mallory is at its limit of reserved cpu: holds 10, asks 1 more, limit 10")
				assert.Equal(t, "5", resp.Header.Get("Retry-After"))
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, map[int]int{http.StatusCreated: 10, http.StatusTooManyRequests: 50}, codes)
	resp, body := postResp(t, b, "rome", reservation("honest", "8", "8Gi"))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)

	// rbctl's view: each member's usage against its limits.
	code, data := b.Do("rome", http.MethodGet, "/api/v2/usage", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	usage := brokertest.Decode[[]api.MemberUsage](t, data)
	byCluster := map[string]api.MemberUsage{}
	for _, u := range usage {
		byCluster[u.Cluster] = u
	}
	assert.Equal(t, []string{"berlin", "mallory", "paris", "rome"}, []string{usage[0].Cluster, usage[1].Cluster, usage[2].Cluster, usage[3].Cluster})
	assert.Equal(t, int64(10), byCluster["mallory"].Reservations)
	assert.Equal(t, "10", byCluster["mallory"].Resources.CPU.String())
	assert.Equal(t, "10", byCluster["mallory"].Limits.MaxResources.CPU.String())
	assert.Equal(t, "8", byCluster["rome"].Resources.CPU.String())
	assert.Equal(t, int64(0), byCluster["paris"].Reservations)
	require.NoError(t, b.Store.CheckInvariant(t.Context()))
}

// TestAbuseReserveRateHTTP: beyond its rate, a member's reserve calls get
// 429 RateLimited with the seconds to wait; another member's are unaffected.
func TestAbuseReserveRateHTTP(t *testing.T) {
	b := startWithPolicy(t, `requesters: {clusters: {mallory: {reservesPerSecond: 0.5, reserveBurst: 3}}}`)
	b.Advertise("paris", "32", "128Gi", "", "0.03", nil)
	var limited int
	for i := range 10 {
		resp, body := postResp(t, b, "mallory", reservation(fmt.Sprintf("m-%d", i), "100m", "64Mi"))
		if resp.StatusCode == http.StatusCreated {
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
		limited++
		e := brokertest.Decode[api.Error](t, body)
		assert.Equal(t, api.ReasonRateLimited, e.Reason)
		assert.Contains(t, e.Error, "requester mallory exceeds its limit of 0.5 reserve calls per second")
		assert.Equal(t, "2", resp.Header.Get("Retry-After"), "the next call in 2 s at most")
	}
	assert.Equal(t, 7, limited, "3 at once, then none")
	for i := range 10 {
		resp, body := postResp(t, b, "rome", reservation(fmt.Sprintf("r-%d", i), "100m", "64Mi"))
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	}
}

// TestAbuseRefusedCallsCostRedis: a member calling reserve in a loop past its
// rate cost one Redis script call per call, each refused; now the replica
// answers the calls its rate still refuses itself: 200 refused calls cost a
// handful of script calls, the answers say the same, and the member is
// served again once its rate allows.
func TestAbuseRefusedCallsCostRedis(t *testing.T) {
	b := startWithPolicy(t, `requesters: {clusters: {mallory: {reservesPerSecond: 2, reserveBurst: 1}}}`)
	b.Advertise("paris", "32", "128Gi", "", "0.03", nil)
	evalsha := func() int64 {
		stats, err := b.RDB.Info(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(stats, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		return 0
	}
	resp, body := postResp(t, b, "mallory", reservation("first", "100m", "64Mi"))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	before := evalsha()
	for i := range 200 {
		resp, body := postResp(t, b, "mallory", reservation(fmt.Sprintf("m-%d", i), "100m", "64Mi"))
		if resp.StatusCode == http.StatusCreated {
			continue // the rate allows one call every 500ms
		}
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
		e := brokertest.Decode[api.Error](t, body)
		assert.Equal(t, api.ReasonRateLimited, e.Reason)
		assert.Contains(t, e.Error, "requester mallory exceeds its limit of 2 reserve calls per second: retry in ")
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	}
	calls := evalsha() - before
	t.Logf("200 calls past the rate: %d script calls", calls)
	assert.Less(t, calls, int64(40), "refusals answered without Redis")
	time.Sleep(600 * time.Millisecond)
	resp, body = postResp(t, b, "mallory", reservation("later", "100m", "64Mi"))
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "served once the rate allows: %s", body)
}

// TestAbuseLiarProviderHTTP: an advertisement outside the operator's bounds
// is refused with 403 OutsideBounds naming the bound, one with more
// allocated than allocatable with 400; nothing is stored, and the honest
// provider gets the reservation.
func TestAbuseLiarProviderHTTP(t *testing.T) {
	b := startWithPolicy(t, `
providers:
  default: {maxCapacity: {cpu: "64"}, prices: {cpu: {min: "0.01"}}}
  clusters:
    mallory: {labels: {allowedValues: {region: [eu-south]}}}
`)
	before := b.Snapshot()
	q := brokertest.Quantities("100000", "400Ti", "")
	liar := api.Advertisement{Resources: api.ClusterResources{Capacity: q, Allocatable: q},
		Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0")}}
	code, data := b.Do("mallory", http.MethodPut, "/api/v2/clusters/mallory/advertisement", liar)
	require.Equal(t, http.StatusForbidden, code, "%s", data)
	e := brokertest.Decode[api.Error](t, data)
	assert.Equal(t, api.ReasonOutsideBounds, e.Reason)
	assert.Equal(t, "advertised capacity cpu 100k exceeds the most allowed, 64 (operator bound providers.default.maxCapacity.cpu)", e.Error)

	q = brokertest.Quantities("64", "256Gi", "")
	liar = api.Advertisement{Labels: map[string]string{"region": "eu-west"}, Resources: api.ClusterResources{Capacity: q, Allocatable: q},
		Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.02")}}
	code, data = b.Do("mallory", http.MethodPut, "/api/v2/clusters/mallory/advertisement", liar)
	require.Equal(t, http.StatusForbidden, code, "%s", data)
	assert.Contains(t, string(data), "operator bound providers.clusters[mallory].labels.allowedValues[region]")

	negative := api.Advertisement{Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("65", "1Gi", "")},
		Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.02")}}
	code, data = b.Do("mallory", http.MethodPut, "/api/v2/clusters/mallory/advertisement", negative)
	require.Equal(t, http.StatusBadRequest, code, "%s", data)
	assert.Contains(t, string(data), "allocated cpu 65 exceeds allocatable 64: free capacity cannot be negative")
	after := b.Snapshot()
	assert.Contains(t, after, "rb:{b}:rate:advertisements:mallory", "a refused advertisement is still a call: it counts against mallory's rate")
	delete(after, "rb:{b}:rate:advertisements:mallory")
	assert.Equal(t, before, after, "nothing else stored")

	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	resp, body := postResp(t, b, "rome", reservation("r1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.Equal(t, "paris", brokertest.Decode[api.Reservation](t, body).Provider)
}
