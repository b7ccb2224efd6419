package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

// newClient returns a client for cluster id with a certificate directory
// written by the test broker's CA.
func newClient(t *testing.T, b *brokertest.Broker, id string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(b.URL, b.ClusterCertDir(id), opts...)
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func advertisement(cpu, memory, pricePerCore string) api.Advertisement {
	q := brokertest.Quantities(cpu, memory, "")
	return api.Advertisement{
		Endpoint:  "https://api.example:6443",
		Labels:    map[string]string{"zone": "eu"},
		Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("0", "0", "")},
		Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ(pricePerCore), Memory: brokertest.MustQ("0.004")},
	}
}

func request(id, cpu, memory string) api.ReservationRequest {
	return api.ReservationRequest{ID: id, Resources: brokertest.Quantities(cpu, memory, "")}
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	paris, berlin, rome := newClient(t, b, "paris"), newClient(t, b, "berlin"), newClient(t, b, "rome")
	assert.Equal(t, "rome", rome.Identity())
	assert.Equal(t, b.URL, rome.BaseURL())

	c, err := paris.Advertise(ctx, "paris", advertisement("16", "64Gi", "0.03"))
	require.NoError(t, err)
	assert.Equal(t, "paris", c.ClusterID)
	assert.True(t, c.Live)
	assert.Equal(t, "16", c.Resources.Available.CPU.String())
	_, err = berlin.Advertise(ctx, "berlin", advertisement("16", "64Gi", "0.05"))
	require.NoError(t, err)

	clusters, err := rome.Clusters(ctx)
	require.NoError(t, err)
	require.Len(t, clusters, 2)
	// The broker lists by last-seen time (its zset score), not by id.
	assert.ElementsMatch(t, []string{"berlin", "paris"}, []string{clusters[0].ClusterID, clusters[1].ClusterID})
	c, err = rome.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Zero(t, c.Prices.CPU.Cmp(*brokertest.MustQ("0.03")), "price %s", c.Prices.CPU) // rendered as 30m
	assert.Equal(t, map[string]string{"zone": "eu"}, c.Labels)

	r, err := rome.Reserve(ctx, request("r1", "2", "4Gi"))
	require.NoError(t, err)
	assert.Equal(t, "paris", r.Provider, "cheaper at equal size")
	assert.Equal(t, "rome", r.Requester)
	assert.Equal(t, "Reserved", r.Phase)
	assert.Equal(t, "4Gi", r.Resources.Memory.String())
	require.Len(t, r.Candidates, 2)
	again, err := rome.Reserve(ctx, request("r1", "2", "4Gi"))
	require.NoError(t, err)
	assert.LessOrEqual(t, again.RemainingMs, r.RemainingMs, "measured at each answer")
	again.RemainingMs = r.RemainingMs
	assert.Equal(t, r, again, "idempotent by id: the first decision again")

	_, err = paris.Reservation(ctx, "r1")
	assert.True(t, client.IsNotFound(err), "ids are scoped per requester: paris has no r1: %v", err)
	got, err := paris.ProvidedReservation(ctx, "rome", "r1")
	require.NoError(t, err)
	assert.Equal(t, r.ID, got.ID)
	list, err := rome.Reservations(ctx, client.RoleRequester)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "r1", list[0].ID)
	list, err = rome.Reservations(ctx, client.RoleProvider)
	require.NoError(t, err)
	assert.Empty(t, list)
	list, err = paris.Reservations(ctx, "")
	require.NoError(t, err)
	assert.Len(t, list, 1)

	grant := api.Grant{Endpoint: "https://paris.example:6443", CABundle: []byte("-----BEGIN CERTIFICATE-----"),
		Token: "secret", Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second)}
	granted, err := paris.GrantTo(ctx, "rome", "r1", grant)
	require.NoError(t, err)
	assert.Equal(t, "Active", granted.Phase)
	assert.Nil(t, granted.Grant, "the provider's answer does not echo the token")
	got, err = rome.Reservation(ctx, "r1")
	require.NoError(t, err)
	require.NotNil(t, got.Grant)
	assert.Equal(t, grant, *got.Grant)

	released, err := rome.Release(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, "Released", released.Phase)
	assert.NotNil(t, released.EndedAt)
	released, err = rome.Release(ctx, "r1")
	require.NoError(t, err, "releasing twice is fine")
	assert.Equal(t, "Released", released.Phase)
	c, err = paris.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.True(t, c.Resources.Reserved.CPU.IsZero(), "capacity came back")
	list, err = rome.Reservations(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, list)
}

