package testbed

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRedisIsRedisServerByDefault(t *testing.T) {
	t.Setenv(RedisEnv, "")
	r, err := newRedis(filepath.Join(t.TempDir(), "redis"), filepath.Join(t.TempDir(), "redis.log"))
	if err != nil {
		t.Skip(err) // no redis-server here
	}
	assert.False(t, r.Embedded)
	assert.NotEmpty(t, r.Path, "the redis-server binary")
}

func TestEmbeddedRedis(t *testing.T) {
	ctx := context.Background()
	t.Setenv(RedisEnv, RedisEmbedded)
	logPath := filepath.Join(t.TempDir(), "redis.log")
	r, err := newRedis(filepath.Join(t.TempDir(), "redis"), logPath)
	require.NoError(t, err)
	require.True(t, r.Embedded)
	require.NoError(t, r.start(ctx))
	t.Cleanup(r.Close)
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, r.Addr)
	assert.Contains(t, r.Tail(5), "embedded in-process Redis (miniredis) on "+r.Addr)

	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c.Close()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())

	require.ErrorContains(t, r.Restart(ctx), "cannot be restarted")
	require.ErrorContains(t, r.Kill(), "cannot be killed")
	assert.Equal(t, "v", c.Get(ctx, "k").Val(), "still serving")
	// What Bed.Close does to it: nothing (its Process never ran).
	require.NoError(t, r.Process.Stop(time.Second))
	assert.Equal(t, "v", c.Get(ctx, "k").Val())

	require.NoError(t, r.Stop(time.Second))
	require.Error(t, c.Ping(ctx).Err(), "closed")
	r.Close() // idempotent
}
