package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestSameIDTwoRequesters: over the API, two requesters use one id and get
// two reservations; each addresses its own bare, the provider addresses
// each with ?requester=, and nobody reaches the other's.
func TestSameIDTwoRequesters(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	for _, cn := range []string{"rome", "milan"} {
		code, data := b.Do(cn, http.MethodPost, "/api/v2/reservations", reservationLease("pod-1", "1", "1Gi", "1m"))
		require.Equal(t, http.StatusCreated, code, "%s: %s", cn, data)
		r := brokertest.Decode[api.Reservation](t, data)
		assert.Equal(t, cn, r.Requester)
		assert.Equal(t, "pod-1", r.ID)
	}
	code, data := b.Do("paris", http.MethodGet, "/api/v2/reservations?role=provider", nil)
	require.Equal(t, http.StatusOK, code)
	list := brokertest.Decode[api.ReservationList](t, data).Items
	require.Len(t, list, 2)
	assert.Equal(t, "pod-1", list[0].ID)
	assert.Equal(t, "pod-1", list[1].ID)
	assert.ElementsMatch(t, []string{"rome", "milan"}, []string{list[0].Requester, list[1].Requester})

	// rome releases its pod-1: milan's stays.
	code, data = b.Do("rome", http.MethodDelete, "/api/v2/reservations/pod-1", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	code, data = b.Do("milan", http.MethodGet, "/api/v2/reservations/pod-1", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "Reserved", brokertest.Decode[api.Reservation](t, data).Phase)
	code, data = b.Do("paris", http.MethodGet, "/api/v2/reservations/pod-1?requester=rome", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "Released", brokertest.Decode[api.Reservation](t, data).Phase)
	assert.Zero(t, brokertest.Decode[api.Reservation](t, data).RemainingMs, "ended: nothing remains")

	// milan cannot touch rome's (it tries as if it were the provider).
	before := b.Snapshot()
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/v2/reservations/pod-1?requester=rome", ""},
		{http.MethodDelete, "/api/v2/reservations/pod-1?requester=rome", ""},
		{http.MethodPost, "/api/v2/reservations/pod-1/grant?requester=rome",
			`{"endpoint":"https://x","token":"t","namespace":"rb-rome","expiresAt":"2030-01-01T00:00:00Z"}`},
	} {
		code, data := b.Do("milan", c.method, c.path, c.body)
		assert.Equal(t, http.StatusNotFound, code, "%s %s: %s", c.method, c.path, data)
	}
	assert.Equal(t, before, b.Snapshot(), "refused calls changed nothing")
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}