func TestTypedErrors(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "4", "8Gi", "", "0.03", nil)
	rome, milan, berlin := newClient(t, b, "rome"), newClient(t, b, "milan"), newClient(t, b, "berlin")

	_, err := rome.Reserve(ctx, request("big", "64", "1Gi"))
	require.Error(t, err)
	var ae *client.APIError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusConflict, ae.StatusCode)
	assert.Equal(t, api.ReasonNoCapacity, ae.Reason)
	assert.Equal(t, int64(1), ae.Rejected["insufficient_cpu"])
	assert.Contains(t, ae.Message, "insufficient_cpu=1")
	assert.True(t, client.IsNoCapacity(err))
	assert.False(t, client.IsConflict(err), "NoCapacity is not an id conflict")
	assert.False(t, client.IsRetryable(err))
	assert.Contains(t, err.Error(), "POST /api/v2/reservations: broker answered 409 NoCapacity")

	_, err = rome.Reserve(ctx, request("mine", "1", "1Gi"))
	require.NoError(t, err)
	_, err = rome.Reserve(ctx, request("mine", "2", "1Gi"))
	assert.True(t, client.IsConflict(err), "same id, other amounts: %v", err)
	assert.False(t, client.IsNoCapacity(err))
	_, err = milan.Reserve(ctx, request("mine", "1", "1Gi"))
	require.NoError(t, err, "ids are scoped per requester: milan's own mine")
	_, err = milan.Release(ctx, "mine")
	require.NoError(t, err)

	_, err = rome.Advertise(ctx, "paris", advertisement("1", "1Gi", "0.01"))
	assert.True(t, client.IsForbidden(err), "rome cannot advertise as paris: %v", err)
	_, err = berlin.ProvidedReservation(ctx, "rome", "mine")
	assert.True(t, client.IsNotFound(err), "not a party: as if it did not exist: %v", err)
	_, err = berlin.Reservation(ctx, "mine")
	assert.True(t, client.IsNotFound(err), "berlin has no mine of its own: %v", err)
	_, err = berlin.GrantTo(ctx, "rome", "mine", api.Grant{Endpoint: "https://x:6443", Token: "t", Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour)})
	assert.True(t, client.IsNotFound(err), "%v", err)
	_, err = rome.Grant(ctx, "mine", api.Grant{Endpoint: "https://x:6443", Token: "t", Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour)})
	assert.True(t, client.IsForbidden(err), "only the provider grants: %v", err)

	for name, call := range map[string]func() error{
		"reservation": func() error { _, err := rome.Reservation(ctx, "nope"); return err },
		"cluster":     func() error { _, err := rome.Cluster(ctx, "nope"); return err },
		"release":     func() error { _, err := rome.Release(ctx, "nope"); return err },
	} {
		err := call()
		assert.True(t, client.IsNotFound(err), "%s: %v", name, err)
		assert.False(t, client.IsRetryable(err), name)
	}

	_, err = rome.Reserve(ctx, request("Not_An_Id", "1", "1Gi"))
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusBadRequest, ae.StatusCode)
	assert.Equal(t, api.ReasonBadRequest, ae.Reason)
	_, err = rome.Reservations(ctx, "owner")
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusBadRequest, ae.StatusCode)
	_, err = rome.Reservation(ctx, "")
	require.Error(t, err, "an empty id is refused before any request")
	assert.NotErrorAs(t, err, &ae)

	_, err = rome.Release(ctx, "mine")
	require.NoError(t, err)
	paris := newClient(t, b, "paris") // the provider of "mine"

	_, err = paris.GrantTo(ctx, "rome", "mine", api.Grant{Endpoint: "https://x:6443", Token: "t", Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour)})
	assert.True(t, client.IsConflict(err), "an ended reservation takes no grant: %v", err)
}

