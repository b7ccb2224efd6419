package server_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

func TestReserveReadRelease(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	b.Advertise("berlin", "16", "64Gi", "", "0.05", nil)

	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("r1", "2", "4Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	r := brokertest.Decode[api.Reservation](t, data)
	assert.Equal(t, "paris", r.Provider, "cheaper at equal size")
	assert.Equal(t, "Reserved", r.Phase)
	assert.Equal(t, "2", r.Resources.CPU.String())
	assert.Equal(t, "4Gi", r.Resources.Memory.String())
	assert.WithinDuration(t, time.Now().Add(time.Hour), r.ExpiresAt, time.Minute, "server default duration")
	require.Len(t, r.Candidates, 2)
	assert.Greater(t, r.Candidates[0].Score, r.Candidates[1].Score)

	// Ids are scoped per requester: the provider names it with ?requester=.
	for path, want := range map[string]map[string]int{
		"/api/v2/reservations/r1":                {"rome": 200, "paris": 404, "berlin": 404},
		"/api/v2/reservations/r1?requester=rome": {"rome": 200, "paris": 200, "berlin": 404}, // not a party: as if it did not exist
	} {
		for cn, code := range want {
			got, data := b.Do(cn, http.MethodGet, path, nil)
			assert.Equal(t, code, got, "GET %s as %s: %s", path, cn, data)
		}
	}
	code, data = b.Do("berlin", http.MethodGet, "/api/v2/reservations/r1?requester=Not_A_Cluster", nil)
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
	code, data = b.Do("berlin", http.MethodDelete, "/api/v2/reservations/r1?requester=rome", nil)
	assert.Equal(t, http.StatusNotFound, code, "%s", data)
	assert.Equal(t, api.ReasonNotFound, brokertest.Decode[api.Error](t, data).Reason)

	code, data = b.Do("rome", http.MethodGet, "/api/v2/reservations?role=requester", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Len(t, brokertest.Decode[api.ReservationList](t, data).Items, 1)

	code, data = b.Do("rome", http.MethodDelete, "/api/v2/reservations/r1", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, "Released", brokertest.Decode[api.Reservation](t, data).Phase)
	code, data = b.Do("paris", http.MethodDelete, "/api/v2/reservations/r1?requester=rome", nil)
	require.Equal(t, http.StatusOK, code, "release twice: same answer, %s", data)
	code, _ = b.Do("rome", http.MethodDelete, "/api/v2/reservations/nope", nil)
	assert.Equal(t, http.StatusNotFound, code)

	c, err := b.Store.Cluster(context.Background(), "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, c.Reserved, "freed exactly once")
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}

func TestIdempotentReservation(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, first := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("same-id", "3", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", first)
	code, again := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("same-id", "3", "1Gi"))
	require.Equal(t, http.StatusOK, code, "a retry is answered with the first decision, %s", again)
	r1, r2 := brokertest.Decode[api.Reservation](t, first), brokertest.Decode[api.Reservation](t, again)
	assert.LessOrEqual(t, r2.RemainingMs, r1.RemainingMs, "measured at each answer")
	r2.RemainingMs = r1.RemainingMs
	assert.Equal(t, r1, r2)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("same-id", "2", "1Gi"))
	assert.Equal(t, http.StatusConflict, code, "same id, other amounts: %s", data)
	assert.Equal(t, api.ReasonConflict, brokertest.Decode[api.Error](t, data).Reason)

	c, err := b.Store.Cluster(context.Background(), "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(3000), c.Reserved.CPU, "locked once")
}

func TestNothingFits(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "2", "32Gi", "", "0.03", nil)
	b.Advertise("berlin", "16", "1Gi", "", "0.03", nil)
	b.Advertise("rome", "64", "256Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("big", "4", "8Gi"))
	require.Equal(t, http.StatusConflict, code, "%s", data)
	e := brokertest.Decode[api.Error](t, data)
	assert.Equal(t, api.ReasonNoCapacity, e.Reason)
	assert.Equal(t, map[string]int64{"requester": 1, "insufficient_cpu": 1, "insufficient_mem": 1, "stale": 0, "selector": 0}, e.Rejected)
	assert.Contains(t, e.Error, "insufficient_cpu=1")
}

func TestExpiryTimer(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	req := reservation("short", "2", "2Gi")
	req.Duration = "300ms"
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", req)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	require.Eventually(t, func() bool {
		_, data := b.Do("rome", http.MethodGet, "/api/v2/reservations/short", nil)
		return brokertest.Decode[api.Reservation](t, data).Phase == "Expired"
	}, 5*time.Second, 50*time.Millisecond, "the broker's timer expires it")
	c, err := b.Store.Cluster(context.Background(), "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, c.Reserved, "capacity came back")
}

func TestIdentity(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, data := b.Do("paris", http.MethodPost, "/api/v2/reservations", reservation("paris-r", "1", "1Gi"))
	require.Equal(t, http.StatusConflict, code, "only paris is advertised and it cannot serve itself: %s", data)
	b.Advertise("berlin", "8", "32Gi", "", "0.03", nil)
	code, data = b.Do("paris", http.MethodPost, "/api/v2/reservations", reservation("paris-r", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	before := b.Snapshot()

	q := brokertest.Quantities("1", "1Gi", "")
	code, _ = b.Do("rome", http.MethodPut, "/api/v2/clusters/paris/advertisement",
		api.Advertisement{Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: q}})
	assert.Equal(t, http.StatusForbidden, code, "rome cannot advertise as paris")
	code, _ = b.Do("rome", http.MethodPost, "/api/v1/advertisements",
		api.V1Advertisement{ClusterID: "paris", Resources: api.V1Resources{Capacity: q, Allocatable: q, Allocated: q, Available: q}})
	assert.Equal(t, http.StatusForbidden, code, "nor through v1")
	code, _ = b.Do("rome", http.MethodGet, "/api/v2/reservations/paris-r?requester=paris", nil)
	assert.Equal(t, http.StatusNotFound, code, "rome cannot read paris's reservation, nor learn it exists")
	code, _ = b.Do("rome", http.MethodGet, "/api/v2/reservations/paris-r", nil)
	assert.Equal(t, http.StatusNotFound, code, "rome has no paris-r of its own")
	code, _ = b.Do("rome", http.MethodDelete, "/api/v2/reservations/paris-r?requester=paris", nil)
	assert.Equal(t, http.StatusNotFound, code, "nor release it")
	code, _ = b.Do("rome", http.MethodPost, "/api/v2/reservations/paris-r/grant?requester=paris",
		api.Grant{Endpoint: "https://x:6443", Token: "t", Namespace: "rb-paris", ExpiresAt: time.Now().Add(time.Hour)})
	assert.Equal(t, http.StatusNotFound, code, "nor grant it")
	assert.Equal(t, before, b.Snapshot(), "refused calls changed nothing")

	// No client certificate: the TLS handshake fails.
	anon := b.HTTPClient(&tls.Config{RootCAs: b.CA.Pool()})
	_, err := anon.Get(b.URL + "/api/v2/clusters")
	require.Error(t, err, "no client certificate must fail the handshake")
	// A certificate from another CA is not accepted either.
	other, err := certauthority.NewCA("other")
	require.NoError(t, err)
	pair, err := other.IssueClient("rome")
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	foreign := b.HTTPClient(&tls.Config{RootCAs: b.CA.Pool(), Certificates: []tls.Certificate{cert}})
	_, err = foreign.Get(b.URL + "/api/v2/clusters")
	require.Error(t, err)
}

func TestGrant(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("g1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)

	grant := api.Grant{Endpoint: "https://paris:6443", CABundle: []byte("-----BEGIN CERTIFICATE-----"), Token: "secret-token",
		Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second)}
	code, data = b.Do("rome", http.MethodPost, "/api/v2/reservations/g1/grant", grant)
	assert.Equal(t, http.StatusForbidden, code, "only the provider grants: %s", data)
	bad := grant
	bad.Namespace = "Not_A_Namespace"
	code, data = b.Do("paris", http.MethodPost, "/api/v2/reservations/g1/grant?requester=rome", bad)
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
	code, data = b.Do("paris", http.MethodPost, "/api/v2/reservations/g1/grant", grant)
	assert.Equal(t, http.StatusNotFound, code, "paris has no g1 of its own: %s", data)
	code, data = b.Do("paris", http.MethodPost, "/api/v2/reservations/g1/grant?requester=rome", grant)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, "Active", brokertest.Decode[api.Reservation](t, data).Phase)
	assert.Nil(t, brokertest.Decode[api.Reservation](t, data).Grant, "the provider's answer does not echo the token")

	_, data = b.Do("rome", http.MethodGet, "/api/v2/reservations/g1", nil)
	r := brokertest.Decode[api.Reservation](t, data)
	require.NotNil(t, r.Grant, "the requester reads its grant")
	assert.Equal(t, grant, *r.Grant)
	_, data = b.Do("paris", http.MethodGet, "/api/v2/reservations/g1?requester=rome", nil)
	assert.Nil(t, brokertest.Decode[api.Reservation](t, data).Grant)

	code, _ = b.Do("rome", http.MethodDelete, "/api/v2/reservations/g1", nil)
	require.Equal(t, http.StatusOK, code)
	code, data = b.Do("paris", http.MethodPost, "/api/v2/reservations/g1/grant?requester=rome", grant)
	assert.Equal(t, http.StatusConflict, code, "an ended reservation takes no grant: %s", data)
}

// TestConcurrentReservations fires 2,000 reservation requests at once at 20
// clusters that can hold only part of them, from five requesters.
func TestConcurrentReservations(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	slots := 0
	for i := 0; i < 20; i++ {
		cores := 10 + 5*(i%5) // 10..30 cores, 1 core per request
		slots += cores
		b.Advertise(fmt.Sprintf("provider-%02d", i), fmt.Sprint(cores), "1Ti", "", fmt.Sprintf("0.0%d", 1+i%9), nil)
	}
	requesters := []string{"rome", "milan", "turin", "naples", "genoa"}
	clients := map[string]*http.Client{}
	for _, r := range requesters {
		// Each requester keeps at most 64 connections, as a real client pool
		// would: 2,000 simultaneous TLS handshakes could outlast the server's
		// 5 s handshake deadline on a loaded 2-core machine.
		tr := b.Client(r).Transport.(*http.Transport).Clone()
		tr.MaxConnsPerHost = 64
		t.Cleanup(tr.CloseIdleConnections)
		clients[r] = &http.Client{Transport: tr, Timeout: time.Minute}
	}
	const n = 2000
	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			cn := requesters[i%len(requesters)]
			body := fmt.Sprintf(`{"id":"burst-%d","resources":{"cpu":"1","memory":"1Gi"}}`, i)
			req, _ := http.NewRequest(http.MethodPost, b.URL+"/api/v2/reservations", strings.NewReader(body))
			resp, err := clients[cn].Do(req)
			if err != nil {
				errs <- err.Error()
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusCreated:
				granted.Add(1)
			case http.StatusConflict:
				refused.Add(1)
			default:
				errs <- fmt.Sprintf("%d %s", resp.StatusCode, data)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	assert.Equal(t, int64(slots), granted.Load(), "every slot granted, none twice")
	assert.Equal(t, int64(n-slots), refused.Load())
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
	clusters, err := b.Store.Clusters(context.Background())
	require.NoError(t, err)
	for _, c := range clusters {
		assert.Equal(t, c.Allocatable.CPU, c.Reserved.CPU, "cluster %s is exactly full", c.ID)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, _ := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("m1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code)
	code, _ = b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("m2", "100", "1Gi"))
	require.Equal(t, http.StatusConflict, code)

	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(b.Health + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		code, _ := b.Do("rome", http.MethodGet, path, nil)
		assert.Equal(t, http.StatusOK, code, "also on the API port: %s", path)
	}
	resp, err := http.Get(b.Health + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`rb_broker_reservations_total{outcome="reserved"} 1`,
		`rb_broker_reservations_total{outcome="no_fit"} 1`,
		`rb_broker_decision_duration_seconds_count{outcome="reserved"} 1`,
		`rb_broker_decision_duration_seconds_count{outcome="no_fit"} 1`,
		// Method and route apart, the route as registered, never the raw path.
		`rb_broker_http_requests_total{code="201",method="POST",route="/api/v2/reservations"} 1`,
		`rb_broker_http_requests_total{code="409",method="POST",route="/api/v2/reservations"} 1`,
		`rb_broker_http_request_duration_seconds_count{method="POST",route="/api/v2/reservations"} 2`,
		`rb_broker_http_request_duration_seconds_count{method="GET",route="/api/v2/clusters/{id}"} 0`,
		`rb_broker_clusters{state="live"} 1`,
		`rb_broker_clusters{state="stale"} 0`,
	} {
		assert.Contains(t, string(body), want)
	}

	// The advertised price reads as money, not as a quantity's canonical "30m".
	_, data := b.Do("rome", http.MethodGet, "/api/v2/clusters/paris", nil)
	assert.Contains(t, string(data), `"prices":{"currency":"EUR","cpu":"0.03","memory":"0.004","gpu":"0"}`)

	// Redis loses its script cache (as after a restart): readiness reloads it.
	require.NoError(t, b.RDB.ScriptFlush(context.Background()).Err())
	resp, err = http.Get(b.Health + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	code, data = b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("m3", "1", "1Gi"))
	assert.Equal(t, http.StatusCreated, code, "%s", data)

	// Redis down: not ready, but metrics still answer (with what they can collect).
	b.Redis.Stop()
	resp, err = http.Get(b.Health + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp, err = http.Get(b.Health + "/metrics")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), `rb_broker_reservations_total{outcome="reserved"} 2`)
	code, data = b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("m4", "1", "1Gi"))
	assert.Equal(t, http.StatusServiceUnavailable, code, "%s", data)
	assert.Equal(t, api.ReasonUnavailable, brokertest.Decode[api.Error](t, data).Reason)
}

// TestLeaveFederation: DELETE /api/v2/clusters/{id} is a member leaving:
// only itself (403 for another), 409 while live reservations name it, 204
// once forgotten (no longer listed), 404 for a cluster the broker does not
// hold.
func TestLeaveFederation(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("r1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)

	code, data = b.Do("rome", http.MethodDelete, "/api/v2/clusters/paris", nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, "cluster rome may only remove itself, not paris", brokertest.Decode[api.Error](t, data).Error)
	code, data = b.Do("paris", http.MethodDelete, "/api/v2/clusters/paris", nil)
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, brokertest.Decode[api.Error](t, data).Error, "cluster paris still has live reservations (0 as requester, 1 as provider)")

	code, _ = b.Do("rome", http.MethodDelete, "/api/v2/reservations/r1", nil)
	require.Equal(t, http.StatusOK, code)
	code, data = b.Do("paris", http.MethodDelete, "/api/v2/clusters/paris", nil)
	require.Equal(t, http.StatusNoContent, code, "%s", data)
	code, _ = b.Do("paris", http.MethodGet, "/api/v2/clusters/paris", nil)
	assert.Equal(t, http.StatusNotFound, code)
	code, data = b.Do("paris", http.MethodDelete, "/api/v2/clusters/paris", nil)
	assert.Equal(t, http.StatusNotFound, code, "%s", data)
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}
