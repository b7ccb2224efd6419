package redistest_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// TestCluster: three primaries share the slots, the broker's user reaches
// the keys of its cells on whichever primary holds them, and no other keys.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t, 3, []string{"eu", "us"})
	rdb := c.Client()
	for _, k := range []string{"rb:{b}:k", "rb:{eu}:k", "rb:{us}:k"} {
		require.NoError(t, rdb.Set(ctx, k, "v", 0).Err(), k)
		assert.Equal(t, "v", rdb.Get(ctx, k).Val(), k)
	}
	shards := 0
	require.NoError(t, rdb.ForEachShard(ctx, func(context.Context, *redis.Client) error { shards++; return nil }))
	assert.Equal(t, 3, shards)
	primaries := map[string]bool{}
	for _, k := range []string{"rb:{b}:k", "rb:{eu}:k", "rb:{us}:k"} {
		addr, err := c.PrimaryOf(k)
		require.NoError(t, err)
		primaries[addr] = true
	}
	assert.Len(t, primaries, 3, "b, eu and us hash to slots of three different primaries")
}
