package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestGrantSharedAccess: a provider grants two reservations of one requester
// the same access with placements of their own. Redis holds the access once;
// the requester reads each grant whole (its GET and its list), the provider
// reads none, and another member cannot read the reservation at all.
func TestGrantSharedAccess(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	access := api.Grant{Endpoint: "https://paris:6443", CABundle: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
		Token: "the-tenant-token-of-rome-at-paris", Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)}
	want := map[string]api.Grant{}
	for _, id := range []string{"s1", "s2"} {
		code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation(id, "1", "1Gi"))
		require.Equal(t, http.StatusCreated, code, "%s", data)
		g := access
		g.Placement = &api.Placement{Node: "node-" + id, PriorityClassName: "rb-hold"}
		code, data = b.Do("paris", http.MethodPost, "/api/v2/reservations/"+id+"/grant?requester=rome", g)
		require.Equal(t, http.StatusOK, code, "%s", data)
		assert.Nil(t, brokertest.Decode[api.Reservation](t, data).Grant, "the provider's answer does not echo the token")
		want[id] = g
	}
	pair := b.Store.Key("grant:paris:rome")
	assert.Equal(t, "2", b.RDB.HGet(context.Background(), pair, "n").Val(), "one access in Redis, two shares")

	for id, g := range want {
		code, data := b.Do("rome", http.MethodGet, "/api/v2/reservations/"+id, nil)
		require.Equal(t, http.StatusOK, code, "%s", data)
		r := brokertest.Decode[api.Reservation](t, data)
		require.NotNil(t, r.Grant, "the requester reads its grant")
		assert.Equal(t, g, *r.Grant, "the pair's access with the reservation's own placement")

		code, data = b.Do("paris", http.MethodGet, "/api/v2/reservations/"+id+"?requester=rome", nil)
		require.Equal(t, http.StatusOK, code, "%s", data)
		assert.Nil(t, brokertest.Decode[api.Reservation](t, data).Grant, "the provider reads no grant")
		code, _ = b.Do("lyon", http.MethodGet, "/api/v2/reservations/"+id+"?requester=rome", nil)
		assert.Equal(t, http.StatusNotFound, code, "another member reads nothing")
	}
	code, data := b.Do("rome", http.MethodGet, "/api/v2/reservations", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	list := brokertest.Decode[api.ReservationList](t, data)
	require.Len(t, list.Items, 2)
	for _, r := range list.Items {
		require.NotNil(t, r.Grant, "listed: %s", r.ID)
		assert.Equal(t, want[r.ID], *r.Grant)
	}
	code, data = b.Do("paris", http.MethodGet, "/api/v2/reservations?role=provider", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	provided := brokertest.Decode[api.ReservationList](t, data).Items
	require.Len(t, provided, 2)
	for _, r := range provided {
		assert.Nil(t, r.Grant, "the provider's list shows no grant: %s", r.ID)
	}
	code, data = b.Do("lyon", http.MethodGet, "/api/v2/reservations?role=provider", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Empty(t, brokertest.Decode[api.ReservationList](t, data).Items, "another member lists none")

	for id := range want {
		code, _ = b.Do("rome", http.MethodDelete, "/api/v2/reservations/"+id, nil)
		require.Equal(t, http.StatusOK, code)
	}
	assert.Zero(t, b.RDB.Exists(context.Background(), pair).Val(), "the access goes with the last reservation")
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}