// TestRetriesAgainstUnavailableBroker stops Redis: the broker answers 503,
// which idempotent calls retry and a grant does not; the broker's request
// counter shows how many attempts arrived. (Each 503 takes the broker ~1.7s:
// its Redis client retries the dial first.)
func TestRetriesAgainstUnavailableBroker(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newClient(t, b, "rome", client.WithRetries(2, 10*time.Millisecond))
	noRetry := newClient(t, b, "paris", client.WithRetries(0, 0))
	b.Redis.Stop()

	_, err := rome.Clusters(ctx)
	var ae *client.APIError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusServiceUnavailable, ae.StatusCode)
	assert.Equal(t, api.ReasonUnavailable, ae.Reason)
	assert.True(t, client.IsRetryable(err))
	_, err = rome.Grant(ctx, "r1", api.Grant{Endpoint: "https://x:6443", Token: "t", Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour)})
	assert.True(t, client.IsRetryable(err), "%v", err)
	_, err = noRetry.Clusters(ctx)
	assert.True(t, client.IsRetryable(err), "%v", err)

	// Scrape once Redis is back: the broker's /metrics fails as a whole while
	// Redis is down (its cluster gauge cannot be collected).
	b.Redis.Restart()
	var metrics string
	require.Eventually(t, func() bool { metrics = scrape(t, b); return strings.Contains(metrics, "rb_broker_clusters") },
		10*time.Second, 100*time.Millisecond)
	assert.Contains(t, metrics, `rb_broker_http_requests_total{code="503",method="GET",route="/api/v2/clusters"} 4`,
		"1 + 2 retries by rome, 1 attempt by the client without retries")
	assert.Contains(t, metrics, `rb_broker_http_requests_total{code="503",method="POST",route="/api/v2/reservations/{id}/grant"} 1`,
		"a grant is not retried")

	// Redis comes back during the retries of a patient call: it goes through.
	b.Redis.Stop()
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(200 * time.Millisecond)
		b.Redis.Restart()
	}()
	patient := newClient(t, b, "rome", client.WithRetries(20, 100*time.Millisecond))
	_, err = patient.Clusters(ctx)
	<-restarted
	require.NoError(t, err)
}

func scrape(t *testing.T, b *brokertest.Broker) string {
	t.Helper()
	resp, err := http.Get(b.Health + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(data)
}

func TestTLSRefused(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	other, err := certauthority.NewCA("other CA")
	require.NoError(t, err)

	t.Run("client certificate from another CA", func(t *testing.T) {
		pair, err := other.IssueClient("rome")
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, certauthority.WriteTLSDir(dir, pair, b.CA.CertPEM))
		c, err := client.New(b.URL, dir, client.WithRetries(3, 2*time.Second)) // a retry would wait >= 1s
		require.NoError(t, err)
		start := time.Now()
		_, err = c.Clusters(ctx)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "tls:")
		assert.False(t, client.IsRetryable(err), "a refused certificate is not retried: %v", err)
		assert.Less(t, time.Since(start), time.Second, "and was not retried")
	})
	t.Run("broker certificate from another CA", func(t *testing.T) {
		pair, err := b.CA.IssueClient("rome")
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, certauthority.WriteTLSDir(dir, pair, other.CertPEM))
		c, err := client.New(b.URL, dir, client.WithRetries(3, time.Second))
		require.NoError(t, err)
		_, err = c.Clusters(ctx)
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
		assert.False(t, client.IsRetryable(err))
	})
	t.Run("bad configuration", func(t *testing.T) {
		_, err := client.New(b.URL, t.TempDir())
		assert.ErrorContains(t, err, "tls.crt does not exist")
		_, err = client.New("http://"+strings.TrimPrefix(b.URL, "https://"), b.ClusterCertDir("rome"))
		assert.ErrorContains(t, err, "https://")
		dir := b.ClusterCertDir("rome")
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), []byte("garbage"), 0o600))
		_, err = client.New(b.URL, dir)
		assert.ErrorContains(t, err, "key pair")
	})
}

