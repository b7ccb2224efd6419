package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestCellsLimitsFederationWide: a requester's limits hold over the whole
// federation, not per cell: what it holds in the other cells counts
// against them wherever it reserves (in a cell, across cells, as a gang),
// the refusal states the federation's figures, and the usage is the sum.
func TestCellsLimitsFederationWide(t *testing.T) {
	ctx := context.Background()
	p, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n" +
		`requesters: {default: {maxReservations: 2, maxResources: {cpu: "4"}}}` + "\n"))
	require.NoError(t, err)
	cells, _ := startCells(t, store.Config{Policy: p})
	for _, n := range cellNames {
		region := n
		if n == "b" {
			region = "elsewhere"
		}
		_, cell, err := cells.Advertise(ctx, n+"-0", regional(region, 16, 20_000))
		require.NoError(t, err)
		require.Equal(t, n, cell)
	}
	refusal := func(err error) *store.LimitError {
		t.Helper()
		var le *store.LimitError
		require.True(t, errors.As(err, &le), "a limit refuses it: %v", err)
		return le
	}

	_, err = cells.Reserve(ctx, "eu", request("r1", "rome", 3000, 1, 0))
	require.NoError(t, err)
	_, err = cells.Reserve(ctx, "us", request("r2", "rome", 2000, 1, 0))
	le := refusal(err)
	assert.Equal(t, store.LimitError{Requester: "rome", Limit: "cpu", Max: 4000, Used: 3000, Asked: 2000, RetryAfter: le.RetryAfter}, *le,
		"3 cores held in eu count in us")
	assert.Contains(t, err.Error(), "holds 3, asks 2 more, limit 4")

	_, err = cells.Reserve(ctx, "us", request("r2", "rome", 1000, 1, 0))
	require.NoError(t, err, "4 cores in all: within")
	_, err = cells.ReserveAcross(ctx, "b", request("r3", "rome", 100, 1, 0))
	le = refusal(err)
	assert.Equal(t, "reservations", le.Limit)
	assert.Equal(t, float64(2), le.Max)
	assert.Equal(t, int64(2), le.Used, "one in eu, one in us")
	_, err = cells.ReserveGroup(ctx, "b", model.GroupRequest{Group: "g", Requester: "rome", MinMember: 1, Duration: time.Hour,
		Members: []model.GroupMember{{ID: "g-0", Resources: model.Resources{CPU: 100, Memory: 1 << 30}}}})
	assert.True(t, errors.As(err, new(*store.LimitError)), "a gang too: %v", err)

	usage, err := cells.MemberUsages(ctx)
	require.NoError(t, err)
	for _, m := range usage {
		if m.Cluster == "rome" {
			assert.Equal(t, int64(2), m.Usage.Reservations)
			assert.Equal(t, int64(4000), m.Usage.Resources.CPU)
		}
	}

	_, err = cells.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	d, err := cells.ReserveAcross(ctx, "b", request("r3", "rome", 100, 1, 0))
	require.NoError(t, err, "room again once eu's is released")
	assert.NotEmpty(t, d.Cell)
	require.NoError(t, cells.CheckInvariant(ctx))
}
