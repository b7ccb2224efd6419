package server_test

// The broker under abuse: what a hostile or careless member
// cluster could do to the others through the HTTP layer, each on a real
// redis-server over real mutual TLS.

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestAbuseForeignReservationIsNotFound: asking for another requester's
// reservation answered 403 where an unknown id answered 404, so a member
// could learn which ids the others use. Now every call on a reservation the
// caller is not a party to gets the very answer of an id that does not exist.
func TestAbuseForeignReservationIsNotFound(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("secret-1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	before := b.Snapshot()

	grant := `{"endpoint":"https://x:6443","token":"t","namespace":"rb-rome","expiresAt":"2030-01-01T00:00:00Z"}`
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/v2/reservations/%s?requester=rome", ""},
		{http.MethodDelete, "/api/v2/reservations/%s?requester=rome", ""},
		{http.MethodPost, "/api/v2/reservations/%s/grant?requester=rome", grant},
	} {
		code, existing := b.Do("milan", c.method, fmt.Sprintf(c.path, "secret-1"), c.body)
		assert.Equal(t, http.StatusNotFound, code, "%s on rome's reservation as milan: %s", c.method, existing)
		code, unknown := b.Do("milan", c.method, fmt.Sprintf(c.path, "secret-2"), c.body)
		assert.Equal(t, http.StatusNotFound, code, "%s on an unknown id: %s", c.method, unknown)
		assert.Equal(t, string(unknown), strings.ReplaceAll(string(existing), "secret-1", "secret-2"),
			"%s: the answers differ only by the id asked for", c.method)
		assert.Equal(t, api.ReasonNotFound, brokertest.Decode[api.Error](t, existing).Reason)
	}
	assert.Equal(t, before, b.Snapshot(), "the refused calls changed nothing")

	// The provider and the requester still reach it.
	code, data = b.Do("paris", http.MethodGet, "/api/v2/reservations/secret-1?requester=rome", nil)
	assert.Equal(t, http.StatusOK, code, "%s", data)
	code, data = b.Do("rome", http.MethodGet, "/api/v2/reservations/secret-1", nil)
	assert.Equal(t, http.StatusOK, code, "%s", data)
}