// TestRenewals: POST /api/v2/renewals renews the caller's leases and refuses
// the rest (other requester's, ended, fixed, v1, unknown) without changing
// them; the hold time is the lease when no duration is asked for; the
// metrics count renewals by outcome and batch sizes.
func TestRenewals(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	reserve := func(cn string, req api.ReservationRequest) api.Reservation {
		t.Helper()
		code, data := b.Do(cn, http.MethodPost, "/api/v2/reservations", req)
		require.Equal(t, http.StatusCreated, code, "%s", data)
		return brokertest.Decode[api.Reservation](t, data)
	}
	l := reserve("rome", reservationLease("lease", "1", "1Gi", "1m"))
	assert.Equal(t, "1m0s", l.Lease)
	assert.InDelta(t, time.Minute.Milliseconds(), l.RemainingMs, 50, "the hold time is the lease when no duration is asked")
	hold := reservationLease("held", "1", "1Gi", "1m")
	hold.Duration = "5s"
	h := reserve("rome", hold)
	assert.InDelta(t, 5000, h.RemainingMs, 50, "hold time 5s")
	fixed := reserve("rome", reservation("fixed", "1", "1Gi"))
	assert.Empty(t, fixed.Lease)
	reserve("rome", reservationLease("gone", "1", "1Gi", "1m"))
	code, _ := b.Do("rome", http.MethodDelete, "/api/v2/reservations/gone", nil)
	require.Equal(t, http.StatusOK, code)
	reserve("milan", reservationLease("milans", "1", "1Gi", "1m"))
	code, data := b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"1","memory":"1Gi"}}`)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	v1 := brokertest.Decode[api.V1Reservation](t, data)

	heldBefore, err := b.Store.Reservation(ctx, "rome", "held")
	require.NoError(t, err)
	protected := map[string]string{}
	for _, qid := range []string{"rome/fixed", "rome/gone", "milan/milans", "rome/" + v1.ID, "rome/lease"} {
		protected[qid] = b.Snapshot()["rb:{b}:resv:"+qid]
	}

	ids := []string{"held", "fixed", "gone", "milans", v1.ID, "nope"}
	code, data = b.Do("rome", http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: ids})
	require.Equal(t, http.StatusOK, code, "%s", data)
	resp := brokertest.Decode[api.RenewResponse](t, data)
	require.Len(t, resp.Renewed, 1)
	assert.Equal(t, "held", resp.Renewed[0].ID)
	assert.InDelta(t, time.Minute.Milliseconds(), resp.Renewed[0].RemainingMs, 50, "renewed to broker-now + lease")
	reasons := map[string]string{}
	for _, r := range resp.Refused {
		reasons[r.ID] = r.Reason
		assert.NotEmpty(t, r.Error, r.ID)
	}
	assert.Equal(t, map[string]string{"fixed": api.RenewNotALease, "gone": api.RenewEnded, "milans": api.RenewNotFound,
		v1.ID: api.RenewNotALease, "nope": api.RenewNotFound}, reasons, "seed v1 reservations keep their fixed duration")

	heldAfter, err := b.Store.Reservation(ctx, "rome", "held")
	require.NoError(t, err)
	assert.Greater(t, heldAfter.ExpiresAt.Sub(heldBefore.ExpiresAt), 50*time.Second, "held extended in its hash")
	score, err := b.RDB.ZScore(ctx, b.Store.Key("expiry"), "rome/held").Result()
	require.NoError(t, err)
	assert.Equal(t, heldAfter.ExpiresAt.UnixMilli(), int64(score), "and in the expiry zset")
	after := b.Snapshot()
	for qid, v := range protected {
		assert.Equal(t, v, after["rb:{b}:resv:"+qid], "%s unchanged", qid)
	}

	// An empty renewal is answered, and changes nothing.
	code, data = b.Do("rome", http.MethodPost, "/api/v2/renewals", `{"ids":[]}`)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Empty(t, brokertest.Decode[api.RenewResponse](t, data).Renewed)

	// A full batch of api.MaxRenewBatch long ids fits the body bound.
	long := make([]string, api.MaxRenewBatch)
	for i := range long {
		long[i] = strings.Repeat("x", 240) + strings.Repeat("y", i%10)
	}
	long[0] = "held"
	code, data = b.Do("rome", http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: long})
	require.Equal(t, http.StatusOK, code, "%.300s", data)
	assert.Len(t, brokertest.Decode[api.RenewResponse](t, data).Renewed, 1)

	// Its provider renewing for rome, which renews itself: not needed.
	code, data = b.Do(heldAfter.Target, http.MethodPost, "/api/v2/renewals?requester=rome", api.RenewRequest{IDs: []string{"held"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	vouched := brokertest.Decode[api.RenewResponse](t, data)
	assert.Empty(t, vouched.Renewed)
	require.Len(t, vouched.Refused, 1)
	assert.Equal(t, api.RenewRequesterRenews, vouched.Refused[0].Reason)
	assert.Contains(t, vouched.Refused[0].Error, "rome renews its leases itself")

	// Which requesters need its renewal: rome renews itself, milan has not
	// renewed but reserved its lease just now (a reservation vouches for its
	// lease as a renewal does), oslo holds nothing here. Once milan's call is
	// older than a third of its lease, it is quiet. Bad input is a 400.
	code, data = b.Do(heldAfter.Target, http.MethodPost, "/api/v2/renewals/quiet", api.QuietRequest{Requesters: []string{"milan", "rome", "oslo"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, []string{"oslo"}, brokertest.Decode[api.QuietResponse](t, data).Quiet)
	require.NoError(t, b.RDB.HSet(ctx, b.Store.Key("renewal:", "milan"), "called_ms", 0).Err())
	code, data = b.Do(heldAfter.Target, http.MethodPost, "/api/v2/renewals/quiet", api.QuietRequest{Requesters: []string{"milan", "rome", "oslo"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, []string{"milan", "oslo"}, brokertest.Decode[api.QuietResponse](t, data).Quiet)
	code, data = b.Do(heldAfter.Target, http.MethodPost, "/api/v2/renewals/quiet", api.QuietRequest{Requesters: []string{"rome", "Not_A/Name"}})
	require.Equal(t, http.StatusBadRequest, code, "%s", data)
	assert.Contains(t, string(data), "requesters[1]")
	code, data = b.Do(heldAfter.Target, http.MethodPost, "/api/v2/renewals/quiet", api.QuietRequest{Requesters: make([]string, api.MaxQuietRequesters+1)})
	require.Equal(t, http.StatusBadRequest, code, "%s", data)
	assert.Contains(t, string(data), "at most 5000")

	metrics := scrape(t, b)
	for _, want := range []string{
		`rb_broker_renewals_total{outcome="by_requester"} 1`,
		`rb_broker_renewals_total{outcome="renewed"} 2`,
		`rb_broker_renewals_total{outcome="not_found"} 5001`,
		`rb_broker_renewals_total{outcome="ended"} 1`,
		`rb_broker_renewals_total{outcome="not_a_lease"} 2`,
		`rb_broker_renewal_batch_size_count 4`,
	} {
		assert.Contains(t, metrics, want)
	}
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// TestLeaseLapses: a lease nobody renews ends at its hold time (the broker's
// expiry timer), with an Expired event that carries remainingMs 0, and a
// renewal then is refused; a renewed one lives on.
func TestLeaseLapses(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	events := openStream(t, b, "rome", "", nil)
	for _, id := range []string{"lapses", "renewed"} {
		req := reservationLease(id, "1", "1Gi", "2s")
		req.Duration = "400ms"
		code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", req)
		require.Equal(t, http.StatusCreated, code, "%s", data)
		ev := next(t, events)
		assert.Equal(t, "Reserved", ev.kind)
		assert.InDelta(t, 400, ev.data.RemainingMs, 50, "the event carries the time left (broker clock)")
	}
	code, data := b.Do("rome", http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: []string{"renewed"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	ev := next(t, events)
	assert.Equal(t, "Expired", ev.kind, "the unrenewed lease ends at its hold time")
	assert.Equal(t, "lapses", ev.data.Reservation)
	assert.Zero(t, ev.data.RemainingMs)
	code, data = b.Do("rome", http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: []string{"lapses", "renewed"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	resp := brokertest.Decode[api.RenewResponse](t, data)
	require.Len(t, resp.Refused, 1)
	assert.Equal(t, api.RefusedRenewal{ID: "lapses", Reason: api.RenewEnded, Error: resp.Refused[0].Error}, resp.Refused[0])
	require.Len(t, resp.Renewed, 1)
	r, err := b.Store.Reservation(context.Background(), "rome", "renewed")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseReserved, r.Phase)
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

// TestRenewalSetBoundUnderTheBatch: a renewal of a full batch may be one of
// several calls of its requester, so it is renewed id by id, not as the
// requester's renewal set (store.RenewalSetMaxIDs).
func TestRenewalSetBoundUnderTheBatch(t *testing.T) {
	assert.Less(t, store.RenewalSetMaxIDs, api.MaxRenewBatch)
}
