package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// advertiseNodes advertises paris through the v2 API with three nodes of
// 1 free CPU each (2 allocatable, 1 allocated).
func advertiseNodes(t *testing.T, b *brokertest.Broker) api.Cluster {
	t.Helper()
	body := api.Advertisement{Resources: api.ClusterResources{
		Capacity: brokertest.Quantities("6", "24Gi", ""), Allocatable: brokertest.Quantities("6", "24Gi", ""),
		Allocated: brokertest.Quantities("3", "3Gi", ""),
	}, Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.03")}}
	for i := range 3 {
		body.Resources.Nodes = append(body.Resources.Nodes, api.NodeResources{
			Name:        fmt.Sprintf("paris-%d", i),
			Allocatable: brokertest.Quantities("2", "8Gi", ""), Allocated: brokertest.Quantities("1", "1Gi", ""),
		})
	}
	code, data := b.Do("paris", http.MethodPut, "/api/v2/clusters/paris/advertisement", body)
	require.Equal(t, http.StatusOK, code, "%s", data)
	return brokertest.Decode[api.Cluster](t, data)
}

// TestNodeFitThroughTheAPI: nodes advertised over v2 are shown back with
// the broker's view; a 3-CPU request that no node holds gets 409 with
// insufficient_node_fit, three 1-CPU requests land one per node and name
// it, and the cluster's view shows each node's debit.
func TestNodeFitThroughTheAPI(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	ack := advertiseNodes(t, b)
	require.Len(t, ack.Resources.Nodes, 3)
	assert.Equal(t, "1", ack.Resources.Nodes[0].Available.CPU.String())

	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("big", "3", "1Gi"))
	require.Equal(t, http.StatusConflict, code, "%s", data)
	e := brokertest.Decode[api.Error](t, data)
	assert.Equal(t, int64(1), e.Rejected["insufficient_node_fit"])
	assert.Contains(t, e.Error, "insufficient_node_fit=1")

	var nodes []string
	for i := range 3 {
		code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation(fmt.Sprintf("r%d", i), "1", "1Gi"))
		require.Equal(t, http.StatusCreated, code, "%s", data)
		r := brokertest.Decode[api.Reservation](t, data)
		nodes = append(nodes, r.Node)
	}
	sort.Strings(nodes)
	assert.Equal(t, []string{"paris-0", "paris-1", "paris-2"}, nodes)

	code, data = b.Do("rome", http.MethodGet, "/api/v2/clusters/paris", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	c := brokertest.Decode[api.Cluster](t, data)
	require.Len(t, c.Resources.Nodes, 3)
	for _, n := range c.Resources.Nodes {
		assert.Equal(t, "1", n.Reserved.CPU.String(), n.Name)
		assert.Equal(t, "0", n.Available.CPU.String(), n.Name)
	}
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}

// TestV1AdvertisementHasNoNodes: a seed agent's v1 advertisement carries
// no nodes: the cluster is judged on its totals, as before (a request its
// totals hold is granted, on no node), even after a v2 agent advertised
// nodes for it.
func TestV1AdvertisementHasNoNodes(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	advertiseNodes(t, b)
	v1 := `{"clusterID":"paris","clusterName":"paris","resources":{"capacity":{"cpu":"6","memory":"24Gi"},` +
		`"allocatable":{"cpu":"6","memory":"24Gi"},"allocated":{"cpu":"3","memory":"3Gi"},"available":{"cpu":"3","memory":"21Gi"}},` +
		`"timestamp":"2026-11-22T10:00:00Z"}`
	code, data := b.Do("paris", http.MethodPost, "/api/v1/advertisements", v1)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.NotContains(t, string(data), "nodes")

	code, data = b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"3","memory":"1Gi"}}`)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	assert.NotContains(t, string(data), "node", "the v1 reservation is unchanged")
	c, err := b.Store.Cluster(context.Background(), "paris")
	require.NoError(t, err)
	assert.Empty(t, c.Nodes)
	assert.Equal(t, int64(3000), c.Reserved.CPU)
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}