// TestAbuseJSONIsStrict: bodies are decoded as the Kubernetes API server
// decodes them (sigs.k8s.io/json): a key given twice or in another case is
// refused with a 400 that names it, where encoding/json took the last value
// or matched the key case-insensitively, so that two readers of one body
// (a proxy, an audit log, the broker) could disagree about what it asked.
func TestAbuseJSONIsStrict(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{Limits: api.Limits{DefaultDuration: time.Hour, MaxDuration: 24 * time.Hour}})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	before := b.Snapshot()
	for _, c := range []struct{ name, method, path, body, mention string }{
		{"duplicate key", "POST", "/api/v2/reservations",
			`{"id":"d-1","resources":{"cpu":"1","memory":"1Gi"},"resources":{"cpu":"8","memory":"32Gi"}}`, `duplicate field "resources"`},
		{"duplicate nested key", "POST", "/api/v2/reservations",
			`{"id":"d-1","resources":{"cpu":"1","cpu":"7","memory":"1Gi"}}`, `duplicate field "resources.cpu"`},
		{"key in another case", "POST", "/api/v2/reservations",
			`{"ID":"d-1","resources":{"cpu":"1","memory":"1Gi"}}`, `unknown field "ID"`},
		{"nested key in another case", "POST", "/api/v2/reservations",
			`{"id":"d-1","resources":{"CPU":"1","memory":"1Gi"}}`, `unknown field "resources.CPU"`},
		{"duplicate id in a renewal", "POST", "/api/v2/renewals", `{"ids":["a"],"ids":["b"]}`, `duplicate field "ids"`},
		{"advertisement key in another case", "PUT", "/api/v2/clusters/paris/advertisement",
			`{"Resources":{"capacity":{"cpu":"8","memory":"32Gi"},"allocatable":{"cpu":"8","memory":"32Gi"},"allocated":{}}}`, `unknown field "Resources"`},
		{"v1 duplicate key", "POST", "/api/v1/reservations",
			`{"requestedResources":{"cpu":"1","memory":"1Gi"},"requestedResources":{"cpu":"2","memory":"1Gi"}}`, `duplicate field "requestedResources"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cn := "rome"
			if c.method == "PUT" {
				cn = "paris"
			}
			code, data := b.Do(cn, c.method, c.path, c.body)
			assert.Equal(t, http.StatusBadRequest, code, "%s", data)
			e := brokertest.Decode[api.Error](t, data)
			assert.Equal(t, api.ReasonBadRequest, e.Reason)
			assert.Contains(t, e.Error, c.mention, "the answer names the problem")
		})
	}
	assert.Equal(t, before, b.Snapshot(), "nothing refused reached Redis")
}

// TestAbuseInvalidSinceIsBadRequest: a since= (or Last-Event-ID) that looks
// like a stream id but is none Redis takes (a part beyond 64 bits) opened a
// stream, 200, that then ended in an error event from Redis. Now it is a 400
// before the stream starts, as any malformed id.
func TestAbuseInvalidSinceIsBadRequest(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	for _, since := range []string{"18446744073709551616", "1-18446744073709551616", "99999999999999999999-0", "1-", "-1", "1-2-3", "+1", "abc"} {
		for _, viaHeader := range []bool{false, true} {
			req, err := http.NewRequest(http.MethodGet, b.URL+"/api/v2/events?since="+url.QueryEscape(since), nil)
			require.NoError(t, err)
			if viaHeader {
				req.URL.RawQuery = ""
				req.Header.Set("Last-Event-ID", since)
			}
			resp, err := b.Client("rome").Do(req)
			require.NoError(t, err)
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "since %q (header %v): %s", since, viaHeader, data)
			assert.Contains(t, string(data), "not a stream id")
		}
	}
	for _, since := range []string{"0", "18446744073709551615-18446744073709551615", "1700000000000-0", "1700000000000"} {
		ch := openStream(t, b, "rome", "?since="+since, nil)
		select {
		case ev, ok := <-ch:
			assert.False(t, ok && ev.kind == "error", "since %q: %+v", since, ev)
		case <-time.After(time.Second): // open, no event: as it should be
		}
	}
}

// TestAbuseReadyzWhileRedisRefusesWrites: with Redis at maxmemory every
// reservation failed with 503 while /readyz said ready, so nothing took the
// replica out of its Service. Now /readyz fails whenever Redis refuses
// writes (out of memory, a read-only replica) or does not answer, and comes
// back when Redis does.
func TestAbuseReadyzWhileRedisRefusesWrites(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	ctx := context.Background()
	ready := func() (int, string) {
		resp, err := http.Get(b.Health + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	requireReady := func(why string) {
		t.Helper()
		require.Eventually(t, func() bool { code, _ := ready(); return code == http.StatusOK }, 10*time.Second, 50*time.Millisecond, why)
	}
	requireReady("at the start")

	// Out of memory: maxmemory below what Redis holds, no eviction.
	require.NoError(t, b.RDB.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, b.RDB.ConfigSet(ctx, "maxmemory", "1").Err())
	code, body := ready()
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, "OOM", "the answer says why")
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("oom-1", "1", "1Gi"))
	assert.Equal(t, http.StatusServiceUnavailable, code, "and reservations fail meanwhile: %s", data)
	require.NoError(t, b.RDB.ConfigSet(ctx, "maxmemory", "0").Err())
	requireReady("memory back")

	// A read-only replica (of a primary it never reaches: nothing is synced).
	require.NoError(t, b.RDB.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
	code, body = ready()
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, "READONLY")
	require.NoError(t, b.RDB.Do(ctx, "REPLICAOF", "NO", "ONE").Err())
	requireReady("a primary again")

	// Unreachable.
	b.Redis.Stop()
	code, body = ready()
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	b.Redis.Restart()
	requireReady("Redis back (its script cache empty: loaded again)")
	code, data = b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("after-1", "1", "1Gi"))
	assert.NotEqual(t, http.StatusServiceUnavailable, code, "%s", data)
}

// cloneReservations copies requester's reservation id n times in Redis
// (ids <id>-<i>), as live reservations of the same requester and provider:
// a member with n live reservations, without deciding each of them.
func cloneReservations(t testing.TB, b *brokertest.Broker, requester, provider, id string, n int) {
	t.Helper()
	ctx := context.Background()
	fields, err := b.RDB.HGetAll(ctx, "rb:{b}:resv:"+requester+"/"+id).Result()
	require.NoError(t, err)
	require.NotEmpty(t, fields)
	const chunk = 2000
	for start := 0; start < n; start += chunk {
		pipe := b.RDB.Pipeline()
		for i := start; i < min(start+chunk, n); i++ {
			qid := fmt.Sprintf("%s/%s-%d", requester, id, i)
			pipe.HSet(ctx, "rb:{b}:resv:"+qid, fields)
			pipe.SAdd(ctx, "rb:{b}:by-requester:"+requester, qid)
			pipe.SAdd(ctx, "rb:{b}:by-target:"+provider, qid)
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
	}
}

// TestAbuseListIsPaginated: GET /api/v2/reservations answered every live
// reservation of the caller at once (61,000: 28 MB; 8 such calls in
// parallel took the broker to 3.2 GB). Now a list is a page of at most
// limit items (api.MaxPageSize at most) with a continue token, and
// broker/client follows the tokens, so its callers still get everything.
func TestAbuseListIsPaginated(t *testing.T) {
	const live = 60_000
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "64", "256Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("bulk", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	cloneReservations(t, b, "rome", "paris", "bulk", live-1)

	// One call: one page, of the default size, whatever the caller holds.
	for _, role := range []string{"requester", "provider", ""} {
		cn := map[string]string{"requester": "rome", "provider": "paris", "": "rome"}[role]
		code, data = b.Do(cn, http.MethodGet, "/api/v2/reservations?role="+role, nil)
		require.Equal(t, http.StatusOK, code, "%.300s", data)
		page := brokertest.Decode[api.ReservationList](t, data)
		assert.LessOrEqual(t, len(page.Items), api.DefaultPageSize, "role %q", role)
		assert.NotEmpty(t, page.Items)
		assert.NotEmpty(t, page.Continue, "more to come")
		assert.Less(t, len(data), 1<<20, "role %q: a page is %d bytes", role, len(data))
	}
	code, data = b.Do("rome", http.MethodGet, fmt.Sprintf("/api/v2/reservations?role=requester&limit=%d", api.MaxPageSize), nil)
	require.Equal(t, http.StatusOK, code)
	assert.LessOrEqual(t, len(brokertest.Decode[api.ReservationList](t, data).Items), api.MaxPageSize)

	// broker/client follows the pages: every reservation, each once.
	ctx := context.Background()
	for _, c := range []struct{ cn, role string }{{"rome", client.RoleRequester}, {"paris", client.RoleProvider}} {
		cl, err := client.New(b.URL, b.ClusterCertDir(c.cn))
		require.NoError(t, err)
		all, err := cl.Reservations(ctx, c.role)
		require.NoError(t, err)
		ids := map[string]bool{}
		for _, r := range all {
			ids[r.Requester+"/"+r.ID] = true
		}
		assert.Len(t, all, live, "%s as %s", c.cn, c.role)
		assert.Len(t, ids, live, "each once")
		cl.CloseIdleConnections()
	}
}

// TestListPages pages through small lists (a page ending inside one Redis
// scan step, both roles' sets in one listing, clusters) and refuses a bad
// limit or token with a 400 that says which.
func TestListPages(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "64", "256Gi", "", "0.03", nil)
	b.Advertise("berlin", "64", "256Gi", "", "0.05", nil)
	for i := range 7 {
		code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation(fmt.Sprintf("r%d", i), "1", "1Gi"))
		require.Equal(t, http.StatusCreated, code, "%s", data)
	}
	code, data := b.Do("paris", http.MethodPost, "/api/v2/reservations", reservation("p0", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data) // on berlin: paris requests too
	providedByParis := 0
	for i := range 7 {
		code, data = b.Do("paris", http.MethodGet, fmt.Sprintf("/api/v2/reservations/r%d?requester=rome", i), nil)
		if code == http.StatusOK {
			providedByParis++
		}
	}

	list := func(cn, query string) (ids []string, pages int) {
		t.Helper()
		cont := ""
		for {
			code, data := b.Do(cn, http.MethodGet, "/api/v2/reservations?"+query+"&continue="+url.QueryEscape(cont), nil)
			require.Equal(t, http.StatusOK, code, "%s", data)
			page := brokertest.Decode[api.ReservationList](t, data)
			require.LessOrEqual(t, len(page.Items), 2)
			for _, r := range page.Items {
				ids = append(ids, r.Requester+"/"+r.ID)
			}
			pages++
			if cont = page.Continue; cont == "" {
				return ids, pages
			}
		}
	}
	ids, pages := list("rome", "role=requester&limit=2")
	assert.ElementsMatch(t, []string{"rome/r0", "rome/r1", "rome/r2", "rome/r3", "rome/r4", "rome/r5", "rome/r6"}, ids)
	assert.GreaterOrEqual(t, pages, 4)
	ids, _ = list("paris", "limit=2") // both roles: its request, then what it provides
	assert.Len(t, ids, 1+providedByParis)
	assert.Contains(t, ids, "paris/p0")

	var clusters []string
	for cont := ""; ; {
		code, data := b.Do("rome", http.MethodGet, "/api/v2/clusters?limit=1&continue="+url.QueryEscape(cont), nil)
		require.Equal(t, http.StatusOK, code, "%s", data)
		page := brokertest.Decode[api.ClusterList](t, data)
		require.Len(t, page.Items, 1)
		clusters = append(clusters, page.Items[0].ClusterID)
		if cont = page.Continue; cont == "" {
			break
		}
	}
	assert.Equal(t, []string{"berlin", "paris"}, clusters, "by id")

	code, data = b.Do("paris", http.MethodGet, "/api/v2/reservations?role=provider&limit=1", nil)
	require.Equal(t, http.StatusOK, code)
	providerToken := brokertest.Decode[api.ReservationList](t, data).Continue
	require.NotEmpty(t, providerToken)
	code, data = b.Do("rome", http.MethodGet, "/api/v2/clusters?limit=1", nil)
	require.Equal(t, http.StatusOK, code)
	clusterToken := brokertest.Decode[api.ClusterList](t, data).Continue
	code, data = b.Do("rome", http.MethodGet, "/api/v2/reservations?role=requester&limit=1", nil)
	require.Equal(t, http.StatusOK, code)
	requesterToken := brokertest.Decode[api.ReservationList](t, data).Continue
	require.NotEmpty(t, requesterToken)
	for _, c := range []struct{ query, mention string }{
		{"limit=0", "limit"}, {"limit=-1", "limit"}, {"limit=abc", "limit"}, {"limit=1001", "limit"}, {"limit=1e3", "limit"},
		{"continue=garbage!", "continue"}, {"continue=" + base64URL(`{"l":"reservations","s":7,"r":"requester"}`), "continue"},
		{"continue=" + base64URL(`{"l":"reservations","r":"requester","a":"Not_An_Id"}`), "continue"},
		{"continue=" + base64URL(`{"l":"reservations","r":"requester","x":1}`), "continue"},
		{"continue=" + strings.Repeat("A", 2000), "continue"},
		{"continue=" + clusterToken, "another list"},
		{"role=provider&continue=" + requesterToken, "role=requester"},
		{"role=requester&continue=" + providerToken, "continue"},
	} {
		path := "/api/v2/reservations?" + c.query
		if !strings.Contains(c.query, "role=") {
			path += "&role=requester"
		}
		code, data := b.Do("rome", http.MethodGet, path, nil)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", c.query, data)
		assert.Contains(t, brokertest.Decode[api.Error](t, data).Error, c.mention, c.query)
	}
	code, data = b.Do("rome", http.MethodGet, "/api/v2/clusters?continue="+requesterToken, nil)
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
	code, data = b.Do("rome", http.MethodGet, "/api/v2/clusters?limit=5000", nil)
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
}

func base64URL(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// openRawStreams opens n event streams as cn, at most 64 handshakes at a
// time (1,000 at once would outlast the broker's 5 s handshake timeout on a
// busy machine), counts the events of type kind they get (any: ""), and
// returns once all are open; they close when ctx ends.
func openRawStreams(t testing.TB, ctx context.Context, b *brokertest.Broker, cn string, n int, kind string, received *atomic.Int64) {
	t.Helper()
	tr := b.Client(cn).Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = n
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	var opened sync.WaitGroup
	var failed atomic.Int64
	handshakes := make(chan struct{}, 64)
	for range n {
		opened.Add(1)
		handshakes <- struct{}{}
		go func() {
			done := sync.OnceFunc(func() { <-handshakes; opened.Done() })
			defer done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.URL+"/api/v2/events", nil)
			resp, err := hc.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				failed.Add(1)
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				switch line := sc.Text(); {
				case strings.HasPrefix(line, ": cursor"):
					done()
				case kind == "" && strings.HasPrefix(line, "event: "), line == "event: "+kind:
					received.Add(1)
				}
			}
		}()
	}
	opened.Wait()
	require.Zero(t, failed.Load(), "streams that did not open")
}

// TestAbuseEventStreamsDoNotStarveOthers: every event stream held a Redis
// pool connection in its own blocking read, so a few hundred streams of one
// member took the whole pool and the other members' calls failed with 503
// "connection pool timeout". Now the replica's streams share one reader:
// 300 streams of one member hold about one connection, the others reserve
// as before, and each of the 300 still gets every event.
func TestAbuseEventStreamsDoNotStarveOthers(t *testing.T) {
	const streams = 300 // the test broker's Redis pool has 64 connections
	b := brokertest.Start(t, brokertest.Options{MaxStreamsPerCluster: -1})
	b.Advertise("paris", "1000", "4000Gi", "", "0.03", nil)
	var received atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	openRawStreams(t, ctx, b, "greedy", streams, "Reserved", &received)

	stats := b.Store.Client().PoolStats()
	assert.LessOrEqual(t, int(stats.TotalConns-stats.IdleConns), 3, "the streams hold no connection each: %+v", stats)
	for i := range 50 {
		start := time.Now()
		code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation(fmt.Sprintf("honest-%d", i), "1", "1Gi"))
		require.Equal(t, http.StatusCreated, code, "%s", data)
		assert.Less(t, time.Since(start), 2*time.Second)
	}
	code, data := b.Do("greedy", http.MethodPost, "/api/v2/reservations", reservation("mine", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	require.Eventually(t, func() bool { return received.Load() == streams }, 10*time.Second, 20*time.Millisecond,
		"each stream gets the event: %d of %d", received.Load(), streams)
	assert.Contains(t, scrape(t, b), fmt.Sprintf("rb_broker_event_streams %d", streams))
}

// TestAbuseEventStreamCap: a cluster may hold MaxStreamsPerCluster streams
// open on a replica; the next is answered 429 with Retry-After, and a
// stream closed frees its place. Other clusters are not counted with it.
func TestAbuseEventStreamCap(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{MaxStreamsPerCluster: 3})
	var received atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	openRawStreams(t, ctx, b, "greedy", 3, "Reserved", &received)

	open := func(cn string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, b.URL+"/api/v2/events", nil)
		require.NoError(t, err)
		resp, err := b.Client(cn).Do(req)
		require.NoError(t, err)
		return resp
	}
	resp := open("greedy")
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", data)
	assert.Equal(t, "5", resp.Header.Get("Retry-After"))
	e := brokertest.Decode[api.Error](t, data)
	assert.Equal(t, api.ReasonTooManyRequests, e.Reason)
	assert.Contains(t, e.Error, "3 event streams")

	rome := openStream(t, b, "rome", "", nil) // another cluster: its own count
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("r1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	assert.Equal(t, "Reserved", next(t, rome).kind)

	// broker/client says 429 is worth retrying, after Retry-After.
	c, err := client.New(b.URL, b.ClusterCertDir("greedy"))
	require.NoError(t, err)
	_, err = c.OpenEvents(context.Background(), "")
	assert.True(t, client.IsRetryable(err), "%v", err)
	var ae *client.APIError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, 5*time.Second, ae.RetryAfter)
}
