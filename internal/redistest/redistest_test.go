package redistest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/redistest"
)

func TestRestartKeepsAppendOnlyData(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t, redistest.WithAppendOnly())
	c := s.Client()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	s.Restart()
	v, err := c.Get(ctx, "k").Result()
	require.NoError(t, err, "the client reconnects to the restarted server")
	assert.Equal(t, "v", v)
}

func TestMissingBinaryExplainsHowToInstall(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	_, err := redistest.Binary()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "apt-get install -y redis-server")
}
