package server_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

func groupOf(name string, n, minMember int, cpu string) api.GroupRequest {
	g := api.GroupRequest{Group: name, MinMember: minMember, Lease: "2m"}
	for i := range n {
		g.Members = append(g.Members, api.GroupMember{ID: fmt.Sprintf("m%d", i), Resources: brokertest.Quantities(cpu, "1Gi", "")})
	}
	return g
}

// TestGroupAPI: POST /api/v2/groups over mTLS. A group of 8 with room for
// 6 is refused with 409 NoCapacity, saying so, and reserves nothing; with
// room it gets 201 and 8 reservations naming the group, which the provider
// sees and the requester releases one by one; the same request again is a
// 200 replay; bad input is a 400 that says what is wrong.
func TestGroupAPI(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "6", "64Gi", "", "0.03", nil)

	req := groupOf("default/train", 8, 8, "1")
	code, data := b.Do("rome", http.MethodPost, "/api/v2/groups", req)
	require.Equal(t, http.StatusConflict, code, "%s", data)
	e := brokertest.Decode[api.Error](t, data)
	assert.Equal(t, api.ReasonNoCapacity, e.Reason)
	assert.Contains(t, e.Error, "room for 6 of the 8 members together, 8 needed")
	assert.Equal(t, int64(6), e.Rejected["placeable"])
	code, data = b.Do("rome", http.MethodGet, "/api/v2/reservations?role=requester", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Empty(t, brokertest.Decode[api.ReservationList](t, data).Items, "nothing reserved")

	b.Advertise("berlin", "4", "64Gi", "", "0.05", nil)
	code, data = b.Do("rome", http.MethodPost, "/api/v2/groups", req)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	g := brokertest.Decode[api.Group](t, data)
	require.Len(t, g.Reservations, 8)
	providers := map[string]int{}
	for i, r := range g.Reservations {
		assert.Equal(t, fmt.Sprintf("m%d", i), r.ID)
		assert.Equal(t, "default/train", r.Group)
		assert.Equal(t, "2m0s", r.Lease)
		providers[r.Provider]++
	}
	assert.Equal(t, map[string]int{"paris": 6, "berlin": 2}, providers)

	code, data = b.Do("rome", http.MethodPost, "/api/v2/groups", req)
	require.Equal(t, http.StatusOK, code, "replay: %s", data)
	assert.Len(t, brokertest.Decode[api.Group](t, data).Reservations, 8)

	code, data = b.Do("berlin", http.MethodGet, "/api/v2/reservations/m7?requester=rome", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, "default/train", brokertest.Decode[api.Reservation](t, data).Group)
	code, data = b.Do("rome", http.MethodDelete, "/api/v2/reservations/m0", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	require.NoError(t, b.Store.CheckInvariant(context.Background()))

	for _, tc := range []struct {
		req  api.GroupRequest
		want string
	}{
		{groupOf("", 2, 2, "1"), "group: required"},
		{groupOf("g", 2, 3, "1"), "minMember: 3 must be between 1 and the 2 members"},
		{groupOf("g", 0, 0, "1"), "members: 1 to 256, not 0"},
		{groupOf("g", 2, 2, "0"), "members[m0].resources.cpu: required and must be positive"},
	} {
		code, data := b.Do("rome", http.MethodPost, "/api/v2/groups", tc.req)
		assert.Equal(t, http.StatusBadRequest, code, "%s", data)
		assert.Contains(t, string(data), tc.want)
	}
}

// TestSpreadAPI: POST /api/v2/reservations with a spread over zones: the
// replicas alternate between the zones, each naming its spread group; a bad
// whenUnsatisfiable is a 400 that says so.
func TestSpreadAPI(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", map[string]string{"topology.kubernetes.io/zone": "a"})
	b.Advertise("berlin", "8", "64Gi", "", "0.05", map[string]string{"topology.kubernetes.io/zone": "b"})
	sp := &api.Spread{Group: "shop/app=web", TopologyKey: "topology.kubernetes.io/zone", MaxSkew: 1}
	providers := map[string]int{}
	for i := range 4 {
		req := reservation(fmt.Sprintf("web-%d", i), "1", "1Gi")
		req.Spread = sp
		code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", req)
		require.Equal(t, http.StatusCreated, code, "%s", data)
		r := brokertest.Decode[api.Reservation](t, data)
		assert.Equal(t, "shop/app=web", r.SpreadGroup)
		providers[r.Provider]++
	}
	assert.Equal(t, map[string]int{"paris": 2, "berlin": 2}, providers)
	require.NoError(t, b.Store.CheckInvariant(context.Background()))

	req := reservation("web-9", "1", "1Gi")
	req.Spread = &api.Spread{Group: "g", TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: "Sometimes"}
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", req)
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
	assert.Contains(t, string(data), `spread.whenUnsatisfiable: \"Sometimes\", not DoNotSchedule or ScheduleAnyway`)
}

// TestProtectionsAPI: PUT /api/v2/protections replaces the caller's report;
// bad ids are a 400.
func TestProtectionsAPI(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	code, data := b.Do("rome", http.MethodPut, "/api/v2/protections", api.ProtectRequest{IDs: []string{"a", "b"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, int64(2), brokertest.Decode[api.ProtectResponse](t, data).Protected)
	code, data = b.Do("rome", http.MethodPut, "/api/v2/protections", api.ProtectRequest{IDs: []string{"Not An Id"}})
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
	assert.Contains(t, string(data), "ids[0]")
	code, data = b.Do("rome", http.MethodPut, "/api/v2/protections", api.ProtectRequest{})
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Zero(t, brokertest.Decode[api.ProtectResponse](t, data).Protected)
}
