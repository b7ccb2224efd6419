package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
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

const ratesPolicy = `apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
members:
  default:
    advertisements: {perSecond: 100m, burst: "3"}
    renewals: {perSecond: "1", burst: "2"}
    renewalBytes: {perSecond: 10Ki, burst: 20Ki}
    writes: {perSecond: "1", burst: "2"}
    protections: {perSecond: 100m, burst: "1"}
  clusters:
    rome: {advertisements: {perSecond: "0"}}
`

// TestAbuseMemberRates: each write route of a member counts against its
// rate, exact on the Redis clock, and past it answers 429 RateLimited with
// Retry-After, changing nothing; another member's calls are not held up; a
// refused call is held until its wait is over (at most a second), and once
// refused, a member's calls are answered by the broker without Redis until
// the wait is over; rb_broker_rate_limited_total counts the refusals.
func TestAbuseMemberRates(t *testing.T) {
	p, err := policy.Parse([]byte(ratesPolicy))
	require.NoError(t, err)
	// The expiry loop every 30 s: the script calls counted below are the calls'.
	b := brokertest.Start(t, brokertest.Options{Store: store.Config{Policy: p}, ExpiryInterval: 30 * time.Second})
	do := func(cn, method, path string, body any) (*http.Response, string) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			data, err := json.Marshal(body)
			require.NoError(t, err)
			rd = bytes.NewReader(data)
		}
		req, err := http.NewRequest(method, b.URL+path, rd)
		require.NoError(t, err)
		resp, err := b.Client(cn).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(data)
	}
	// refused checks a 429 RateLimited whose Retry-After is retryAfter
	// seconds: what is left of the wait once the call was held.
	refused := func(resp *http.Response, body, mention string, retryAfter ...string) {
		t.Helper()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
		assert.Contains(t, retryAfter, resp.Header.Get("Retry-After"))
		assert.Contains(t, body, `"reason":"`+api.ReasonRateLimited+`"`)
		assert.Contains(t, body, mention)
	}
	ad := func(id string) api.Advertisement {
		q := brokertest.Quantities("8", "32Gi", "")
		return api.Advertisement{ClusterName: id, Endpoint: "https://" + id + ".example:6443",
			Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("0", "0", "")},
			Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.03"), Memory: brokertest.MustQ("0.004")}}
	}

	// Advertisements: a burst of 3, then refused, held a second with 9 s
	// left to wait; v1 shares the rate.
	for i := range 3 {
		resp, body := do("paris", http.MethodPut, "/api/v2/clusters/paris/advertisement", ad("paris"))
		require.Equal(t, http.StatusOK, resp.StatusCode, "advertisement %d: %s", i, body)
	}
	before := b.Snapshot()
	t0 := time.Now()
	resp, body := do("paris", http.MethodPut, "/api/v2/clusters/paris/advertisement", ad("paris"))
	refused(resp, body, "member paris exceeds its limit of 0.1 advertisements per second", "9")
	assert.GreaterOrEqual(t, time.Since(t0), 900*time.Millisecond, "held about a second")
	resp, body = do("paris", http.MethodPost, "/api/v1/advertisements", api.V1Advertisement{ClusterID: "paris"})
	refused(resp, body, "advertisements per second", "8")
	assert.Equal(t, before, b.Snapshot(), "the refused calls changed nothing")
	for i := range 10 { // rome's override: no limit
		resp, body := do("rome", http.MethodPut, "/api/v2/clusters/rome/advertisement", ad("rome"))
		require.Equal(t, http.StatusOK, resp.StatusCode, "rome's advertisement %d: %s", i, body)
	}

	// Renewals: calls, and bytes before the body is read.
	ids := func(n, length int) api.RenewRequest {
		r := api.RenewRequest{}
		for i := range n {
			r.IDs = append(r.IDs, fmt.Sprintf("%0*d", length, i))
		}
		return r
	}
	resp, body = do("milan", http.MethodPost, "/api/v2/renewals", ids(150, 200)) // 30 KB, dearer than the burst: costs the burst
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	resp, body = do("milan", http.MethodPost, "/api/v2/renewals", ids(50, 200)) // 10 KB: a second's worth
	refused(resp, body, "member milan exceeds its limit of 10240 renewal bytes per second", "0", "1")
	for range 2 {
		resp, body = do("lyon", http.MethodPost, "/api/v2/renewals", ids(1, 8))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	}
	resp, body = do("lyon", http.MethodPost, "/api/v2/renewals", ids(1, 8))
	refused(resp, body, "member lyon exceeds its limit of 1 renewal calls per second", "0", "1")

	// Writes: releases, grants and leaving (even of unknown ids: a call is a call).
	for i := range 2 {
		resp, body := do("lyon", http.MethodDelete, fmt.Sprintf("/api/v2/reservations/x-%d", i), nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)
	}
	resp, body = do("lyon", http.MethodPost, "/api/v2/reservations/x-3/grant?requester=rome", api.Grant{})
	refused(resp, body, "writes (release, grant, leave) per second", "0", "1")
	resp, body = do("lyon", http.MethodDelete, "/api/v2/clusters/lyon", nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "held until its wait was over, the next call passes: %s", body)
	resp, body = do("lyon", http.MethodDelete, "/api/v2/clusters/lyon", nil)
	refused(resp, body, "writes", "0", "1")

	// Protections; then, while refused, 20 calls at once are answered
	// without Redis: 8 held, the others at once.
	resp, body = do("lyon", http.MethodPut, "/api/v2/protections", api.ProtectRequest{IDs: []string{}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	resp, body = do("lyon", http.MethodPut, "/api/v2/protections", api.ProtectRequest{IDs: []string{}})
	refused(resp, body, "protection updates per second", "9")
	calls := func() int64 {
		info, err := b.RDB.Info(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		m := regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`).FindStringSubmatch(info)
		require.NotNil(t, m, "%s", info)
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	scripts := calls()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := do("lyon", http.MethodPut, "/api/v2/protections", api.ProtectRequest{IDs: []string{}})
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	assert.Equal(t, map[int]int{http.StatusTooManyRequests: 20}, codes)
	assert.LessOrEqual(t, calls()-scripts, int64(1), "20 refusals cost Redis no script call (the expiry loop may run one)")

	// The metric, by rate.
	mresp, err := http.Get(b.Health + "/metrics")
	require.NoError(t, err)
	defer mresp.Body.Close()
	metrics, err := io.ReadAll(mresp.Body)
	require.NoError(t, err)
	limited := regexp.MustCompile(`(?m)^rb_broker_rate_limited_total\{rate="([a-z-]+)"\} (\d+)$`).FindAllStringSubmatch(string(metrics), -1)
	got := map[string]string{}
	for _, m := range limited {
		got[m[1]] = m[2]
	}
	assert.Equal(t, map[string]string{"advertisements": "2", "renewal-bytes": "1", "renewals": "1", "writes": "2", "protections": "21"}, got)
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}
