package redistest_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/redistest"
)

func TestRestartKeepsAppendOnlyData(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t, redistest.WithAppendOnly())
	c := s.Client()
	require.NoError(t, c.Set(ctx, "rb:{b}:k", "v", 0).Err())
	s.Restart()
	v, err := c.Get(ctx, "rb:{b}:k").Result()
	require.NoError(t, err, "the client reconnects to the restarted server")
	assert.Equal(t, "v", v)
}

func TestMissingBinaryExplainsHowToInstall(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	_, err := redistest.Binary()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "apt-get install -y redis-server")
}

// TestUsers: the default user is off, the broker's user is the one of
// manifests/redis (its keys only), the administrator may do anything.
func TestUsers(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t, redistest.AllowDenials())
	anon := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer anon.Close()
	assert.ErrorContains(t, anon.Ping(ctx).Err(), "NOAUTH")

	require.NoError(t, s.Client().Set(ctx, "rb:{b}:k", "v", 0).Err())
	assert.ErrorContains(t, s.Client().Set(ctx, "other", "v", 0).Err(), "NOPERM")
	require.NoError(t, s.AdminClient().Set(ctx, "other", "v", 0).Err())
	require.NoError(t, s.AdminClient().FlushAll(ctx).Err())

	data, err := os.ReadFile(s.Users.BrokerPasswordFile)
	require.NoError(t, err)
	assert.Equal(t, s.Users.BrokerPassword+"\n", string(data))
}
