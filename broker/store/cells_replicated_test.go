package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// TestCellsReplicated: with Config.Replicas on a Redis Cluster whose
// primaries have a replica each, a cell's decision is answered once the
// replica of that cell's primary holds it, and not before: with that replica
// frozen the cell answers ErrNotReplicated after the timeout while the other
// cells decide as usual; the same request once it is back gets the decision
// made the first time, now on the replica.
func TestCellsReplicated(t *testing.T) {
	ctx := context.Background()
	rc := redistest.StartClusterWithReplicas(t, 3, cellNames)
	// Long enough for a replica on a loaded machine; short beside the
	// client's 3 s read timeout.
	const timeout = 2 * time.Second
	cells, err := store.NewCells(rc.Client(), store.Config{Replicas: 1, ReplicaTimeout: timeout}, cellNames, store.CellRule{Label: "region"})
	require.NoError(t, err)
	require.NoError(t, cells.LoadScripts(ctx))

	replicaOf := map[string]*redistest.Server{} // cell -> the replica of its primary
	for _, n := range cellNames {
		addr, err := rc.PrimaryOf(store.CellPrefix(n))
		require.NoError(t, err)
		for i, p := range rc.Primaries {
			if p.Addr == addr {
				replicaOf[n] = rc.Replicas[i]
			}
		}
		require.NotNil(t, replicaOf[n], "cell %s: primary %s has a replica", n, addr)
		region := n
		if n == "b" {
			region = "elsewhere" // names no cell: the default cell
		}
		_, cell, err := cells.Advertise(ctx, n+"-0", regional(region, 16, 20_000))
		require.NoError(t, err)
		require.Equal(t, n, cell)
	}
	onReplica := func(cell, requester, id string) string {
		t.Helper()
		conn := replicaOf[cell].AdminClient().Conn()
		defer conn.Close()
		require.NoError(t, conn.ReadOnly(ctx).Err(), "a cluster replica serves reads after READONLY")
		phase, err := conn.HGet(ctx, cells.Cell(cell).Key("resv:", model.QualifiedID(requester, id)), "phase").Result()
		require.NoError(t, err, "reservation %s/%s on the replica of cell %s", requester, id, cell)
		return phase
	}

	for _, n := range cellNames {
		d, err := cells.Cell(n).Reserve(ctx, request("r1", "rome", 1000, 1, 0))
		require.NoError(t, err, "cell %s", n)
		assert.Equal(t, n+"-0", d.Reservation.Target)
		assert.Equal(t, model.PhaseReserved, onReplica(n, "rome", "r1"), "answered: on the replica")
	}

	replicaOf["eu"].Freeze()
	start := time.Now()
	_, err = cells.Cell("eu").Reserve(ctx, request("r2", "rome", 2000, 1, 0))
	require.Error(t, err)
	assert.True(t, errors.Is(err, store.ErrNotReplicated), "%v", err)
	assert.GreaterOrEqual(t, time.Since(start), timeout, "it waited for the replica")
	for _, n := range []string{"b", "us"} {
		_, err := cells.Cell(n).Reserve(ctx, request("r2", "rome", 2000, 1, 0))
		assert.NoError(t, err, "cell %s: its own replica acknowledges", n)
	}

	replicaOf["eu"].Thaw()
	d, err := cells.Cell("eu").Reserve(ctx, request("r2", "rome", 2000, 1, 0))
	require.NoError(t, err, "retried once the replica is back")
	assert.True(t, d.Replayed, "the decision of the first try")
	assert.Equal(t, "eu-0", d.Reservation.Target)
	assert.Equal(t, model.PhaseReserved, onReplica("eu", "rome", "r2"))

	// The cluster's own failover: eu's primary dies, its replica takes the
	// slots, the old primary comes back as the new one's replica. Meanwhile
	// eu refuses (nothing it could answer is replicated); then it decides
	// again, on the new primary, and nothing answered before is lost.
	oldPrimary := primaryServer(t, rc, store.CellPrefix("eu"))
	promoted := replicaOf["eu"]
	oldPrimary.Stop()
	waitRole(t, promoted, "master")
	_, err = cells.Cell("eu").Reserve(ctx, request("r3", "rome", 1000, 1, 0))
	require.Error(t, err, "no replica: not acknowledged")
	oldPrimary.Restart()
	waitRole(t, oldPrimary, "slave")
	require.Eventually(t, func() bool {
		_, err = cells.Cell("eu").Reserve(ctx, request("r3", "rome", 1000, 1, 0))
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "eu decides again after the failover: %v", err)
	replicaOf["eu"] = oldPrimary
	assert.Equal(t, model.PhaseReserved, onReplica("eu", "rome", "r3"))
	for _, id := range []string{"r1", "r2"} {
		r, err := cells.Cell("eu").Reservation(ctx, "rome", id)
		require.NoError(t, err, "answered before the failover: kept")
		assert.Equal(t, model.PhaseReserved, r.Phase)
	}
	for _, n := range cellNames {
		require.NoError(t, cells.Cell(n).CheckInvariant(ctx), "cell %s", n)
	}
}

// primaryServer is the server of rc whose slots hold key.
func primaryServer(t *testing.T, rc *redistest.Cluster, key string) *redistest.Server {
	t.Helper()
	addr, err := rc.PrimaryOf(key)
	require.NoError(t, err)
	for _, s := range append(append([]*redistest.Server{}, rc.Primaries...), rc.Replicas...) {
		if s.Addr == addr {
			return s
		}
	}
	t.Fatalf("no server of the cluster is at %s", addr)
	return nil
}

// waitRole waits until s says role:<role> (master or slave) and, as a
// replica, that its link to the primary is up.
func waitRole(t *testing.T, s *redistest.Server, role string) {
	t.Helper()
	a := s.AdminClient()
	require.Eventually(t, func() bool {
		info, err := a.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "role:"+role) &&
			(role == "master" || strings.Contains(info, "master_link_status:up"))
	}, 30*time.Second, 50*time.Millisecond, "%s: role %s", s.Addr, role)
}
