package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/scripts"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

func TestAdvertiseCannotSetBrokerOwnedFields(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1, nil))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	before, err := rdb.HGetAll(ctx, s.Key("cluster:", "paris")).Result()
	require.NoError(t, err)

	// Call the script directly, as a buggy or hostile caller would.
	err = scripts.Advertise.Run(ctx, rdb, []string{store.DefaultPrefix}, "paris", 100, 60_000, "digest", 0, 0, "alloc_cpu", "1", "resv_cpu", "0").Err()
	require.ErrorContains(t, err, "unknown field resv_cpu")
	after, err := rdb.HGetAll(ctx, s.Key("cluster:", "paris")).Result()
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing written")
}