// TestKeyRotation replaces tls.crt and tls.key in the certificate directory,
// as cert-manager does on renewal, and shows that the client presents the new
// certificate on its next calls, although it holds a keep-alive connection
// made with the old one.
func TestKeyRotation(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	dir := b.ClusterCertDir("rome")
	c, err := client.New(b.URL, dir, client.WithCertCheckInterval(10*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	slow, err := client.New(b.URL, dir) // default interval: 30s
	require.NoError(t, err)
	t.Cleanup(slow.CloseIdleConnections)
	_, err = c.Clusters(ctx)
	require.NoError(t, err)
	first := c.Certificate().SerialNumber

	// The renewed certificate names another cluster, so that the broker's
	// answer shows which certificate the client presented.
	rotate := func(cn string) {
		pair, err := b.CA.IssueClient(cn)
		require.NoError(t, err)
		require.NoError(t, certauthority.WriteTLSDir(dir, pair, b.CA.CertPEM))
		time.Sleep(20 * time.Millisecond)
	}
	rotate("milan")
	_, err = c.Advertise(ctx, "milan", advertisement("4", "8Gi", "0.02"))
	require.NoError(t, err, "the broker sees the new certificate")
	assert.Equal(t, "milan", c.Identity())
	assert.NotEqual(t, first, c.Certificate().SerialNumber)
	assert.Equal(t, "rome", slow.Identity(), "checked at most every 30s")

	// A same-name renewal: a new serial, calls keep working.
	before := c.Certificate().SerialNumber
	rotate("milan")
	_, err = c.Clusters(ctx)
	require.NoError(t, err)
	assert.NotEqual(t, before, c.Certificate().SerialNumber)

	// A rotation seen half-written (a key that does not match) is ignored.
	serial := c.Certificate().SerialNumber
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), []byte("half-written"), 0o600))
	time.Sleep(20 * time.Millisecond)
	_, err = c.Advertise(ctx, "milan", advertisement("4", "8Gi", "0.02"))
	require.NoError(t, err, "the old pair stays in use")
	assert.Equal(t, serial, c.Certificate().SerialNumber)
}

// TestNewWithTLS uses a TLS configuration of the caller's.
func TestNewWithTLS(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	pair, err := b.CA.IssueClient("rome")
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	c, err := client.NewWithTLS(b.URL+"/", &tls.Config{RootCAs: b.CA.Pool(), Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	assert.Equal(t, "rome", c.Identity())
	clusters, err := c.Clusters(context.Background())
	require.NoError(t, err)
	assert.Empty(t, clusters)
	assert.NotNil(t, clusters, "an empty list, not null")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.Clusters(ctx)
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
	assert.False(t, client.IsRetryable(err))
}

// TestListsFollowPages: Reservations and Clusters read every page the
// broker answers, each reservation once, and stop on a broker that answers
// the same continue token again.
func TestListsFollowPages(t *testing.T) {
	pages := map[string]string{
		"":   `{"items":[{"id":"a","requester":"rome"},{"id":"b","requester":"rome"}],"continue":"t1"}`,
		"t1": `{"items":[],"continue":"t2"}`,
		"t2": `{"items":[{"id":"b","requester":"rome"},{"id":"b","requester":"milan"}]}`,
		"t3": `{"items":[],"continue":"t3"}`,
	}
	var queries []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, pages[r.URL.Query().Get("continue")])
	}))
	t.Cleanup(srv.Close)
	c, err := client.NewWithTLS(srv.URL, srv.Client().Transport.(*http.Transport).TLSClientConfig)
	require.NoError(t, err)
	list, err := c.Reservations(context.Background(), client.RoleProvider)
	require.NoError(t, err)
	var got []string
	for _, r := range list {
		got = append(got, r.Requester+"/"+r.ID)
	}
	assert.Equal(t, []string{"rome/a", "rome/b", "milan/b"}, got)
	assert.Equal(t, []string{"role=provider", "continue=t1&role=provider", "continue=t2&role=provider"}, queries)

	pages[""] = `{"items":[],"continue":"t3"}`
	_, err = c.Clusters(context.Background())
	assert.ErrorContains(t, err, "same continue token")
}

// TestBusyRetryAfter: a 503 Busy is retried after its Retry-After when that
// is short; one that asks for longer than a retry waits (10s) is returned
// at once, with its Retry-After, for the caller's back-off.
func TestBusyRetryAfter(t *testing.T) {
	retryAfter, attempts := "30", 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts++
		w.Header().Set("Retry-After", retryAfter)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":"this broker replica is busy storing advertisements","reason":"Busy"}`)
	}))
	t.Cleanup(srv.Close)
	c, err := client.NewWithTLS(srv.URL, srv.Client().Transport.(*http.Transport).TLSClientConfig, client.WithRetries(2, time.Millisecond))
	require.NoError(t, err)
	_, err = c.Advertise(context.Background(), "rome", api.Advertisement{})
	assert.True(t, client.IsBusy(err), "%v", err)
	ra, ok := client.RetryAfter(err)
	assert.True(t, ok)
	assert.Equal(t, 30*time.Second, ra)
	assert.Equal(t, 1, attempts, "a Retry-After past 10s is the caller's to wait")

	retryAfter, attempts = "0", 0
	_, err = c.Advertise(context.Background(), "rome", api.Advertisement{})
	assert.True(t, client.IsBusy(err), "%v", err)
	assert.Equal(t, 3, attempts, "a short Retry-After is retried here")
}
