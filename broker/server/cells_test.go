package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestCellsOverRedisCluster: a broker split into two cells, eu and us, by
// the label region, over a real three-primary Redis Cluster, with real
// mutual TLS. Each member reserves in its own cell; asked of every cell, a
// reservation goes to the best provider of both, in that provider's cell,
// and its requester reads, lists, renews and releases it as any other.
func TestCellsOverRedisCluster(t *testing.T) {
	ctx := context.Background()
	b := brokertest.StartCells(t, brokertest.Options{}, []string{"eu", "us"}, store.CellRule{Label: "region", Default: "eu"})

	// us's providers are larger and cheaper: the best of both cells.
	b.Advertise("eu-1", "8", "32Gi", "", "0.030", map[string]string{"region": "eu"})
	b.Advertise("eu-2", "8", "32Gi", "", "0.030", map[string]string{"region": "eu"})
	b.Advertise("us-1", "64", "256Gi", "", "0.010", map[string]string{"region": "us"})
	b.Advertise("us-2", "64", "256Gi", "", "0.010", map[string]string{"region": "us"})
	for id, cell := range map[string]string{"eu-1": "eu", "eu-2": "eu", "us-1": "us", "us-2": "us"} {
		_, err := b.Cells.Cell(cell).Cluster(ctx, id)
		require.NoError(t, err, "%s advertised in cell %s", id, cell)
	}

	reserve := func(requester string, req api.ReservationRequest) api.Reservation {
		t.Helper()
		code, data := b.Do(requester, http.MethodPost, "/api/v2/reservations", req)
		require.Equal(t, http.StatusCreated, code, "%s", data)
		return brokertest.Decode[api.Reservation](t, data)
	}
	cellOf := func(requester, id string) string {
		t.Helper()
		cell, err := b.Cells.Find(ctx, requester, id)
		require.NoError(t, err)
		return cell
	}

	// In the requester's cell: eu-1 is placed on eu-2 however much better us is.
	inEU := reserve("eu-1", reservationLease("home", "2", "4Gi", "1m"))
	assert.Equal(t, "eu-2", inEU.Provider)
	assert.Equal(t, "eu", cellOf("eu-1", "home"))
	inUS := reserve("us-1", reservation("home", "2", "4Gi"))
	assert.Equal(t, "us-2", inUS.Provider)
	assert.Equal(t, "us", cellOf("us-1", "home"))

	// Across cells: the best of both, in its provider's cell.
	across := reservationLease("across", "2", "4Gi", "1m")
	across.Cells = api.CellsAll
	far := reserve("eu-1", across)
	assert.Contains(t, []string{"us-1", "us-2"}, far.Provider)
	assert.Equal(t, "us", cellOf("eu-1", "across"))
	// A replay finds it there, and is not decided again anywhere.
	code, data := b.Do("eu-1", http.MethodPost, "/api/v2/reservations", across)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, far.Provider, brokertest.Decode[api.Reservation](t, data).Provider)
	// Only "all" is a choice of cells.
	bad := reservation("bad", "1", "1Gi")
	bad.Cells = "us"
	code, data = b.Do("eu-1", http.MethodPost, "/api/v2/reservations", bad)
	require.Equal(t, http.StatusBadRequest, code, "%s", data)

	// Its requester reads it, its provider too (its cell is its own).
	code, data = b.Do("eu-1", http.MethodGet, "/api/v2/reservations/across", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	code, data = b.Do(far.Provider, http.MethodGet, "/api/v2/reservations/across?requester=eu-1", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	code, _ = b.Do("eu-2", http.MethodGet, "/api/v2/reservations/across?requester=eu-1", nil)
	require.Equal(t, http.StatusNotFound, code, "no party to it")

	// eu-1's list holds both, from both cells.
	code, data = b.Do("eu-1", http.MethodGet, "/api/v2/reservations?role=requester", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	var ids []string
	for _, r := range brokertest.Decode[api.ReservationList](t, data).Items {
		ids = append(ids, r.ID)
	}
	sort.Strings(ids)
	assert.Equal(t, []string{"across", "home"}, ids)

	// One renewal renews the leases of both cells.
	code, data = b.Do("eu-1", http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: []string{"home", "across", "nope"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	renewed := brokertest.Decode[api.RenewResponse](t, data)
	assert.Len(t, renewed.Renewed, 2, "%s", data)
	require.Len(t, renewed.Refused, 1, "%s", data)
	assert.Equal(t, "nope", renewed.Refused[0].ID)
	assert.Equal(t, api.RenewNotFound, renewed.Refused[0].Reason)

	// Its providers, in either cell, find eu-1 renewing itself; us-1 never
	// renewed: quiet, a provider's renewal is needed for it.
	for _, provider := range []string{far.Provider, "eu-2"} {
		code, data = b.Do(provider, http.MethodPost, "/api/v2/renewals/quiet", api.QuietRequest{Requesters: []string{"eu-1", "us-1"}})
		require.Equal(t, http.StatusOK, code, "%s", data)
		assert.Equal(t, []string{"us-1"}, brokertest.Decode[api.QuietResponse](t, data).Quiet, "asked by %s", provider)
	}
	// eu-3 (in eu, never advertised) holds a lease in us alone: its renewal
	// reaches us only, where its provider finds it renewing.
	eu3 := reservationLease("only-across", "1", "1Gi", "1m")
	eu3.Cells = api.CellsAll
	onlyAcross := reserve("eu-3", eu3)
	require.Equal(t, "us", cellOf("eu-3", "only-across"))
	code, data = b.Do("eu-3", http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: []string{"only-across"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	require.Len(t, brokertest.Decode[api.RenewResponse](t, data).Renewed, 1, "%s", data)
	code, data = b.Do(onlyAcross.Provider, http.MethodPost, "/api/v2/renewals/quiet", api.QuietRequest{Requesters: []string{"eu-3"}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Empty(t, brokertest.Decode[api.QuietResponse](t, data).Quiet, "renewing in its provider's cell")
	code, data = b.Do("eu-3", http.MethodDelete, "/api/v2/reservations/only-across", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)

	// Every cluster of both cells, once each.
	code, data = b.Do("eu-1", http.MethodGet, "/api/v2/clusters", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	var clusters []string
	for _, c := range brokertest.Decode[api.ClusterList](t, data).Items {
		clusters = append(clusters, c.ClusterID)
	}
	assert.Equal(t, []string{"eu-1", "eu-2", "us-1", "us-2"}, clusters)

	require.NoError(t, b.Cells.CheckInvariant(ctx))
	for _, id := range []string{"home", "across"} {
		code, data = b.Do("eu-1", http.MethodDelete, "/api/v2/reservations/"+id, nil)
		require.Equal(t, http.StatusOK, code, "%s", data)
	}
	code, data = b.Do("us-1", http.MethodDelete, "/api/v2/reservations/home", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	require.NoError(t, b.Cells.CheckInvariant(ctx))

	// eu-2 moves to us: listed once, as it now advertises; us-1's next
	// reservation may land on it.
	b.Advertise("eu-2", "128", "512Gi", "", "0.001", map[string]string{"region": "us"})
	code, data = b.Do("us-1", http.MethodGet, "/api/v2/clusters", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	list := brokertest.Decode[api.ClusterList](t, data).Items
	require.Len(t, list, 4)
	assert.Equal(t, "us", list[1].Labels["region"])
	moved := reserve("us-1", reservation("after-move", "2", "4Gi"))
	assert.Equal(t, "eu-2", moved.Provider)
	assert.Equal(t, "us", cellOf("us-1", "after-move"))

	resp, err := http.Get(b.Health + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "every cell's primary answers and holds the scripts")
	require.NoError(t, b.Cells.CheckInvariant(ctx))
}

// TestCellsProcess: rb-broker as deployed, with --redis-cluster-addrs,
// --cells and --cell-label, places each member in the cell of its label,
// reserves in the requester's cell, and across cells when asked: only us
// has a provider of 20 cores.
func TestCellsProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds rb-broker")
	}
	ctx := context.Background()
	b := brokertest.StartCells(t, brokertest.Options{}, []string{"eu", "us"}, store.CellRule{Label: "region", Default: "eu"})
	proc := b.StartProcess(brokertest.BuildBroker(t, t.TempDir()), nil, "--cells=eu,us", "--cell-label=region")
	do := func(cn, method, path string, body any) (int, []byte) {
		t.Helper()
		data, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest(method, proc.URL+path, bytes.NewReader(data))
		require.NoError(t, err)
		resp, err := b.Client(cn).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, out
	}
	for id, region := range map[string]string{"eu-1": "eu", "eu-2": "eu", "us-1": "us"} {
		cores := map[string]string{"eu": "16", "us": "32"}[region]
		q := brokertest.Quantities(cores, "64Gi", "")
		code, data := do(id, http.MethodPut, "/api/v2/clusters/"+id+"/advertisement", api.Advertisement{
			ClusterName: id, Endpoint: "https://" + id + ".example:6443", Labels: map[string]string{"region": region},
			Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("0", "0", "")},
			Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.020"), Memory: brokertest.MustQ("0.004")}})
		require.Equal(t, http.StatusOK, code, "%s", data)
		_, err := b.Cells.Cell(region).Cluster(ctx, id)
		require.NoError(t, err, "%s advertised in cell %s", id, region)
	}

	code, data := do("eu-1", http.MethodPost, "/api/v2/reservations", reservation("home", "20", "4Gi"))
	require.Equal(t, http.StatusConflict, code, "eu has no 20 cores: %s", data)
	across := reservation("across", "20", "4Gi")
	across.Cells = api.CellsAll
	code, data = do("eu-1", http.MethodPost, "/api/v2/reservations", across)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	assert.Equal(t, "us-1", brokertest.Decode[api.Reservation](t, data).Provider)
	cell, err := b.Cells.Find(ctx, "eu-1", "across")
	require.NoError(t, err)
	assert.Equal(t, "us", cell)
	code, data = do("eu-1", http.MethodDelete, "/api/v2/reservations/across", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	require.NoError(t, b.Cells.CheckInvariant(ctx))
}
