package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestForget: a member leaving (rbctl leave) is refused while live
// reservations name it, as provider or requester; then everything of it
// goes but its event stream (which has a TTL), the index stays consistent,
// and advertising again makes it a candidate again.
func TestForget(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 4000, 0), node("p2", 2000, 2000, 0)))
	_, err := s.Advertise(ctx, "rome", cluster(1, 4, 0, 30_000, map[string]string{"region": "eu-south"}))
	require.NoError(t, err)
	d, err := s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	require.Equal(t, "paris", d.Reservation.Target)

	var busy *store.BusyError
	require.ErrorAs(t, s.Forget(ctx, "paris"), &busy)
	assert.Equal(t, int64(1), busy.AsProvider)
	assert.ErrorIs(t, busy, store.ErrConflict)
	require.ErrorAs(t, s.Forget(ctx, "rome"), &busy)
	assert.Equal(t, "cluster rome still has live reservations (1 as requester, 0 as provider): they must end first (released, or expired)", busy.Error())

	_, err = s.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	require.NoError(t, s.Forget(ctx, "paris"))
	require.NoError(t, s.Forget(ctx, "rome"))
	_, err = s.Cluster(ctx, "paris")
	assert.ErrorIs(t, err, store.ErrNotFound)
	assert.ErrorIs(t, s.Forget(ctx, "paris"), store.ErrNotFound, "nothing left to forget")
	for _, k := range allKeys(t, s) {
		if strings.Contains(k, "paris") || strings.Contains(k, "rome") || strings.Contains(k, "eu-south") {
			assert.True(t, strings.HasPrefix(k, s.Key("events:")) || strings.HasPrefix(k, s.Key("resv:")) || strings.HasPrefix(k, s.Key("ended:")),
				"%s left behind (only event streams and ended reservations with their requester's set, all with a TTL)", k)
		}
	}
	require.NoError(t, s.CheckIndex(ctx))
	assertInvariant(t, s)

	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 4000, 0)))
	d, err = s.Reserve(ctx, request("r2", "milan", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target, "a candidate again")
	assertInvariant(t, s)
}
