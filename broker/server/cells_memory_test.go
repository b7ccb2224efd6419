package server_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestCellsRedisMemoryShown: split into cells over a Redis Cluster, /readyz
// and rb_broker_redis_memory_* read each cell's primary and show the
// fullest, the first to refuse writes, by name; not whichever node a
// cluster client's INFO happened to reach.
func TestCellsRedisMemoryShown(t *testing.T) {
	ctx := context.Background()
	b := brokertest.StartCells(t, brokertest.Options{}, []string{"eu", "us"}, store.CellRule{Label: "region", Default: "eu"})
	get := func(path string) string { return healthGet(t, b, path) }
	body := get("/readyz")
	assert.Contains(t, body, "no maxmemory (unlimited)")
	assert.Regexp(t, `\(the primary of cell (eu|us), the fullest of 2 cells\)`, body)

	// us's primary gets a maxmemory 64 MiB above what it holds: the fullest.
	addr, err := b.Cluster.PrimaryOf(store.CellPrefix("us"))
	require.NoError(t, err)
	us := redis.NewClient(b.Cluster.Users.AdminOptions(addr))
	defer us.Close()
	info, err := us.InfoMap(ctx, "memory").Result()
	require.NoError(t, err)
	used, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	require.NoError(t, err)
	maxmemory := used + 64<<20
	require.NoError(t, us.ConfigSet(ctx, "maxmemory", strconv.FormatInt(maxmemory, 10)).Err())
	t.Cleanup(func() { us.ConfigSet(ctx, "maxmemory", "0") })
	require.Eventually(t, func() bool { return strings.Contains(get("/readyz"), "of maxmemory") }, 10*time.Second, 100*time.Millisecond)
	assert.Contains(t, get("/readyz"), "(the primary of cell us, the fullest of 2 cells)")
	assert.Contains(t, get("/metrics"), "rb_broker_redis_maxmemory_bytes "+strconv.FormatFloat(float64(maxmemory), 'g', -1, 64),
		"the metrics are us's primary's")
}
