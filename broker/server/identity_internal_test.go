package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIdentityCacheChecksOnceAndNeverCachesInvalidNames(t *testing.T) {
	var c identityCache
	require.NoError(t, c.check("rome"))
	require.NoError(t, c.check("rome"))
	assert.Equal(t, int64(1), c.n.Load())

	for range 2 {
		err := c.check("Rome_1")
		require.Error(t, err)
		assert.Contains(t, err.Error(), `cluster id "Rome_1"`)
	}
	assert.Equal(t, int64(1), c.n.Load())

	c.n.Store(maxIdentities) // full: still checked, no longer remembered
	require.NoError(t, c.check("paris"))
	_, cached := c.valid.Load("paris")
	assert.False(t, cached)
	assert.Error(t, c.check("-paris"))
}
