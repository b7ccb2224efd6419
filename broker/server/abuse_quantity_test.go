package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// The largest amount the scripts hold exactly (2^53-1, in millicores for
// cpu), and the first one above it (2^53+1: 2^53 itself is still a double,
// the next integer is not).
const (
	exactCPU      = "9007199254740991m"
	aboveExactCPU = "9007199254740993m"
	exactBytes    = "9007199254740991"
	aboveBytes    = "9007199254740992"
)

// TestAbuseQuantityAboveExactRange: an advertisement of 2^53+1 millicores
// was accepted (only amounts near the int64 limit were refused); the Lua
// scripts hold it as a double, 2^53, so one reservation later the cluster
// hash and the index disagreed in the last digits and the broker's own
// invariant check failed. Now every amount a client sends, wherever it
// enters, is refused at the API when the scripts could not hold it exactly:
// 400 naming the field, nothing written.
func TestAbuseQuantityAboveExactRange(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	before := b.Snapshot()

	resources := func(alloc string) string {
		return `"capacity":` + alloc + `,"allocatable":` + alloc + `,"allocated":{"cpu":"0","memory":"0"}`
	}
	const ok = `{"cpu":"8","memory":"32Gi"}`
	v2adv := func(res string) string { return `{"resources":{` + res + `}}` }
	node := func(name, alloc string) string {
		return `{"name":"` + name + `","allocatable":` + alloc + `,"allocated":{"cpu":"0","memory":"0"}}`
	}
	withNodes := func(nodes ...string) string {
		return v2adv(resources(ok) + `,"nodes":[` + strings.Join(nodes, ",") + `]`)
	}
	v1adv := func(alloc string) string {
		return `{"clusterID":"paris","clusterName":"paris","resources":{` + resources(alloc) +
			`,"available":` + alloc + `},"timestamp":"2026-01-01T00:00:00Z"}`
	}
	const v2a, v1a = "/api/v2/clusters/paris/advertisement", "/api/v1/advertisements"
	for _, c := range []struct {
		name, cn, method, path, body, want string
	}{
		{"v2 capacity cpu", "paris", "PUT", v2a,
			v2adv(resources(`{"cpu":"` + aboveExactCPU + `","memory":"32Gi"}`)),
			"resources.capacity.cpu: " + aboveExactCPU + " is above the largest amount the broker holds exactly (" + exactCPU + ")"},
		{"v2 allocatable cpu", "paris", "PUT", v2a,
			v2adv(`"capacity":` + ok + `,"allocatable":{"cpu":"` + aboveExactCPU + `","memory":"32Gi"},"allocated":{"cpu":"0","memory":"0"}`),
			"resources.allocatable.cpu: " + aboveExactCPU + " is above"},
		{"v2 allocated cpu", "paris", "PUT", v2a,
			v2adv(`"capacity":` + ok + `,"allocatable":` + ok + `,"allocated":{"cpu":"` + aboveExactCPU + `","memory":"0"}`),
			"resources.allocated.cpu: " + aboveExactCPU + " is above"},
		{"v2 memory in bytes", "paris", "PUT", v2a,
			v2adv(resources(`{"cpu":"8","memory":"` + aboveBytes + `"}`)),
			"resources.capacity.memory: " + aboveBytes + " is above the largest amount the broker holds exactly (" + exactBytes + ")"},
		{"v2 memory with a suffix", "paris", "PUT", v2a,
			v2adv(resources(`{"cpu":"8","memory":"8Pi"}`)), "resources.capacity.memory: 8Pi is above"},
		{"v2 gpu", "paris", "PUT", v2a,
			v2adv(resources(`{"cpu":"8","memory":"32Gi","gpu":"` + aboveBytes + `"}`)), "resources.capacity.gpu: " + aboveBytes + " is above"},
		{"v2 storage", "paris", "PUT", v2a,
			v2adv(resources(`{"cpu":"8","memory":"32Gi","storage":"` + aboveBytes + `"}`)), "resources.capacity.storage: " + aboveBytes + " is above"},
		{"a node's allocatable", "paris", "PUT", v2a,
			withNodes(node("n0", ok), node("n1", ok), node("n2", `{"cpu":"`+aboveExactCPU+`","memory":"1Gi"}`)),
			"resources.nodes[2].allocatable.cpu: " + aboveExactCPU + " is above the largest amount the broker holds exactly (" + exactCPU + ")"},
		{"a node's allocated", "paris", "PUT", v2a,
			withNodes(`{"name":"n0","allocatable":` + ok + `,"allocated":{"cpu":"0","memory":"` + aboveBytes + `"}}`),
			"resources.nodes[0].allocated.memory: " + aboveBytes + " is above"},
		{"v1 advertisement", "paris", "POST", v1a,
			v1adv(`{"cpu":"` + aboveExactCPU + `","memory":"32Gi"}`), "resources.capacity.cpu: " + aboveExactCPU + " is above"},
		{"v2 reservation", "rome", "POST", "/api/v2/reservations",
			`{"id":"big-1","resources":{"cpu":"` + aboveExactCPU + `","memory":"1Gi"}}`, "resources.cpu: " + aboveExactCPU + " is above"},
		{"v2 reservation storage", "rome", "POST", "/api/v2/reservations",
			`{"id":"big-1","resources":{"cpu":"1","memory":"1Gi","storage":"` + aboveBytes + `"}}`, "resources.storage: " + aboveBytes + " is above"},
		{"v1 reservation", "rome", "POST", "/api/v1/reservations",
			`{"requestedResources":{"cpu":"1","memory":"` + aboveBytes + `"}}`, "requestedResources.memory: " + aboveBytes + " is above"},
		{"a group member", "rome", "POST", "/api/v2/groups",
			`{"group":"g","minMember":1,"members":[{"id":"m-0","resources":{"cpu":"1","memory":"1Gi"}},` +
				`{"id":"m-1","resources":{"cpu":"1","memory":"1Gi","gpu":"` + aboveBytes + `"}}]}`,
			"members[m-1].resources.gpu: " + aboveBytes + " is above"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, data := b.Do(c.cn, c.method, c.path, c.body)
			require.Equal(t, http.StatusBadRequest, code, "%s", data)
			e := brokertest.Decode[api.Error](t, data)
			assert.Equal(t, api.ReasonBadRequest, e.Reason)
			assert.Contains(t, e.Error, c.want, "the answer names the field and the bound")
		})
	}
	assert.Equal(t, before, b.Snapshot(), "nothing refused reached Redis")

	// A normal advertisement and reservation afterwards: the state is sound.
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("normal-1", "2", "4Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// TestQuantityAtExactRangeIsAccepted: 2^53-1, the largest amount the scripts
// hold exactly, is accepted everywhere (there is no policy by default), and
// a reservation of all of it leaves the broker's accounting exact.
func TestQuantityAtExactRangeIsAccepted(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	most := `{"cpu":"` + exactCPU + `","memory":"` + exactBytes + `","gpu":"` + exactBytes + `","storage":"` + exactBytes + `"}`
	body := `{"resources":{"capacity":` + most + `,"allocatable":` + most + `,"allocated":{"cpu":"0","memory":"0"},` +
		`"nodes":[{"name":"n0","allocatable":` + most + `,"allocated":{"cpu":"0","memory":"0"}}]}}`
	code, data := b.Do("paris", http.MethodPut, "/api/v2/clusters/paris/advertisement", body)
	require.Equal(t, http.StatusOK, code, "%s", data)

	code, data = b.Do("rome", http.MethodPost, "/api/v2/reservations",
		`{"id":"all-of-it","resources":`+most+`}`)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	r := brokertest.Decode[api.Reservation](t, data)
	assert.Equal(t, "paris", r.Provider)
	assert.Equal(t, "n0", r.Node)
	assert.Equal(t, exactCPU, r.Resources.CPU.String())
	require.NoError(t, b.Store.CheckInvariant(ctx))

	c, err := b.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(1<<53-1), c.Reserved.CPU, "reserved to the last millicore")
	assert.Zero(t, c.Free().CPU)
	assert.Zero(t, c.Free().Memory)
}

