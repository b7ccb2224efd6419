package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

func TestCheckInvariantDetectsDrift(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	require.NoError(t, s.CheckInvariant(ctx))

	require.NoError(t, rdb.HIncrBy(ctx, s.Key("cluster:", "paris"), "resv_cpu", 1).Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "reserved counter")
	require.NoError(t, rdb.HSet(ctx, s.Key("cluster:", "paris"), "resv_cpu", 1000, "used_cpu", 7500).Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "overbooked")
}

// TestAdvertisementShortOfReserved: an advertisement that shrinks below what
// is reserved (a node gone NotReady while reservations hold it) leaves the
// cluster's free negative; that is the provider's doing, marked short with
// the amount then reserved, and the invariant holds. A reservation that grew
// the reserved amount past that mark would be the broker's: the invariant
// reports it. The mark goes once the offer covers what is reserved.
func TestAdvertisementShortOfReserved(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	rdb := s.Client()
	_, err := s.Advertise(ctx, "paris", cluster(8, 16, 0, 1, nil))
	require.NoError(t, err)
	for _, id := range []string{"r1", "r2", "r3"} {
		_, err = s.Reserve(ctx, request(id, "rome", 250, 3, 0))
		require.NoError(t, err)
	}

	// Half of paris goes: 8 GiB offered, 9 GiB reserved.
	_, err = s.Advertise(ctx, "paris", cluster(4, 8, 0, 1, nil))
	require.NoError(t, err)
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	require.Equal(t, -1*gi, c.Free().Memory)
	require.Equal(t, model.Resources{Memory: 9 * gi}, c.Short, "memory short, with what was reserved then; cpu is not")
	require.NoError(t, s.CheckInvariant(ctx), "the provider's doing, not the broker's")
	_, err = s.Reserve(ctx, request("r4", "rome", 250, 1, 0))
	require.ErrorAs(t, err, new(*store.NoFitError), "nothing more is taken from a short resource")

	// The same advertisement again (a heartbeat) and a smaller one keep it.
	_, err = s.Advertise(ctx, "paris", cluster(4, 8, 0, 1, nil))
	require.NoError(t, err)
	_, err = s.Advertise(ctx, "paris", cluster(4, 7, 0, 1, nil))
	require.NoError(t, err)
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	require.Equal(t, 9*gi, c.Short.Memory)
	require.NoError(t, s.CheckInvariant(ctx))

	// A reservation that grew the reserved amount past the mark is the broker's.
	require.NoError(t, rdb.HIncrBy(ctx, s.Key("cluster:", "paris"), "resv_mem", gi).Err())
	require.ErrorContains(t, s.CheckInvariant(ctx), "overbooked")
	require.NoError(t, rdb.HIncrBy(ctx, s.Key("cluster:", "paris"), "resv_mem", -gi).Err())

	// A release leaves the mark to the next advertisement, which clears it
	// once the offer covers what is reserved.
	_, err = s.Release(ctx, "rome", "r3", "rome")
	require.NoError(t, err)
	require.NoError(t, s.CheckInvariant(ctx))
	_, err = s.Advertise(ctx, "paris", cluster(4, 8, 0, 1, nil))
	require.NoError(t, err)
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	require.Equal(t, model.Resources{}, c.Short)
	require.NoError(t, s.CheckInvariant(ctx))

	// An advertisement that does not lower the offer marks nothing: free
	// driven negative otherwise stays the broker's fault.
	require.NoError(t, rdb.HIncrBy(ctx, s.Key("cluster:", "paris"), "resv_mem", 4*gi).Err())
	_, err = s.Advertise(ctx, "paris", cluster(4, 8, 0, 1, nil))
	require.NoError(t, err)
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	require.Equal(t, model.Resources{}, c.Short)
	require.ErrorContains(t, s.CheckInvariant(ctx), "overbooked")
}
