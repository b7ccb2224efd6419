package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestCellsEventStream: over a real three-primary Redis Cluster, a broker
// split into cells eu and us serves a requester of eu the events of its
// reservations in both cells on one stream: one kept in eu, and one asked of
// every cell that lives in us, its provider's cell. The stream's ids are
// cursors holding each cell's position, so a stream resumed from any of them
// gets exactly the later events of both cells.
func TestCellsEventStream(t *testing.T) {
	b := brokertest.StartCells(t, brokertest.Options{MaxStreamsPerCluster: 16}, // each stream below stays open to the end
		[]string{"eu", "us"}, store.CellRule{Label: "region", Default: "eu"})
	b.Advertise("eu-2", "8", "32Gi", "", "0.030", map[string]string{"region": "eu"})
	b.Advertise("us-1", "64", "256Gi", "", "0.010", map[string]string{"region": "us"})
	live := openStream(t, b, "eu-1", "", nil)

	do := func(cn, method, path string, body any, want int) {
		t.Helper()
		code, data := b.Do(cn, method, path, body)
		require.Equal(t, want, code, "%s %s: %s", method, path, data)
	}
	across := reservationLease("across", "2", "4Gi", "1m")
	across.Cells = api.CellsAll
	do("eu-1", http.MethodPost, "/api/v2/reservations", across, http.StatusCreated)
	do("eu-1", http.MethodPost, "/api/v2/reservations", reservationLease("home", "2", "4Gi", "1m"), http.StatusCreated)
	cell, err := b.Cells.Find(context.Background(), "eu-1", "across")
	require.NoError(t, err)
	require.Equal(t, "us", cell, "asked of every cell, it lives in its provider's")
	do("us-1", http.MethodPost, "/api/v2/reservations/across/grant?requester=eu-1", api.Grant{
		Endpoint: "https://us-1.example:6443", Token: "t", Namespace: "rb-eu-1", ExpiresAt: time.Now().Add(time.Hour)}, http.StatusOK)
	do("eu-1", http.MethodDelete, "/api/v2/reservations/home", nil, http.StatusOK)
	do("eu-1", http.MethodDelete, "/api/v2/reservations/across", nil, http.StatusOK)

	// Every event of both cells, each cell's in order.
	want := map[string][]string{"across": {"Reserved", "Granted", "Released"}, "home": {"Reserved", "Released"}}
	cursor := regexp.MustCompile(`^eu:[0-9]+-[0-9]+,us:[0-9]+-[0-9]+$`)
	documented := sincePattern(t)
	var seen []sseEvent
	for range 5 {
		ev := next(t, live)
		assert.Regexp(t, cursor, ev.id, "a cursor of both cells' positions")
		assert.Regexp(t, documented, ev.id, "as broker/api/openapi.yaml says")
		assert.Equal(t, "eu-1", ev.data.Requester)
		seen = append(seen, ev)
	}
	assert.Equal(t, want, byReservation(seen))
	assert.Equal(t, "us-1", byID(seen, "across").data.Provider)
	assert.Equal(t, "eu-2", byID(seen, "home").data.Provider)
	quiet(t, live, "no event twice")

	// Resumed from each id, a stream gets exactly the events after it, of
	// both cells (across cells their order may differ from the live one's).
	for i, from := range seen {
		resumed := openStream(t, b, "eu-1", "", http.Header{"Last-Event-ID": {from.id}})
		var got []sseEvent
		for range len(seen) - i - 1 {
			got = append(got, next(t, resumed))
		}
		assert.Equal(t, byReservation(seen[i+1:]), byReservation(got), "resumed after event %d", i)
		quiet(t, resumed, "resumed after event %d: nothing more", i)
	}

	// A stream id is the position in every cell: 0 replays both cells; a
	// cell the broker does not have is ignored, and those the cursor does
	// not name are read from their beginning.
	for _, since := range []string{"0", "asia:1-0"} {
		replay := openStream(t, b, "eu-1", "?since="+url.QueryEscape(since), nil)
		var got []sseEvent
		for range len(seen) {
			got = append(got, next(t, replay))
		}
		assert.Equal(t, want, byReservation(got), "since=%s", since)
		quiet(t, replay, "since=%s: nothing more", since)
	}

	// The last id resumes after everything: only what comes next.
	last := openStream(t, b, "eu-1", "?since="+url.QueryEscape(seen[len(seen)-1].id), nil)
	do("eu-1", http.MethodPost, "/api/v2/reservations", reservation("later", "1", "1Gi"), http.StatusCreated)
	ev := next(t, last)
	assert.Equal(t, "later", ev.data.Reservation)
	assert.Equal(t, "Reserved", ev.kind)

	for _, bad := range []string{"eu:1-0,us", "eu:x-1", "eu:1-0,eu:2-0", ":1-0", "eu:1-0,,us:2-0", "eu=1-0", "1-0-0"} {
		code, data := b.Do("eu-1", http.MethodGet, "/api/v2/events?since="+url.QueryEscape(bad), nil)
		assert.Equal(t, http.StatusBadRequest, code, "since=%s: %s", bad, data)
		assert.Contains(t, string(data), "is neither a stream id", "since=%s", bad)
	}
}

// byReservation is the types of events by reservation, each in order.
func byReservation(events []sseEvent) map[string][]string {
	out := map[string][]string{}
	for _, e := range events {
		out[e.data.Reservation] = append(out[e.data.Reservation], e.kind)
	}
	return out
}

// byID is the first event of reservation id.
func byID(events []sseEvent, id string) sseEvent {
	for _, e := range events {
		if e.data.Reservation == id {
			return e
		}
	}
	return sseEvent{}
}

// quiet fails if ch gets an event within a keep-alive round and more.
func quiet(t *testing.T, ch <-chan sseEvent, msg string, args ...any) {
	t.Helper()
	select {
	case ev := <-ch:
		t.Fatalf("%s: got %+v", fmt.Sprintf(msg, args...), ev)
	case <-time.After(700 * time.Millisecond):
	}
}

// sincePattern is the pattern broker/api/openapi.yaml gives since.
func sincePattern(t *testing.T) *regexp.Regexp {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI())
	require.NoError(t, err)
	param := doc.Paths.Find("/api/v2/events").Get.Parameters.GetByInAndName("query", "since")
	require.NotNil(t, param)
	return regexp.MustCompile(param.Schema.Value.Pattern)
}

// TestCellsEventStreamCap: a stream that follows every cell counts once
// against --max-streams-per-cluster, and closing it frees its place in every
// cell's reader.
func TestCellsEventStreamCap(t *testing.T) {
	b := brokertest.StartCells(t, brokertest.Options{MaxStreamsPerCluster: 1}, []string{"eu", "us"},
		store.CellRule{Label: "region", Default: "eu"})
	open := func() (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.URL+"/api/v2/events", nil)
		require.NoError(t, err)
		resp, err := b.Client("eu-1").Do(req)
		require.NoError(t, err)
		return resp, func() { cancel(); resp.Body.Close() }
	}
	first, closeFirst := open()
	require.Equal(t, http.StatusOK, first.StatusCode)
	second, closeSecond := open()
	assert.Equal(t, http.StatusTooManyRequests, second.StatusCode)
	assert.NotEmpty(t, second.Header.Get("Retry-After"))
	closeSecond()
	closeFirst()
	require.Eventually(t, func() bool {
		again, closeAgain := open()
		defer closeAgain()
		return again.StatusCode == http.StatusOK
	}, 5*time.Second, 50*time.Millisecond, "the closed stream's place is free in every cell")
}