// TestAbusePriceBeyondWhatScriptsWrite: a request's price per hour is
// computed in the scripts (amounts times the provider's rates) and written
// with Lua's 14 significant digits: from 10^14 micro-units on it came out as
// "1e+14", so the reservation was stored but every read of it (its
// requester's GET and list, the provider's, the invariant check) failed with
// 503 for as long as it lived. A member advertising an absurd rate could
// make every reservation placed on it unreadable. Now the written price
// saturates at 10^14-1 micro-units and the reservation reads as any other.
func TestAbusePriceBeyondWhatScriptsWrite(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "2000", "64Gi", "", "100000", nil) // 10^11 micro-units per core-hour
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("dear-1", "1000", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	const ceiling = 1e14 - 1
	r := brokertest.Decode[api.Reservation](t, data)
	assert.Equal(t, int64(ceiling), r.Price)
	require.Len(t, r.Candidates, 1)
	assert.Equal(t, int64(ceiling), r.Candidates[0].Price)

	for _, c := range []struct{ cn, path string }{
		{"rome", "/api/v2/reservations/dear-1"},
		{"paris", "/api/v2/reservations/dear-1?requester=rome"},
		{"rome", "/api/v2/reservations"},
		{"paris", "/api/v2/reservations?role=provider"},
	} {
		code, data := b.Do(c.cn, http.MethodGet, c.path, nil)
		assert.Equal(t, http.StatusOK, code, "%s %s: %s", c.cn, c.path, data)
		assert.Contains(t, string(data), `"pricePerHourMicros":99999999999999`, "%s %s", c.cn, c.path)
	}
	require.NoError(t, b.Store.CheckInvariant(ctx))
}
