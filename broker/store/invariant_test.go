package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
